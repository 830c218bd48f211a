"""`planet devnet up --detach` once for the module, driven only through the CLI and RPC.

Real processes throughout: anvil, 4 CometBFT validators with their ABCI apps and stake
watchers, 3 compute nodes staked and joined by `planet stake` / `planet join`, each with its
agent. Checks: everything is alive and listed; a node that leaves drops out of the routable
set; an unstaked node stops being routable; a node whose stake was never attested is never
routable. `planet devnet down` at the end stops every process (and is idempotent).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.server.launcher import pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UP_TIMEOUT_S = 900


def _planet(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _query(rpc: str, path: str, **params: str) -> Any:
    full = path + ("?" + urllib.parse.urlencode(params) if params else "")
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(full))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    import base64

    if response.get("code", 0):
        return None
    return json.loads(base64.b64decode(response["value"]))


def _wait(condition: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    from node.model.source import models_dir

    home = tmp_path_factory.mktemp("planet-devnet")
    real_models = models_dir()
    real_models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(real_models, target_is_directory=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_")}
    return {**clean, "PLANET_HOME": str(home), "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def devnet(env: dict[str, str]) -> Iterator[dict[str, Any]]:
    up = _planet(env, "devnet", "up", "--detach", timeout=UP_TIMEOUT_S)
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        assert "Traceback" not in up.stderr
        state = json.loads((Path(env["PLANET_HOME"]) / "devnet" / "devnet.json").read_text())
        gateway = 1 if state.get("gateway_url") else 0
        # anvil (+ gateway), app + cometbft + watcher per validator, node + agent per operator
        assert len(_pids_alive(state)) == 1 + gateway + 3 * 4 + 2 * 3
        yield state
    finally:
        state_path = Path(env["PLANET_HOME"]) / "devnet" / "devnet.json"
        before = _pids_alive(json.loads(state_path.read_text())) if state_path.is_file() else []
        down = _planet(env, "devnet", "down", timeout=180)
        assert down.returncode == 0, down.stderr
        survivors = [p for p in before if pid_alive(p)]
        assert not survivors, f"processes {survivors} outlived `planet devnet down`"
        again = _planet(env, "devnet", "down", timeout=60)
        assert again.returncode == 0 and "no devnet was running" in again.stdout


def _pids_alive(state: dict[str, Any]) -> list[int]:
    """Every pid the devnet recorded that still runs (anvil, gateway, validators, nodes)."""
    pids = [p for p in state.get("pids", {}).values() if p]
    run = Path(state["committee_dir"]) / "run"
    pids += [int(p.read_text()) for p in run.glob("*.pid")] if run.is_dir() else []
    for home in state.get("operators", []):
        joined = Path(home) / "run" / "joined.json"
        if joined.is_file():
            record = json.loads(joined.read_text())
            pids += [record["node_pid"], record["agent_pid"]]
    return [p for p in pids if pid_alive(p)]


def _status(env: dict[str, str]) -> dict[str, Any]:
    done = _planet(env, "devnet", "status", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _view(devnet: dict[str, Any], key: str) -> dict[str, Any] | None:
    return _query(devnet["committee_rpc"][0], "/node", key=key)


def test_devnet_status_lists_validators_routable_nodes_pool_and_contracts(env, devnet) -> None:
    status = _status(env)
    assert status["status"] == "up" and status["running"]
    assert status["processes"]["anvil"]
    validators = status["validators"]
    assert len(validators) == 4
    for row in validators:
        assert row["app_alive"] and row["cometbft_alive"] and row["watcher_alive"], row
        assert row["height"] and row["height"] > 0
    routable = [n for n in status["nodes"] if n["routable"]]
    assert len(routable) == 3
    assert sorted(s for n in routable for s in n["shards"]) == [0, 1, 2]
    assert all(n["stake"] == str(10**18) and n["status"] == "SERVING" for n in routable)
    assert status["pool"]["status"] in ("healthy", "degraded")
    assert status["pool"]["routable_per_shard"] == [1, 1, 1]
    for name in ("Committee", "Staking", "FraudProofs", "QueryEscrow", "ModelRegistry"):
        assert status["contracts"][name].startswith("0x")
    for local in status["local_nodes"]:
        assert local["node_alive"] and local["agent_alive"]
    assert [a["name"] for a in status["accounts"]] == ["node0", "node1", "node2", "user"]
    for account in status["accounts"]:
        assert Path(account["keystore"]).is_file()


def test_devnet_committee_contract_has_the_genesis_operators(env, devnet) -> None:
    params = _query(devnet["committee_rpc"][0], "/params")
    operators = sorted(v["operator"].lower() for v in params["validators"])
    from web3 import Web3

    deployment = json.loads(Path(devnet["deployment"]).read_text())
    committee = deployment["contracts"]["Committee"]
    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"]))
    contract = w3.eth.contract(address=committee["address"], abi=committee["abi"])
    members = sorted(m.lower() for m in contract.functions.members().call())
    assert members == operators
    assert params["genesis"]["evm"]["committee_address"].lower() == committee["address"].lower()


def test_devnet_node_without_attested_stake_is_never_routable(env, devnet) -> None:
    """A fresh wallet with no stake registers a node key through a real agent process: the
    committee lists it SERVING, the watchers attest 0, and it never becomes routable."""
    from node.keys import create_node_key, create_wallet

    home = Path(env["PLANET_HOME"]) / "unstaked"
    create_wallet(home / "wallet.json", "pw")
    node_key = create_node_key(home / "node_key.json", "pw").verify_key.encode().hex()
    endpoint = json.loads((Path(devnet["operators"][0]) / "run" / "joined.json").read_text())[
        "endpoint"
    ]
    log_path = home / "agent.log"
    with open(log_path, "wb") as log_file:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "node.agent", "--home", str(home),
                "--manifest", devnet["manifest"], "--shard", "0", "--endpoint", endpoint,
                "--committee-rpc", devnet["committee_rpc"][1],
            ],
            env={**env, "PLANET_PASSWORD": "pw"},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        seen = []

        def serving_and_attested() -> bool:
            view = _view(devnet, node_key)
            if view is not None:
                seen.append(view)
            return bool(view and view["status"] == "SERVING" and view["stake_attestations"] >= 3)

        _wait(serving_and_attested, 60, f"the unstaked node to be SERVING ({log_path})")
        time.sleep(2)
        seen.append(_view(devnet, node_key))
        assert all(not v["routable"] for v in seen)
        assert seen[-1]["stake"] == "0"
        listed = _query(devnet["committee_rpc"][0], "/nodes", model=devnet["model_hash"])
        assert node_key not in {n["key"] for n in listed["nodes"] if n["routable"]}
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0, log_path.read_text()[-2000:]
    assert _view(devnet, node_key)["status"] == "LEFT"  # clean shutdown sent `leave`


def test_devnet_node_that_leaves_drops_out_of_the_routable_set(env, devnet) -> None:
    home = devnet["operators"][2]
    joined = json.loads((Path(home) / "run" / "joined.json").read_text())
    key = joined["node_key"]
    assert _view(devnet, key)["routable"]
    done = _planet(
        env, "leave", "--home", home, "--password-file", devnet["password_file"], timeout=90
    )
    assert done.returncode == 0, done.stderr
    assert "chain status LEFT" in done.stdout
    view = _view(devnet, key)
    assert view["status"] == "LEFT" and not view["routable"]
    listed = _query(devnet["committee_rpc"][0], "/nodes", model=devnet["model_hash"])
    assert key not in {n["key"] for n in listed["nodes"] if n["routable"]}
    pool = _query(devnet["committee_rpc"][0], "/pool_health", model=devnet["model_hash"])
    assert pool["status"] == "incomplete" and pool["routable_per_shard"][2] == 0
    assert not pid_alive(joined["agent_pid"]) and not pid_alive(joined["node_pid"])


def test_devnet_unstake_makes_the_node_unroutable(env, devnet) -> None:
    home = devnet["operators"][1]
    key = json.loads((Path(home) / "run" / "joined.json").read_text())["node_key"]
    done = _planet(
        env, "unstake", "--home", home, "--password-file", devnet["password_file"], timeout=90
    )
    assert done.returncode == 0, done.stderr
    view = _wait(
        lambda: (v := _view(devnet, key)) and v["stake"] == "0" and v,
        60,
        "the watchers to attest 0 after unstake",
    )
    assert view["status"] == "SERVING" and not view["routable"]
    status = _planet(env, "status", "--json", "--home", home, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["stake"]["status"] == "unbonding"
    assert report["committee"]["routable"] is False


def test_devnet_up_twice_refuses_and_down_is_idempotent(env, devnet) -> None:
    again = _planet(env, "devnet", "up", "--detach", timeout=60)
    assert again.returncode == 2
    assert "error: a devnet already runs" in again.stderr and "hint:" in again.stderr
    assert "Traceback" not in again.stderr
