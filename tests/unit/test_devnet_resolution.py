"""The one rule that finds the running devnet (node/config.py `find_devnet`), and every operator
command resolving its chains through it: flags > env > config.toml > running devnet > defaults.

The devnet here is only its state file, pointing at loopback ports where nothing listens: each
command must then fail naming THAT devnet's URL (or show it), never the built-in defaults.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from node.cli.ask import _pay_defaults
from node.config import (
    DEFAULT_EVM_RPC,
    find_devnet,
    resolve_config,
    write_config_file,
)
from node.keys import create_dev_wallet
from planet import main as cli
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _devnet(directory: Path, **changes: Any) -> dict[str, Any]:
    """A devnet state file as `planet devnet up` writes it, its RPCs on dead loopback ports."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "dir": str(directory),
        "status": "up",
        "chain_id": 31337,
        "evm_rpc": f"http://127.0.0.1:{_dead_port()}",
        "committee_rpc": [f"http://127.0.0.1:{_dead_port()}", "http://127.0.0.1:2"],
        "deployment": str(directory / "deployment.json"),
        "gateway_url": f"http://127.0.0.1:{_dead_port()}",
        "password_file": str(directory / "password"),
        "accounts": [{"name": "user", "address": "0x" + "1" * 40, "keystore": "/u.json"}],
        "next_hop_range": "10.77.0.0/24",
        **changes,
    }
    (directory / "devnet.json").write_text(json.dumps(state))
    return state


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PLANET_HOME with a running devnet in it; no other PLANET_* variable."""
    for name in ("EVM_RPC", "COMMITTEE_RPC", "CHAIN_ID", "DEPLOYMENT", "DEVNET", "PASSWORD_FILE"):
        monkeypatch.delenv(f"PLANET_{name}", raising=False)
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    monkeypatch.setenv("PLANET_PASSWORD", "correct horse")
    return tmp_path


# --- the rule -------------------------------------------------------------------------------


def test_find_devnet_reads_a_running_devnet_under_planet_home(tmp_path: Path) -> None:
    state = _devnet(tmp_path / "devnet")
    devnet = find_devnet({"PLANET_HOME": str(tmp_path)})
    assert devnet is not None
    assert devnet.dir == tmp_path / "devnet"
    assert devnet.evm_rpc == state["evm_rpc"] and devnet.chain_id == 31337
    assert devnet.committee_rpc == tuple(state["committee_rpc"])
    assert devnet.deployment == Path(state["deployment"])
    assert devnet.gateway_url == state["gateway_url"] and devnet.next_hop_range == "10.77.0.0/24"


def test_find_devnet_planet_devnet_wins_over_planet_home(tmp_path: Path) -> None:
    _devnet(tmp_path / "home" / "devnet", evm_rpc="http://127.0.0.1:1")
    other = _devnet(tmp_path / "elsewhere", evm_rpc="http://10.77.0.1:8545")
    env = {"PLANET_HOME": str(tmp_path / "home"), "PLANET_DEVNET": str(tmp_path / "elsewhere")}
    devnet = find_devnet(env)
    assert devnet is not None and devnet.evm_rpc == other["evm_rpc"]


@pytest.mark.parametrize("status", ["down", "starting", None])
def test_find_devnet_ignores_a_devnet_that_is_not_up(tmp_path: Path, status: Any) -> None:
    _devnet(tmp_path / "devnet", status=status)
    assert find_devnet({"PLANET_HOME": str(tmp_path)}) is None
    assert find_devnet({"PLANET_HOME": str(tmp_path / "nothing-here")}) is None


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{not json", "cannot read"), ('{"status": "up"}', "is not a devnet's state")],
)
def test_find_devnet_broken_state_is_a_config_error(
    tmp_path: Path, content: str, fragment: str
) -> None:
    (tmp_path / "devnet").mkdir()
    (tmp_path / "devnet" / "devnet.json").write_text(content)
    with pytest.raises(ConfigError) as raised:
        find_devnet({"PLANET_HOME": str(tmp_path)})
    assert fragment in raised.value.message and raised.value.hint


def test_find_devnet_planet_devnet_naming_nothing_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$PLANET_DEVNET: no devnet in"):
        find_devnet({"PLANET_DEVNET": str(tmp_path / "gone")})


def test_resolve_config_devnet_beats_defaults_file_env_and_flags_beat_devnet(
    tmp_path: Path,
) -> None:
    state = _devnet(tmp_path / "devnet")
    env = {"PLANET_HOME": str(tmp_path)}
    home = tmp_path / "operator"
    config = resolve_config({"home": home}, env=env)
    assert config.evm_rpc == state["evm_rpc"] != DEFAULT_EVM_RPC
    assert config.committee_rpc == state["committee_rpc"][0]
    assert config.deployment_path == Path(state["deployment"])
    assert config.next_hop_range == "10.77.0.0/24" and config.devnet == tmp_path / "devnet"
    write_config_file(home / "config.toml", {"evm_rpc": "http://file:1"})
    assert resolve_config({"home": home}, env=env).evm_rpc == "http://file:1"
    with_env = {**env, "PLANET_EVM_RPC": "http://env:1"}
    assert resolve_config({"home": home}, env=with_env).evm_rpc == "http://env:1"
    flags = {"home": home, "evm_rpc": "http://flag:1"}
    assert resolve_config(flags, env=with_env).evm_rpc == "http://flag:1"


def test_resolve_config_bad_next_hop_range_names_its_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$PLANET_NEXT_HOP_RANGE: next-hop range 'lan'"):
        resolve_config({"home": tmp_path}, env={"PLANET_NEXT_HOP_RANGE": "lan"})
    config = resolve_config({"home": tmp_path, "next_hop_range": "10.77.0.9/24"}, env={})
    assert config.next_hop_range == "10.77.0.0/24"


# --- every operator command goes through it -------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def test_stake_reaches_the_running_devnets_chain(env: Path, capsys) -> None:
    state = _devnet(env / "devnet")
    code, _, err = _run(capsys, "stake", "--role", "compute", "--amount", "1")
    assert code == 6
    assert f"error: EVM RPC {state['evm_rpc']} is unreachable" in err
    assert f"hint: is the devnet in {env / 'devnet'} still up?" in err


# No devnet under PLANET_HOME: the hint says how to get one. The chain is named by
# PLANET_EVM_RPC at a dead port, not the built-in default (test_config checks that default): the
# default 127.0.0.1:8545 is the first devnet's anvil port, which a devnet the run shares holds.
def test_stake_without_any_devnet_says_how_to_get_one(
    env: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{_dead_port()}"
    monkeypatch.setenv("PLANET_EVM_RPC", dead)
    code, _, err = _run(capsys, "stake", "--role", "compute", "--amount", "1")
    assert code == 6 and f"EVM RPC {dead} is unreachable" in err
    assert "hint: start a devnet (`planet devnet up`: commands find it)" in err


def test_join_reaches_the_running_devnets_chain(env: Path, capsys) -> None:
    from tests.unit.test_operator_cli import _tiny_model

    state = _devnet(env / "devnet")
    manifest = _tiny_model(env / "models" / "tiny-2p")
    code, _, err = _run(capsys, "join", "--model", str(manifest), "--shard", "0")
    assert code == 6 and f"error: EVM RPC {state['evm_rpc']} is unreachable" in err


def test_status_shows_the_running_devnets_chains(env: Path, capsys) -> None:
    state = _devnet(env / "devnet")
    code, out, _ = _run(capsys, "status", "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["evm_rpc"] == state["evm_rpc"]
    assert shown["committee_rpc"] == state["committee_rpc"][0]


@pytest.mark.parametrize("command", ["earnings", "claim"])
def test_earnings_and_claim_reach_the_running_devnets_chains(
    env: Path, capsys, command: str
) -> None:
    state = _devnet(env / "devnet")
    create_dev_wallet(env / "wallet.json", "correct horse")
    code, _, err = _run(capsys, command)
    assert code != 0
    assert state["evm_rpc"] in err or state["committee_rpc"][0] in err, err


def test_leave_reaches_the_running_devnets_committee(env: Path, capsys) -> None:
    """A joined home with no config.toml: `leave` asks the devnet's committee (here: dead)."""
    state = _devnet(env / "devnet")
    run = env / "op" / "run"
    run.mkdir(parents=True)
    joined = {
        "shard": 0, "port": 18100, "endpoint": "http://127.0.0.1:18100", "model": "m",
        "manifest": "m", "node_pid": 999_999_999, "agent_pid": 999_999_998, "node_key": "ab",
        "node_log": "n", "agent_log": "a",
    }  # fmt: skip
    (run / "joined.json").write_text(json.dumps(joined))
    code, _, err = _run(capsys, "leave", "--home", str(env / "op"))
    assert code == 6
    assert f"the committee at {state['committee_rpc'][0]} did not answer" in err
    assert "hint:" in err


def test_ask_and_balance_take_the_same_devnet(env: Path) -> None:
    state = _devnet(env / "devnet")
    args = cli.build_parser().parse_args(["ask", "--pay", "hi"])
    settings = _pay_defaults(args)
    assert settings["gateway"] == state["gateway_url"]
    assert settings["evm_rpc"] == state["evm_rpc"]
    assert settings["deployment"] == Path(state["deployment"])
    assert settings["wallet"] == Path("/u.json")  # the devnet's user wallet
    balance = _pay_defaults(cli.build_parser().parse_args(["balance", "show"]))
    assert (balance["evm_rpc"], balance["deployment"]) == (state["evm_rpc"], settings["deployment"])


def test_join_bad_host_is_refused_before_anything_runs(env: Path, capsys) -> None:
    from tests.unit.test_operator_cli import _tiny_model

    manifest = _tiny_model(env / "models" / "tiny-2p")
    code, _, err = _run(
        capsys, "join", "--model", str(manifest), "--shard", "0", "--host", "node.example"
    )
    assert code == 2
    assert "error: --host 'node.example' is not an IP address" in err and "hint:" in err


def test_join_registers_the_address_it_reaches_the_committee_from() -> None:
    from node.cli import operator

    assert operator._reachable_address("http://127.0.0.1:26657") == "127.0.0.1"
    assert operator._parse_host(" 10.77.0.7 ") == "10.77.0.7"
    assert operator._parse_host("[::1]") == "::1"


def test_personal_client_takes_the_running_devnets_model_and_its_private_addresses(
    env: Path,
) -> None:
    from node.cli.gateway import _personal_devnet_defaults

    state = _devnet(env / "devnet", manifest=str(env / "models" / "m" / "manifest.json"))
    ours = state["committee_rpc"][0]
    args = cli.build_parser().parse_args(["gateway", "serve", "--personal"])
    assert _personal_devnet_defaults(args, ours) == ((Path(state["manifest"]),), True)
    # a committee of strangers: public addresses only, and the model must be named
    args = cli.build_parser().parse_args(["gateway", "serve", "--personal", "--manifest", "x"])
    assert _personal_devnet_defaults(args, "http://203.0.113.9:26657") == ((Path("x"),), False)


def test_personal_client_without_a_devnet_or_manifest_says_what_to_name(env: Path, capsys) -> None:
    code, _, err = _run(capsys, "gateway", "serve", "--personal")
    assert code == 2
    assert "error: --personal needs --manifest" in err and "hint:" in err
