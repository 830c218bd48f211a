"""Verification on the devnet, with a verifier per validator and cheating nodes, driven only
through the CLI, HTTP and RPC (one `planet devnet up` for the module).

    planet devnet up --detach --replicas 1 --cheat-node substitute-skip:2 --cheat-node silent \
        --cheat-node noise:0.1:4:withhold --verifier-challenges 1

Real processes throughout: anvil with the contracts, 4 CometBFT validators with their apps and
stake watchers (which relay confirmed verdicts to FraudProofs), `planet verifier serve` on all 4
validators (one echo challenge and one sampled check an epoch each), the gateway, 3 honest
int8 nodes (one per shard) joined with `planet join`, and 3 nodes joined by the test entry
point tests/doubles/cheating_join.py: S (shard 0) a substitute
that skips every other layer, Q (shard 1) honest but its agent commits nothing (silent), N
(shard 2) adding 10 % noise to every 4th position and handing each spot-check ticket only to
the verifier the check is assigned to (it withholds it from the other three).

What the module shows, each from the chain's own answers:
- S and N are untrusted (R < 0.4) and unroutable within 5 epochs of the first epoch the
  verifiers checked (challenge or spot check), through verdicts confirmed by ≥ 2/3 of the
  power (a spot check one verifier failed, re-judged by the others from the node's own ticket
  the finder forwarded them, since N refuses them theirs) and relayed by the watchers: their
  stake on the EVM chain is slashed;
- every spot check of N's blocks failed (the detection table: noise on every 4th position fails
  24 of 24 blocks), and every check of an honest node passed;
- Q is flagged `uncommitted`, unroutable, and earns nothing; the honest nodes' reputation rises
  above its initial 0.5 and they stay routable; no verifier is ever marked for a false
  accusation (honest verifiers never split);
- `planet devnet status`, `planet status` and the dApp's `/v1/network` show all of it;
- credits (the stake watchers form each key period's committee key by DKG): `planet credits
  buy` is funded by the 4 watchers only against the user's balance at the escrow — covered
  once, refused by name (nothing charged) when the same balance is asked to pay again;
- last, a network of charging nodes only (3 new operators join with `--credit-positions`, the
  honest free nodes leave): the user's own client (`planet gateway serve --personal`) answers
  the official `openai` client, paying the nodes with credits; the nodes redeem every one, the
  purchase is debited once into the escrow's credit pool, which pays the redeeming nodes; no
  tx since and no state entry links the payer to those nodes or holds a question; and
  validator 0's verifier, restarted with `--personal-client` (its operator's own client, paying
  with credits its operator bought from a wallet of its own), challenges those charging nodes
  and scores them fully. From the honest nodes' leave on, the other three verifiers, restarted,
  spot-check only (nothing after reads their challenges). The nodes `planet join` started here
  are stopped by the last test, while the committee runs: none outlives the module.

Its own devnet, not the shared one (tests/e2e/conftest.py): cheating nodes, a verifier per
validator that slashes them, and at the end the honest nodes leave — the shared devnet runs
no verifiers and its genesis nodes serve every other module. Its epochs are the devnet's
default (the `devnet` fixture says why not shorter); what is independent runs side by side
(the credits test's purchases, validator 0's operator's and the charging operators' funding and
stakes, beside the wait for the convictions; the charging operators' joins, from the end of the
first test on; the honest nodes' leave — 6 epochs, the module's longest wait — from the moment
the charging operators have their shards, the verdicts', slashes' and marks' checks after it;
the user's purchase, and validator 0's verifier restarting through its personal client, beside
the personal-client test's waits for redemptions and statements; the charging nodes' stop beside
the wait for the leaves; the `planet status` reads, the block reads).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.committee_reads import nodes_of
from harness.personal_client import personal_client
from harness.ports import ephemeral_port
from node.client.credit_wallet import CreditWallet
from node.procs import run_captured
from node.server.launcher import pid_alive
from node.zygote import ENV_VAR as ZYGOTE
from protocol.paid_credits import parse_paid_credit, spent_id
from tests.e2e.devnet_session import planet as _planet
from tests.e2e.escrow_reads import escrow_contract

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UP_TIMEOUT_S = 900
UNTRUSTED_BELOW = 400_000
CHEATS = ("substitute-skip:2", "silent", "noise:0.1:4:withhold")  # nodes 3, 4, 5: shards 0, 1, 2
COOLDOWN_S = 3  # the gateway's time out for a node that failed a question (see `devnet`)
VERIFIER_CHALLENGES = 1  # each verifier's echo challenges per epoch (see `devnet`)


def _query(rpc: str, path: str) -> Any:
    url = f"{rpc}/abci_query?path=" + urllib.parse.quote(json.dumps(path))
    with urllib.request.urlopen(url, timeout=10) as answer:
        response = json.load(answer)["result"]["response"]
    assert response.get("code", 0) == 0, response
    return json.loads(base64.b64decode(response["value"]))


def _wait(condition: Any, timeout_s: float, what: str, every_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from node.model.source import models_dir

    home = tmp_path_factory.mktemp("planet-verification")
    real_models = models_dir()
    real_models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(real_models, target_is_directory=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_") or k == ZYGOTE}
    return {**clean, "PLANET_HOME": str(home), "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def devnet(env: dict[str, str]) -> Iterator[dict[str, Any]]:
    # The devnet's default epochs (20 blocks, ~10-13 s on the shared box), not the shared
    # devnet's 10: what this module asserts is counted in epochs (the cheaters untrusted within
    # 5 epochs of the first check, accusations settled SETTLE_EPOCHS = 3 after their vote),
    # what delays it in seconds (a challenge ~7 s on a busy box; the gateway's 30 s cooldown of
    # a node that failed a frame, which with one node per shard leaves a shard unserved; ticket
    # fetches). Measured 2026-12-05 on the default: the noisy node convicted 3 epochs after the
    # first check, ~55 s, most of it such a cooldown — ~9 epochs of 10 blocks. So the gateway
    # here leaves a failed node out COOLDOWN_S seconds, not its default 30 (issue 41: the
    # module's devnet runs, and burns CPU, for as long as its convictions take).
    cheats = [arg for mode in CHEATS for arg in ("--cheat-node", mode)]
    cooldown = ("--gateway-node-cooldown-s", str(COOLDOWN_S))
    # one echo challenge per verifier and epoch (and its sampled check), not the verifier's 4:
    # four verifiers asking four each kept the box's 2 cores busy back to back (a challenge
    # finishing late counts in the next epoch), while one a verifier already scores a circuit
    # per epoch each — what the reputations, the substitute's conviction and the honest rise
    # need (issue 41: measured 2026-12-05, the verifiers, nodes and gateway answering them
    # were ~60 % of the module's CPU)
    challenges = ("--verifier-challenges", str(VERIFIER_CHALLENGES))
    # one model: this module's checks are over the routable nodes of one model (the charging
    # nodes alone routable, what names them on the chain); the shared devnet runs the second
    # model (tests/e2e/test_second_model_devnet.py), and a seat costs this devnet its start-up
    up = _planet(
        env, "devnet", "up", "--detach", "--replicas", "1", "--one-model", *cheats, *cooldown,
        *challenges,
        timeout=UP_TIMEOUT_S,
    )  # fmt: skip
    state_path = Path(env["PLANET_HOME"]) / "devnet" / "devnet.json"
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        state = json.loads(state_path.read_text())
        assert len(state["pids"]["verifiers"]) == 4  # one per validator by default
        assert len(state["pids"]["cheat_nodes"]) == len(CHEATS)
        yield state
    finally:
        down = _planet(env, "devnet", "down", timeout=180)
        assert down.returncode == 0, down.stderr
        if state_path.is_file():
            state = json.loads(state_path.read_text())
            left = [p for p in state["pids"].get("cheat_nodes", []) if pid_alive(p)]
            left += [p for p in state["pids"].get("verifiers", []) if pid_alive(p)]
            assert not left, f"processes {left} outlived `planet devnet down`"


def _operators(devnet: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{node0 … node5: {home, key, address}} from the operator homes and devnet.json."""
    addresses = {a["name"]: a["address"] for a in devnet["accounts"]}
    out = {}
    for home in devnet["operators"]:
        joined = json.loads((Path(home) / "run" / "joined.json").read_text())
        name = Path(home).name
        out[name] = {"home": home, "key": joined["node_key"], "address": addresses[name]}
    return out


def _operator_accounts(devnet: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{node0 … node5: {home, address}} from devnet.json alone (an operator that left has no
    joined.json)."""
    addresses = {a["name"]: a["address"] for a in devnet["accounts"]}
    return {
        Path(h).name: {"home": h, "address": addresses[Path(h).name]} for h in devnet["operators"]
    }


def _nodes(devnet: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """Node views by operator home name (None: no longer registered — a slashed node's
    registration expires once its stake is attested below the minimum)."""
    rpc = devnet["committee_rpc"][0]
    by_key = {n["key"]: n for n in nodes_of(lambda path: _query(rpc, path))}
    return {name: by_key.get(op["key"]) for name, op in _operators(devnet).items()}


def _evm_stake(env: dict[str, str], home: str) -> int:
    done = _planet(env, "status", "--home", home, "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["stake"]["amount_wei"])


def _staking_contract(devnet: dict[str, Any]) -> Any:
    """The devnet's Staking contract over the EVM RPC: polled while a slash is awaited (a read
    per poll, where `planet status` would start a process per poll)."""
    from web3 import Web3

    staking = json.loads(Path(devnet["deployment"]).read_text())["contracts"]["Staking"]
    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"]))
    return w3.eth.contract(address=staking["address"], abi=staking["abi"])


def _verifier_logs(devnet: dict[str, Any]) -> str:
    logs = Path(devnet["dir"]) / "logs"
    return "".join(p.read_text() for p in sorted(logs.glob("verifier*.log")))


def _alive(devnet: dict[str, Any]) -> None:
    dead = [p for p in devnet["pids"]["verifiers"] if not pid_alive(p)]
    assert not dead, f"verifiers {dead} exited:\n{_verifier_logs(devnet)[-3000:]}"


def _first_checked_epoch(devnet: dict[str, Any]) -> int:
    """The first epoch the verifiers challenged or spot-checked in (the cheaters served then):
    spot checks alone may convict a cheater before any challenge line is logged."""
    logs = _verifier_logs(devnet)
    epochs = [int(e) for e in re.findall(r"(?:challenge|spot check|sampled) epoch=(\d+)", logs)]
    assert epochs, f"no check logged yet:\n{logs[-3000:]}"
    return min(epochs)


def test_cheaters_untrusted_within_5_epochs_honest_rise(
    devnet, small_balance_purchases, personal_verifier, charging_operators
) -> None:
    """The substitute and the noisy node untrusted and unroutable within 5 epochs of the first
    check, the honest nodes routable throughout, their reputation up from 0.5, never accused.
    (Their verdicts and slashes: `test_cheaters_verdicts_confirmed_and_stakes_slashed`, after
    the personal-client test, so that the honest nodes' leave starts without waiting for the
    relays. `small_balance_purchases`, `personal_verifier` and `charging_operators` start
    here: the credit purchases of two later tests and the charging operators' stakes run in
    the background while this one waits for the convictions; the charging nodes join once the
    cheaters are convicted and the honest nodes have risen.)"""
    rpc = devnet["committee_rpc"][0]
    honest, cheaters = ("node0", "node1", "node2"), ("node3", "node5")
    operators = _operators(devnet)
    untrusted_at: dict[str, int] = {}
    seen_unroutable_honest: list[str] = []

    epoch_length = int(_query(rpc, "/params")["genesis"]["epoch_length"])

    def confirmed_epoch(name: str) -> int | None:
        """The epoch of the first confirmed verdict against `name` (a convicted node is
        untrusted from then on, and its registration may expire before the next poll)."""
        address = operators[name]["address"].lower()
        heights = [
            v["confirmed_height"]
            for v in _query(rpc, "/verdicts?confirmed=true")["verdicts"]
            if v["node"].lower() == address and v["confirmed_height"] is not None
        ]
        return min(heights) // epoch_length if heights else None

    def convicted() -> bool:
        _alive(devnet)
        nodes = _nodes(devnet)
        epoch = _query(rpc, "/epochs")["current"]
        seen_unroutable_honest.extend(h for h in honest if not (nodes[h] or {}).get("routable"))
        for name in cheaters:
            view = nodes[name]
            if name in untrusted_at:
                continue
            if view is None:
                verdict_epoch = confirmed_epoch(name)
                if verdict_epoch is not None:
                    untrusted_at[name] = verdict_epoch
            elif view["reputation"] < UNTRUSTED_BELOW:
                assert view["untrusted"] and not view["routable"], view
                untrusted_at[name] = epoch
        return len(untrusted_at) == len(cheaters)

    started = time.monotonic()
    _wait(convicted, 600, "the substitute and the noisy node untrusted", every_s=1.0)
    print(f"cheaters untrusted after {time.monotonic() - started:.0f} s")
    first = _first_checked_epoch(devnet)
    assert all(epoch - first <= 5 for epoch in untrusted_at.values()), (first, untrusted_at)
    assert seen_unroutable_honest == []

    # honest nodes: reputation up from 0.5, routable, never accused
    def risen() -> bool:
        nodes = _nodes(devnet)
        return all((nodes[h] or {}).get("reputation", 0) >= 700_000 for h in honest)

    _wait(risen, 240, "the honest nodes' reputation above 0.7")
    # the personal-client test's nodes join from here on (not before: routable beside the
    # honest ones, they would share the challenges the honest nodes' rise is measured by)
    charging_operators.join()
    assert re.search(r"challenge epoch=\d+", _verifier_logs(devnet))  # challenges ran
    accused = {v["node"].lower() for v in _query(rpc, "/verdicts")["verdicts"]}
    assert not accused & {operators[h]["address"].lower() for h in honest}


def test_spot_checks_fail_every_noisy_block_and_pass_every_honest_one(devnet) -> None:
    nodes = _operators(devnet)
    lines = [
        line
        for line in _verifier_logs(devnet).splitlines()
        if "spot check epoch=" in line and "outcome=timeout" not in line
    ]
    noisy = [ln for ln in lines if f"node={nodes['node5']['key'][:12]}" in ln]
    assert noisy and all("outcome=failed" in ln for ln in noisy), noisy[:5]
    for name in ("node0", "node1", "node2"):
        checks = [ln for ln in lines if f"node={nodes[name]['key'][:12]}" in ln]
        assert all("outcome=passed" in ln for ln in checks), checks[:5]
    # N hands its tickets to the assigned verifier only, yet the failures reached 2/3: the
    # others re-judged the node's own tickets, forwarded by the verifier that found them (so
    # they never needed to ask N, which would have refused them)
    node_logs = Path(nodes["node5"]["home"]).rglob("*.log")
    banner = "CHEATING NODE mode=noise:0.1:4:withhold"
    assert any(banner in p.read_text(errors="replace") for p in node_logs)
    logged = _verifier_logs(devnet).splitlines()
    forwarded = [ln for ln in logged if "re-judged spot check (forwarded by" in ln]
    assert forwarded and all("outcome=failed" in ln for ln in forwarded), forwarded[:5]


def test_silent_node_is_flagged_unroutable_and_earns_nothing(devnet) -> None:
    rpc = devnet["committee_rpc"][0]

    def flagged() -> bool:
        return (_nodes(devnet)["node4"] or {}).get("uncommitted") is True

    _wait(flagged, 300, "the silent node flagged uncommitted")
    assert not _nodes(devnet)["node4"]["routable"]  # type: ignore[index]
    nodes = _operators(devnet)
    assert nodes["node4"]["key"] in _query(rpc, "/coverage")["uncommitted"]
    paid: dict[str, int] = {}
    for summary in _query(rpc, "/payouts")["epochs"]:
        for account, amount in _query(rpc, f"/payouts?epoch={summary['epoch']}")["rows"]:
            paid[account.lower()] = paid.get(account.lower(), 0) + int(amount)
    assert paid.get(nodes["node4"]["address"].lower(), 0) == 0
    assert all(paid.get(nodes[h]["address"].lower(), 0) > 0 for h in ("node0", "node2"))


def test_status_commands_and_the_dapp_show_the_flags(env, devnet) -> None:
    silent_home = devnet["operators"][4]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two commands side by side
        asked = pool.submit(_planet, env, "devnet", "status", timeout=60)
        mine = _planet(env, "status", "--home", silent_home, timeout=60)
        status = asked.result()
    assert status.returncode == 0, status.stderr
    assert "(uncommitted)" in status.stdout
    # each verifier up, its findings URL on chain (where its peers fetch the tickets it failed)
    shown = r"verifier of validator(\d): up, findings at (http://\S+)"
    verifiers = re.findall(shown, status.stdout)
    assert sorted(i for i, _ in verifiers) == ["0", "1", "2", "3"], status.stdout
    assert mine.returncode == 0, mine.stderr
    assert re.search(r"routable\s+no \(uncommitted\)", mine.stdout), mine.stdout
    with urllib.request.urlopen(devnet["gateway_url"] + "/v1/network", timeout=10) as answer:
        view = json.load(answer)
    flags = {n["key"]: (n["untrusted"], n["uncommitted"]) for n in view["nodes"]}
    nodes = _operators(devnet)
    assert flags[nodes["node4"]["key"]] == (False, True)
    assert flags[nodes["node0"]["key"]] == (False, False)


def _buy_against_a_small_balance(
    env: dict[str, str], devnet: dict[str, Any]
) -> dict[str, subprocess.CompletedProcess]:
    """The user deposits 3 credits' worth at the escrow, buys 2, asks for 2 more (refused: the
    balance covers 1), and counts the credits held: each command's result, by name."""
    escrow = devnet["contracts"]["QueryEscrow"]
    return {
        "deposit": _planet(
            env, "balance", "deposit", "0.000003", "--gateway", escrow, timeout=120
        ),  # 3 credits' worth at 10^12 wei each
        "bought": _planet(env, "credits", "buy", "2", "--json", timeout=240),
        "again": _planet(env, "credits", "buy", "2", "--wait", "120", timeout=240),
        "held": _planet(env, "credits", "show", "--json", timeout=60),
    }


@pytest.fixture(scope="module")
def small_balance_purchases(
    env: dict[str, str], devnet: dict[str, Any]
) -> Iterator[Future[dict[str, subprocess.CompletedProcess]]]:
    """`_buy_against_a_small_balance`, started by the first test (the cheaters' conviction):
    the purchases wait for the validators and an epoch's end, nothing of them depends on the
    verifiers' work, and the user's escrow balance is its own (issue 41: the test waited ~40 s
    of epochs on its own while the devnet burnt CPU). The personal-client test buys from the
    same balance only after `test_credits_are_bought_only_against_the_escrow_balance` read
    these."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        yield pool.submit(_buy_against_a_small_balance, env, devnet)
    finally:
        pool.shutdown(wait=True)


def test_credits_are_bought_only_against_the_escrow_balance(small_balance_purchases) -> None:
    done = small_balance_purchases.result(timeout=600)
    deposit, bought = done["deposit"], done["bought"]
    assert deposit.returncode == 0, deposit.stderr  # 3 credits' worth at 10^12 wei each
    assert bought.returncode == 0, bought.stderr
    assert json.loads(bought.stdout)["bought"] == 2
    assert "waiting for the validators" in bought.stderr  # progress shown
    # the balance covers 1 more credit, not 2: no validator vouches; the purchase waits in the
    # credit file while it could still be funded, and is dropped, uncharged, once it cannot
    again = done["again"]
    assert again.returncode != 0 and "Traceback" not in again.stderr
    assert "not funded by the end of epoch" in again.stderr, again.stderr
    assert "nothing was charged" in again.stderr, again.stderr
    held = done["held"]
    assert json.loads(held.stdout) | {"file": ""} == {"credits": 2, "pending": 0, "file": ""}


def _deposit_and_buy(
    env: dict[str, str],
    devnet: dict[str, Any],
    eth: str,
    credits: str,
    *extra: str,
    wallet: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess | None]:
    """`planet balance deposit ETH` at the escrow, then `planet credits buy CREDITS` (not run
    when the deposit failed: None); `wallet`: both commands' --wallet/--password-file (default:
    the devnet's user)."""
    escrow = devnet["contracts"]["QueryEscrow"]
    deposit = _planet(env, "balance", "deposit", eth, "--gateway", escrow, *wallet, timeout=120)
    if deposit.returncode != 0:
        return deposit, None
    return deposit, _planet(env, "credits", "buy", credits, *extra, *wallet, timeout=240)


PAID_POSITIONS = 64  # positions one credit buys on the charging nodes below
PAID_QUESTIONS = ("Name a planet.", "What is two plus two?", "Say hello in French.")


@pytest.fixture(scope="module")
def joined_homes(devnet: dict[str, Any]) -> Iterator[list[Path]]:
    """Homes of operators the tests join themselves (`devnet down` does not know them): their
    nodes serve until the last test, which stops them (`_stop_joined`; here again, at the
    module's end, whatever a failed test left running)."""
    homes: list[Path] = []
    yield homes
    _stop_joined(homes)


@pytest.fixture(scope="module")
def leaving(devnet: dict[str, Any]) -> Iterator[list[subprocess.Popen]]:
    """The honest nodes' `planet leave` commands: each keeps its node answering the spot checks
    of its last work for a few epochs, while the module goes on; the last test collects them."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _funded_and_staked(env: dict[str, str], devnet: dict[str, Any], home: Path) -> str:
    """A new operator's wallet in `home` (a dev keystore, as the devnet's own accounts: each
    `planet` command and agent that opens a scrypt one spends ~1.8 CPU-s in it), funded
    (`planet devnet fund`) and staked (`planet stake`): its address."""
    from node.keys import create_dev_wallet

    password = Path(devnet["password_file"]).read_text()
    home.mkdir()
    address = create_dev_wallet(home / "wallet.json", password).address
    started = time.monotonic()
    funded = _planet(env, "devnet", "fund", address, timeout=60)
    assert funded.returncode == 0, funded.stderr
    print(f"{home.name} funded after {time.monotonic() - started:.0f} s")
    staked = run_captured(
        [sys.executable, "-m", "planet", "stake", "--role", "compute", "--amount", "1",
         "--home", str(home)],
        text=True,
        env={**env, "PLANET_PASSWORD": password},
        timeout=180,
    )  # fmt: skip
    assert staked.returncode == 0, staked.stderr[-3000:]
    print(f"{home.name} staked after {time.monotonic() - started:.0f} s")
    return address


def _charging_operator(
    env: dict[str, str],
    devnet: dict[str, Any],
    home: Path,
    shard: int,
    port: int,
    staked: Future[str],
) -> dict[str, str]:
    """The operator in `home` (funded and staked: `staked`, its address) runs one charging
    node of `shard`: `planet join --credit-positions`, given the manifest and the model's
    config only, so it fetches its shard from the nodes serving it; {home, address, key}."""
    address = staked.result(timeout=300)
    with_password = {**env, "PLANET_PASSWORD": Path(devnet["password_file"]).read_text()}
    # the manifest alone: `join` fetches its shard from the nodes serving it (issue 27)
    manifest = home / "model" / Path(devnet["manifest"]).name
    manifest.parent.mkdir()
    shutil.copy(devnet["manifest"], manifest)
    shutil.copy(Path(devnet["manifest"]).parent / "config.json", manifest.parent)
    argv = [sys.executable, "-m", "planet", "join", "--model", str(manifest),
            "--shard", str(shard), "--credit-positions", str(PAID_POSITIONS),
            "--port", str(port), "--home", str(home)]  # fmt: skip
    join = subprocess.run(argv, capture_output=True, text=True, env=with_password, timeout=420)
    err = join.stderr
    assert join.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "fetch" in err.lower(), err[-3000:]
    entry = json.loads(Path(devnet["manifest"]).read_text())["shards"][shard]
    assert (home / "model" / entry["file"]).is_file()
    key = json.loads((home / "run" / "joined.json").read_text())["node_key"]
    return {"home": str(home), "address": address.lower(), "key": key}


@dataclass
class ChargingOperators:
    """The personal-client test's three charging operators, one per shard (homes
    PLANET_HOME/charging0…2), side by side in the background: funded and staked from the
    module's first test on (nothing on the committee names them yet), joined (`join`) from the
    end of that test (the cheaters convicted, the honest nodes risen); `nodes` waits for the
    joins: {home, address, key} by shard."""

    env: dict[str, str]
    devnet: dict[str, Any]
    homes: list[Path]
    pool: ThreadPoolExecutor
    staked: list[Future[str]]
    joined: list[Future[dict[str, str]]] = field(default_factory=list)

    def join(self) -> None:
        if self.joined:
            return
        ports = [ephemeral_port() for _ in self.homes]  # three at once on one host: each its own
        self.joined = [
            self.pool.submit(_charging_operator, self.env, self.devnet, home, shard, port, staked)
            for shard, (home, port, staked) in enumerate(
                zip(self.homes, ports, self.staked, strict=True)
            )
        ]

    def nodes(self) -> dict[int, dict[str, str]]:
        self.join()
        return {shard: joined.result(timeout=600) for shard, joined in enumerate(self.joined)}

    def fetched(self) -> bool:
        """True once every operator's `join` has its shard (fetched from the nodes serving it,
        hash-checked, renamed into place); a join that failed raises here."""
        self.join()
        for joined in self.joined:
            if joined.done():
                joined.result()
        shards = json.loads(Path(self.devnet["manifest"]).read_text())["shards"]
        return all(
            (home / "model" / shards[shard]["file"]).is_file()
            for shard, home in enumerate(self.homes)
        )


@pytest.fixture(scope="module")
def charging_operators(
    env: dict[str, str], devnet: dict[str, Any], joined_homes: list[Path]
) -> Iterator[ChargingOperators]:
    """`ChargingOperators`, started by the first test (their funding and stake beside the wait for
    the convictions), joined by it at its end (the nodes then serve beside the free honest ones,
    which leave in the personal-client test), so that their stake, shard fetch and model load
    overlap the tests that only wait for epochs and blocks (issue 41: the personal-client test
    waited for the joins)."""
    homes = [Path(env["PLANET_HOME"]) / f"charging{shard}" for shard in range(3)]
    joined_homes.extend(homes)  # not devnet operators: stopped at the module's end
    pool = ThreadPoolExecutor(max_workers=2 * len(homes))
    try:
        staked = [pool.submit(_funded_and_staked, env, devnet, home) for home in homes]
        yield ChargingOperators(env, devnet, homes, pool, staked)
    finally:
        pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def checking_only(env: dict[str, str], devnet: dict[str, Any]) -> Iterator[list[Any]]:
    """Validators 1-3's verifiers, once restarted to spot-check only (`_restart_checking_only`);
    stopped at the module's end (`devnet down` knows only the ones it started)."""
    started: list[Any] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        process.wait(timeout=30)


def _restart_checking_only(env: dict[str, str], devnet: dict[str, Any], started: list[Any]) -> None:
    """Validators 1-3's verifiers restarted with their own command lines plus
    `--challenges-per-epoch 0 --sampled-per-epoch 0`: they go on committing seeds,
    spot-checking (the leaving nodes' last work among it), re-judging and serving their
    findings, but ask nothing. From the honest nodes' leave on, no test reads a challenge of
    theirs (the reputations, convictions and marks settle from the challenges before; the
    charging nodes are scored by validator 0's verifier through its personal client), while
    each asked the charging nodes through the hosted gateway every epoch: the reference pass,
    the gateway's and the nodes' forwards, a credit redeemed (issue 41). Validator 0's
    verifier is restarted by its own test (`personal_verifier`)."""
    from node.procs import command_line, spawn_logged

    hosted = devnet["pids"]["verifiers"][1:]
    argvs = {}
    for index, pid in enumerate(hosted, start=1):
        argv = command_line(pid)
        assert argv, f"verifier {pid} of validator{index} is not running"
        argvs[index] = [part.decode() for part in argv[:-1]]  # /proc ends each one with \0
        os.kill(pid, signal.SIGTERM)
    for pid in hosted:  # each serves its findings on its port: gone before it is taken again
        _wait(lambda p=pid: not pid_alive(p), 60, f"verifier {pid} stopping", every_s=0.5)
    for index, argv in argvs.items():
        asks_nothing = ["--challenges-per-epoch", "0", "--sampled-per-epoch", "0"]
        log_path = Path(devnet["dir"]) / "logs" / f"verifier{index}-checks.log"
        started.append(spawn_logged([*argv, *asks_nothing], log_path, env=env))


def test_personal_client_pays_charging_nodes_with_credits_and_nothing_links_the_payer(
    env,
    devnet,
    charging_operators,
    leaving,
    personal_verifier,
    small_balance_purchases,
    checking_only,
) -> None:
    """A network where every routable node charges credits: three new operators join one charging
    node per shard (`planet join --credit-positions`, each given the manifest and the model's
    config only, so it fetches its shard from the nodes serving it; started by the first test,
    `charging_operators`), and the honest free nodes leave once those have their shards. The user
    buys credits from the escrow balance and asks through its own client (`planet gateway serve
    --personal`) with the official `openai` client. Every credit that left the credit file is
    redeemed by the nodes on the chain; the purchase is debited once into the escrow's credit
    pool and the pool pays exactly the credits redeemed, in posted statements whose rows hold the
    charging nodes. Then every tx since the test began and every state entry of a validator:
    nothing names both the payer and one of the nodes that served it (the payout statement aside,
    which lists the epoch's payers and payees together as totals), no mint holds a node key or
    any part of a credit that was redeemed, no record holds a question."""
    import openai

    rpc = devnet["committee_rpc"][0]
    password = Path(devnet["password_file"]).read_text()
    with_password = {**env, "PLANET_PASSWORD": password}
    # the credits test's purchases count the same balance and credit file: over first
    small_balance_purchases.result(timeout=600)
    start_height = int(_rpc(rpc, "status")["sync_info"]["latest_block_height"])

    # first the user buys credits (the escrow balance pays the mint): nothing of it depends
    # on which nodes serve, so it runs while the charging operators finish joining and the
    # free ones leave
    purchase = ThreadPoolExecutor(max_workers=1)
    buying = purchase.submit(_deposit_and_buy, env, devnet, "0.00003", "24", "--json")
    purchase.shutdown(wait=False)

    # three operators, each one charging node, side by side: each funded and staked since the first
    # test, joining since its end (`charging_operators`). Once each has fetched its shard from the
    # nodes serving it, the free honest nodes leave, side by side, while the charging nodes load and
    # register: then every node still routable charges credits. Each leaving node answers the spot
    # checks of its last work before it stops (6 epochs: the module goes on meanwhile; the last test
    # waits for them and checks that no timeout verdict slashed an honest node for leaving)
    started = time.monotonic()
    _wait(charging_operators.fetched, 420, "the charging operators' shards fetched")
    print(f"charging shards fetched {time.monotonic() - started:.0f} s into the test")
    operators = _operators(devnet)  # read before they leave (leaving removes joined.json)
    leaving.extend(
        subprocess.Popen(
            [sys.executable, "-m", "planet", "leave", "--home", operators[name]["home"]],
            env=with_password,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("node0", "node1", "node2")
    )
    # from here on validators 1-3's verifiers spot-check only (`_restart_checking_only`)
    _restart_checking_only(env, devnet, checking_only)
    paid = charging_operators.nodes()
    print(f"charging nodes joined {time.monotonic() - started:.0f} s into the test")

    def only_charging_routable() -> bool:
        routable = {n["key"] for n in _query(rpc, "/nodes")["nodes"] if n["routable"]}
        return routable == {p["key"] for p in paid.values()}

    # the user's credits bought, it starts its own client while the free nodes leave and asks
    # once the charging nodes alone are routable (the client reads the routable nodes at each
    # question's circuit, never at start: a list at most 2 s old, router.py's `refresh_s`, and
    # none is read before the first question)
    escrow = devnet["contracts"]["QueryEscrow"]
    deposit, bought = buying.result(timeout=400)
    assert deposit.returncode == 0, deposit.stderr
    assert bought.returncode == 0, bought.stderr
    held = json.loads(_planet(env, "credits", "show", "--json", timeout=60).stdout)["credits"]
    # the user's own credits (the file's format: node/client/credit_wallet.py): the nodes are
    # paid by the hosted gateway's credits too, and nothing on chain tells the two apart
    wallet_doc = json.loads((Path(env["PLANET_HOME"]) / "credits.json").read_text())
    # (a holder-bound credit is kept as {credit, seed})
    users_credits = {
        spent_id(parse_paid_credit(item["credit"] if isinstance(item, dict) else item))
        for item in wallet_doc["credits"]
    }
    assert len(users_credits) == held
    with personal_client(
        devnet["manifest"],
        rpc,
        min_positions=PAID_POSITIONS,
        env=env,
        log_path=Path(devnet["dir"]) / "logs" / "personal.log",
    ) as client:
        _wait(only_charging_routable, 300, "the charging nodes alone routable")
        # validator 0's verifier restarts through its operator's personal client meanwhile
        # (the next test's, `personal_verifier`): its challenges reach the charging nodes only
        personal_verifier.start()
        print(f"charging nodes alone routable {time.monotonic() - started:.0f} s into the test")
        api = openai.OpenAI(base_url=client.base_url, api_key=client.token, max_retries=0)
        receipts = []
        for question in PAID_QUESTIONS:
            answer = api.chat.completions.create(
                model=json.loads(Path(devnet["manifest"]).read_text())["model_id"],
                messages=[{"role": "user", "content": question}],
                max_tokens=6,
                temperature=0,  # OpenAI's default of 1 may sample EOS first: an empty answer
                timeout=180,
            )
            assert answer.choices[0].message.content and answer.usage.completion_tokens
            receipts.append(answer.model_extra["planet_receipt"])
    assert all(r["paid_with"] == "credits" for r in receipts)
    spent = receipts[-1]["credits_spent"]
    # each question pays each of the 3 nodes at least one credit (its first chunk)
    assert spent >= 3 * len(PAID_QUESTIONS) and receipts[-1]["credits_left"] == held - spent
    user = next(a["address"] for a in devnet["accounts"] if a["name"] == "user").lower()

    # every credit that left the credit file reached a node and was redeemed on the chain (the
    # spent set; the nodes' spools do not empty for good meanwhile: the hosted gateway pays them
    # for the verifiers' challenges too)
    def users_redeemed() -> int | None:
        heights = [
            height
            for spent_key in users_credits
            if (height := _query(rpc, f"/credit_spent?id={spent_key}")["height"]) is not None
            and height >= start_height
        ]
        return max(heights) if len(heights) == spent else None

    redeemed_by = _wait(users_redeemed, 120, "the nodes redeeming the user's credits", 3.0)
    print(f"the user's credits redeemed {time.monotonic() - started:.0f} s into the test")
    # each charging node redeemed some of them (a redeem refused before the node's commitments
    # landed, UNCOMMITTED_REDEMPTION, is in a block all the same: its credits were sent again)
    by_node: dict[str, set[str]] = {p["key"]: set() for p in paid.values()}
    for tx in _txs_since(rpc, start_height):
        if tx.type in REDEEM_TXS:
            by_node.setdefault(tx.signer, set()).update(spent_id(c) for c in tx.body.credits)
    assert all(by_node[p["key"]] & users_credits for p in paid.values())

    # the user's purchase goes into the escrow's credit pool in a statement the watchers post,
    # and the pool pays the epochs the charging nodes redeemed in: each credit spent, once
    _, contract = escrow_contract(devnet)
    pool = escrow.lower()
    price = 10**12  # the devnet's credit price

    def pairs(view: dict[str, Any]) -> dict[tuple[str, str], int]:
        return {
            (p.lower(), g.lower()): int(d)
            for p, g, d in zip(view["payers"], view["gateways"], view["debits"], strict=True)
        }

    def paid_out() -> list[dict[str, Any]] | None:
        views = []
        for summary in _query(rpc, "/payouts")["epochs"]:
            if summary["closed_height"] < start_height:
                continue
            if contract.functions.epochOf(summary["epoch"]).call()[3] != 1:
                return None  # not every statement since is posted yet
            views.append(_query(rpc, f"/payouts?epoch={summary['epoch']}"))
        if not any(v["closed_height"] >= redeemed_by for v in views):
            return None  # the epoch of the last redemption has not closed yet
        drawn = sum(pairs(v).get((pool, pool), 0) for v in views)
        return views if drawn >= spent * price else None

    views = _wait(paid_out, 300, "the redeemed credits paid from the pool in posted statements")
    print(f"the pool's payouts posted {time.monotonic() - started:.0f} s into the test")
    purchases = [pairs(v)[(user, pool)] for v in views if (user, pool) in pairs(v)]
    assert purchases == [24 * price]  # 24 credits at the devnet's price, debited once
    # the pool paid at least the user's credits (the gateway's, redeemed meanwhile, too)
    assert sum(pairs(v).get((pool, pool), 0) for v in views) >= spent * price
    payees = {a.lower() for v in views if (pool, pool) in pairs(v) for a, _ in v["rows"]}
    assert {p["address"] for p in paid.values()} <= payees, payees
    # what stays in the pool backs at least every credit the user still holds
    assert contract.functions.prepaidOf(escrow, escrow).call()[0] >= (held - spent) * price

    _assert_nothing_links(devnet, user, paid, start_height)


def test_cheaters_verdicts_confirmed_and_stakes_slashed(env, devnet) -> None:
    """The convictions of `test_cheaters_untrusted_within_5_epochs_honest_rise` reach the
    chains: verdicts confirmed by ≥ 2/3 of the power against both cheaters, relayed by the
    watchers, their stake slashed on the EVM chain, the honest nodes' whole (checked after the
    personal-client test: by then the relays are long done, so nothing waits for them)."""
    from web3 import Web3

    rpc = devnet["committee_rpc"][0]
    honest, cheaters = ("node0", "node1", "node2"), ("node3", "node5")
    operators = _operator_accounts(devnet)  # the honest ones have left: no joined.json

    # verdicts confirmed by ≥ 2/3 of the power (3 of 4 validators) against both cheaters (a
    # node untrusted by its agreed challenge scores gets its verdict an epoch or so later)
    def confirmed() -> list[dict[str, Any]]:
        verdicts = _query(rpc, "/verdicts?confirmed=true")["verdicts"]
        addresses = {operators[name]["address"].lower() for name in cheaters}
        found = [v for v in verdicts if v["node"].lower() in addresses]
        return found if {v["node"].lower() for v in found} == addresses else []

    verdicts = _wait(confirmed, 240, "confirmed verdicts against both cheaters")
    assert all(len(v["signers"]) >= 3 for v in verdicts), verdicts
    # the watchers relayed them: the cheaters' stake on the EVM chain is slashed (polled on
    # the contract, where every stake is then read: the honest nodes' whole)
    staking = _staking_contract(devnet)
    for name in cheaters:
        address = Web3.to_checksum_address(operators[name]["address"])
        _wait(
            lambda a=address: staking.functions.stakeOf(a).call() < 10**18,
            120,
            f"{name}'s stake slashed",
            every_s=1.0,
        )
    names = (*cheaters, *honest)
    stakes = {
        name: staking.functions.stakeOf(Web3.to_checksum_address(operators[name]["address"])).call()
        for name in names
    }
    assert all(stakes[c] < 10**18 for c in cheaters), stakes
    assert all(stakes[h] == 10**18 for h in honest), stakes
    # `planet status` shows a slashed operator's stake and a whole one's (one of each, side by
    # side: five such processes took ~25 s of the shared 2-core box while the devnet ran on,
    # issue 41; the contract above holds every one of the five)
    shown = (cheaters[0], honest[0])
    with ThreadPoolExecutor(max_workers=len(shown)) as pool:
        read = pool.map(lambda name: _evm_stake(env, operators[name]["home"]), shown)
        slashed, whole = read
    assert slashed < 10**18 and whole == 10**18, (slashed, whole, stakes)


def test_no_verifier_is_marked_for_a_false_accusation(devnet) -> None:
    """Accusations are settled SETTLE_EPOCHS after their vote: wait for the convictions' marks,
    then no verifier has a refused accusation or a bench. (After the personal-client test: the
    marks settle while the honest nodes leave, not before.)"""

    def settled() -> dict[str, Any]:
        marks = _query(devnet["committee_rpc"][0], "/verifiers")["verifiers"]
        return marks if any(m["confirmed"] for m in marks.values()) else {}

    marks = _wait(settled, 240, "the verifiers' accusations settled")
    assert all(m["refused"] == 0 and m["benched_until"] == 0 for m in marks.values()), marks


VERIFIER_CREDITS = 24  # validator 0's operator's credits for its verifier's personal client


def _verifier_operator_credits(
    env: dict[str, str], devnet: dict[str, Any], credits_file: Path
) -> tuple[subprocess.CompletedProcess, ...]:
    """Validator 0's operator buys credits like any user, from a wallet of its own (funded by
    `planet devnet fund`, a dev keystore as `_funded_and_staked`'s; not the verifier's wallet,
    which deposits a query id per challenge meanwhile, nor the devnet's user, whose purchases
    the other tests count): (fund, deposit, buy)."""
    from node.keys import create_dev_wallet

    home = Path(env["PLANET_HOME"]) / "verifier0-operator"
    home.mkdir()
    wallet = home / "wallet.json"
    address = create_dev_wallet(wallet, Path(devnet["password_file"]).read_text()).address
    funded = _planet(env, "devnet", "fund", address, timeout=60)
    if funded.returncode != 0:
        return (funded,)
    paying = ("--wallet", str(wallet), "--password-file", devnet["password_file"])
    return funded, *_deposit_and_buy(
        env, devnet, "0.00003", str(VERIFIER_CREDITS), "--credits-file", str(credits_file),
        wallet=paying,
    )  # fmt: skip


@dataclass
class PersonalVerifier:
    """Validator 0's verifier restarted with `--personal-client` (see `personal_verifier`),
    run in the background once `start` is called: what the test reads afterwards."""

    env: dict[str, str]
    devnet: dict[str, Any]
    credits_file: Path
    purchase: Future[tuple[subprocess.CompletedProcess, ...]]
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=1))
    run: Future[dict[str, Any]] | None = None

    def start(self) -> None:
        if self.run is None:
            self.run = self.pool.submit(_challenge_through_a_personal_client, self)

    def result(self) -> dict[str, Any]:
        self.start()
        assert self.run is not None
        return self.run.result(timeout=900)


def _challenge_through_a_personal_client(job: PersonalVerifier) -> dict[str, Any]:
    """Stop validator 0's hosted verifier, start it again with `--personal-client` pointed at
    its operator's own client (route uniform: every routable node is challenged), started with
    the operator's credits; the first challenge it logs: {charging, circuit, credibility}, the
    charging set being the routable nodes when it restarted."""
    from deploy.committee.network import load_network
    from node.gateway.personal_token import load_or_create
    from node.procs import spawn_logged

    env, devnet = job.env, job.devnet
    rpc = devnet["committee_rpc"][0]
    charging = {n["key"][:12] for n in _query(rpc, "/nodes")["nodes"] if n["routable"]}
    purchase = job.purchase.result(timeout=600)
    for done in purchase:
        assert done.returncode == 0, done.stderr[-3000:]
    assert len(purchase) == 3 and purchase[2] is not None, purchase
    validator = load_network(Path(devnet["committee_dir"])).validators[0]
    hosted = devnet["pids"]["verifiers"][0]  # validator 0's verifier, asking the gateway
    os.kill(hosted, signal.SIGTERM)
    _wait(lambda: not pid_alive(hosted), 60, "validator 0's verifier stopping", every_s=0.5)
    log_path = Path(devnet["dir"]) / "logs" / "verifier0-personal.log"
    client_log = Path(devnet["dir"]) / "logs" / "verifier0-personal-client.log"
    token_file = client_log.with_suffix(".token")
    load_or_create(token_file)  # the client's token, drawn now: the client reads it at start
    port = ephemeral_port()
    # pointed at its personal client's port and token before the client starts: the verifier
    # loads its model meanwhile, waits for the client, and asks again at each challenge
    argv = [sys.executable, "-m", "planet", "verifier", "serve",
            "--home", validator.home, "--manifest", devnet["manifest"],
            "--personal-client", f"http://127.0.0.1:{port}",
            "--personal-token-file", str(token_file),
            "--deployment", devnet["deployment"], "--evm-rpc", devnet["evm_rpc"],
            "--committee-rpc", validator.rpc_url,
            "--wallet", str(Path(devnet["dir"]) / "verifier0" / "wallet.json"),
            "--password-file", devnet["password_file"], "--challenge-source", "corpus",
            "--challenges-per-epoch", "1", "--sampled-per-epoch", "0"]  # fmt: skip
    verifier = spawn_logged(argv, log_path, env=env)
    try:
        with personal_client(
            devnet["manifest"],
            rpc,
            min_positions=PAID_POSITIONS,
            env=env,
            log_path=client_log,
            credits_file=job.credits_file,
            route="uniform",  # a verifier's client: its challenges reach every routable node
            token_file=token_file,
            port=port,
        ):

            def challenged() -> list[tuple[str, str]]:
                assert verifier.poll() is None, log_path.read_text()[-3000:]
                return re.findall(r"challenge epoch=\d+ circuit=(\[[^]]*\]).* C=(\d+)",
                                  log_path.read_text())  # fmt: skip

            circuit, credibility = _wait(challenged, 300, "a challenge through the client")[0]
    finally:
        verifier.terminate()
        verifier.wait(timeout=30)
    return {"charging": charging, "circuit": circuit, "credibility": credibility}


@pytest.fixture(scope="module")
def personal_verifier(env: dict[str, str], devnet: dict[str, Any]) -> Iterator[PersonalVerifier]:
    """Validator 0's verifier through its operator's personal client: the operator's credits
    bought from the first test on (`_verifier_operator_credits`: a payer of its own, so no
    other test's purchase or balance sees them), the restart started by the personal-client
    test once the charging nodes alone are routable, so that the verifier's model load and
    first challenge overlap that test's waits for redemptions and posted statements (issue 41:
    the two ran one after the other, ~50 s of a devnet burning CPU)."""
    credits_file = Path(env["PLANET_HOME"]) / "verifier0-credits.json"
    buying = ThreadPoolExecutor(max_workers=1)
    job = PersonalVerifier(
        env, devnet, credits_file,
        buying.submit(_verifier_operator_credits, env, devnet, credits_file),
    )  # fmt: skip
    try:
        yield job
    finally:
        buying.shutdown(wait=True)
        job.pool.shutdown(wait=True)


def test_a_verifier_asking_through_its_personal_client_challenges_the_charging_nodes(
    joined_homes, personal_verifier
) -> None:
    """After the test before, the routable nodes are the three charging ones that joined.
    Validator 0's operator buys credits (like any user, from a wallet of its own), runs their
    own personal client (route uniform, so every routable node is challenged) and restarts
    their verifier with `--personal-client` instead of asking through the hosted gateway
    (which sees every challenge): its next challenge runs on the charging nodes (paid with
    those credits), names them, and scores the honest ones fully. (Started in the background
    by the test before, `personal_verifier`, once the charging nodes alone were routable.)"""
    done = personal_verifier.result()
    charging = done["charging"]
    assert len(charging) == 3 and len(joined_homes) == 3, charging  # the test before's nodes
    assert set(json.loads(done["circuit"].replace("'", '"'))) == charging
    assert int(done["credibility"]) == 1_000_000  # honest charging nodes score fully
    # the verifier's credits paid them
    assert CreditWallet(personal_verifier.credits_file).count() < VERIFIER_CREDITS


def _stop_joined(homes: list[Path]) -> None:
    """Stop the agents and nodes `planet join` started from `homes` (`devnet down` does not
    know them), side by side, while the committee still runs: each agent's `leave` commits and
    it exits (killed after a grace), then its node; none outlives the module."""
    from node.agent.launch import read_joined, stop_joined

    records = [joined for home in homes if (joined := read_joined(home / "run")) is not None]
    with ThreadPoolExecutor(max_workers=max(1, len(homes))) as pool:
        list(pool.map(lambda home: stop_joined(home / "run"), homes))
    left = [
        pid for joined in records for pid in (joined.agent_pid, joined.node_pid) if pid_alive(pid)
    ]
    assert not left, f"joined processes {left} outlived the module"


def _raw_txs_since(rpc: str, start_height: int) -> list[bytes]:
    """Every tx's bytes from `start_height` to the last block, in order (the blocks fetched
    a few at a time: hundreds of them)."""
    top = int(_rpc(rpc, "status")["sync_info"]["latest_block_height"])

    def txs(height: int) -> list[bytes]:
        block = _rpc(rpc, "block", height=str(height))
        return [base64.b64decode(raw) for raw in block["block"]["data"]["txs"] or ()]

    with ThreadPoolExecutor(max_workers=8) as pool:
        return [raw for block in pool.map(txs, range(start_height, top + 1)) for raw in block]


MINT_TXS = frozenset({"credit_mint"})  # the one mint kind (the RSA `mint` is retired)
REDEEM_TXS = frozenset({"credit_redeem"})


def _txs_since(rpc: str, start_height: int, kind: str | None = None) -> list[Any]:
    """The decoded committee txs (of `kind`, or all) from `start_height`; the proposers'
    injected extended-commit txs (binary, abci_app/extensions.py) are not committee txs."""
    from protocol.committee.envelope import decode

    txs = [decode(raw) for raw in _raw_txs_since(rpc, start_height) if raw[:1] == b"{"]
    return [tx for tx in txs if kind is None or tx.type == kind]


def _assert_nothing_links(
    devnet: dict[str, Any], user: str, paid: dict[int, dict[str, str]], start_height: int
) -> None:
    """Every tx from `start_height` and every state entry of validator 0 (its app.sqlite)."""
    import sqlite3

    from protocol.committee.envelope import decode

    payer = user.removeprefix("0x")
    nodes = {p["key"] for p in paid.values()} | {p["address"][2:] for p in paid.values()}
    raws = _raw_txs_since(devnet["committee_rpc"][0], start_height)
    for raw in raws:  # the injected extended-commit txs: not the payer, in any form
        if raw[:1] != b"{":
            assert bytes.fromhex(payer) not in raw and payer.encode() not in raw.lower()
    txs = [decode(raw) for raw in raws if raw[:1] == b"{"]  # an RSA `mint` would not decode
    mints = [tx for tx in txs if tx.type in MINT_TXS and tx.body.payer.lower() == user]
    redeems = [tx for tx in txs if tx.type in REDEEM_TXS and tx.signer in nodes]
    assert mints and len({tx.signer for tx in redeems}) == 3
    redeemed = set()
    for tx in redeems:
        for credit in tx.body.credits:
            redeemed.add(spent_id(credit))  # its nonce, σ and bytes: none in a mint
            redeemed |= {credit.nonce.hex(), credit.signature.hex(), credit.to_bytes().hex()}
    for tx in txs:
        text = tx.raw.decode().lower()
        assert not (payer in text and [n for n in nodes if n in text]), tx.type
        assert not [q for q in PAID_QUESTIONS if q.lower() in text]
    for tx in mints:
        assert not [secret for secret in redeemed if secret in tx.raw.decode().lower()]
    [store] = Path(devnet["committee_dir"]).glob("node0/**/app.sqlite")
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT ns, key, value FROM kv").fetchall()
    for ns, key, value in rows:
        text = f"{key} {value}".lower()
        assert not [q for q in PAID_QUESTIONS if q.lower() in text]
        if payer in text and ns != "payout":  # a statement: the epoch's totals, all together
            assert not [n for n in nodes if n in text], (ns, key)
        if ns == "mint":
            assert not [secret for secret in redeemed if secret in text]


def _rpc(rpc: str, method: str, **params: str) -> Any:
    url = f"{rpc}/{method}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["result"]


def test_no_honest_node_is_slashed_for_leaving(
    devnet, leaving, joined_homes, checking_only
) -> None:
    """Last: the honest nodes' `planet leave` (started by the personal-client test) kept each
    node answering the spot checks of its last work, then stopped it; and no verdict against any
    of them was ever confirmed — in particular no ticket timeout for blocks they committed
    before leaving. (The charging nodes, whose work is done, stop meanwhile: `_stop_joined`.)"""
    stopping = ThreadPoolExecutor(max_workers=1)
    stopped = stopping.submit(_stop_joined, joined_homes)
    stopping.shutdown(wait=False)
    assert len(leaving) == 3, "the honest nodes never left (the personal-client test failed)"
    # validators 1-3's verifiers, restarted to spot-check only, did so to the end
    assert len(checking_only) == 3 and all(p.poll() is None for p in checking_only)
    for process in leaving:
        out, err = process.communicate(timeout=400)
        assert process.returncode == 0 and "chain status LEFT" in out, err[-3000:]
        assert "answering spot checks of its last work until epoch" in err, err[-3000:]
        assert "node stopped" in out, out
    rpc = devnet["committee_rpc"][0]
    addresses = {a["name"]: a["address"].lower() for a in devnet["accounts"]}
    honest = {addresses[name] for name in ("node0", "node1", "node2")}
    confirmed = _query(rpc, "/verdicts?confirmed=true")["verdicts"]
    assert not [v for v in confirmed if v["node"].lower() in honest], confirmed
    stopped.result(timeout=120)
