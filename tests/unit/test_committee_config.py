"""Generation of the local committee network's files (deploy.committee): config rewriting,
genesis, node ids, operator keys, and `init` with the real `cometbft testnet` (no node runs)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from deploy.committee.cometbft import (
    find_cometbft,
    node_id_from_key,
    set_toml_values,
    validator_config,
)
from deploy.committee.generate import InitOptions, init_network
from deploy.committee.genesis import DEFAULT_EVM_CHAIN_ID, app_state, configure_genesis
from deploy.committee.network import Network, Validator, load_network
from deploy.committee.processes import log_tail, read_pid, running_processes, stop_network
from node.keys import OPERATOR_KEY_FILE, read_operator_key
from node.procs import START_MARKER
from protocol.errors import ConfigError, UsageError

pytestmark = pytest.mark.unit

SAMPLE_TOML = """\
# top comment
proxy_app = "tcp://127.0.0.1:26658"
moniker = "abc"

[rpc]
# the RPC address
laddr = "tcp://127.0.0.1:26657"
max_open_connections = 900

[p2p]
laddr = "tcp://0.0.0.0:26656"
pex = true
"""

# A node key and the id `cometbft show-node-id` (v0.38.25) printed for it.
NODE_KEY = {
    "priv_key": {
        "type": "tendermint/PrivKeyEd25519",
        "value": (
            "SizyLmBkWzoS+F+z4CawPacNbiYuxw4mgpea6UKvNhM5GbreDS20GUFqkO70FwdWiKGm2TUSbE8N9FhHwGw7CA=="
        ),
    }
}
NODE_ID = "60f23448cb9998517823a2294376dade64cbdb8b"


def test_set_toml_values_known_keys_replaced_per_section_comments_kept() -> None:
    out = set_toml_values(
        SAMPLE_TOML,
        {
            "": {"moniker": "validator0"},
            "rpc": {"laddr": "tcp://127.0.0.1:27001", "max_open_connections": 2000},
            "p2p": {"laddr": "tcp://127.0.0.1:27000", "pex": False},
        },
    )
    assert 'moniker = "validator0"' in out
    assert 'laddr = "tcp://127.0.0.1:27001"' in out
    assert 'laddr = "tcp://127.0.0.1:27000"' in out
    assert "max_open_connections = 2000" in out
    assert "pex = false" in out
    assert "# the RPC address" in out and "# top comment" in out
    assert out.count("\n") == SAMPLE_TOML.count("\n")


def test_set_toml_values_missing_key_raises_config_error() -> None:
    with pytest.raises(ConfigError) as raised:
        set_toml_values(SAMPLE_TOML, {"rpc": {"pex": False}})
    assert "[rpc] pex" in raised.value.message


def test_node_id_from_key_matches_cometbft() -> None:
    assert node_id_from_key(NODE_KEY) == NODE_ID


def _validators(count: int, base: int = 27000) -> list[Validator]:
    return [
        Validator(
            index=i,
            home=f"/x/node{i}",
            node_id=f"{i:040x}",
            p2p_port=base + 10 * i,
            rpc_port=base + 10 * i + 1,
            abci_port=base + 10 * i + 2,
            pprof_port=base + 10 * i + 3,
            operator_address="0x" + "11" * 20,
            validator_address="AA",
        )
        for i in range(count)
    ]


def test_validator_config_peers_exclude_self_and_ports_are_own() -> None:
    validators = _validators(4)
    values = validator_config(validators[1], validators, timeout_commit="300ms", app="planet")
    peers = values["p2p"]["persistent_peers"]
    assert isinstance(peers, str)
    assert peers.split(",") == [validators[i].p2p_address for i in (0, 2, 3)]
    assert values[""]["proxy_app"] == "tcp://127.0.0.1:27012"
    assert values["rpc"]["laddr"] == "tcp://127.0.0.1:27011"
    assert values["p2p"]["laddr"] == "tcp://127.0.0.1:27010"
    assert values["p2p"]["pex"] is False
    assert values["consensus"]["timeout_commit"] == "300ms"


def test_configure_genesis_enables_vote_extensions_as_string_and_sets_app_state() -> None:
    genesis = {
        "chain_id": "chain-x",
        "consensus_params": {"abci": {"vote_extensions_enable_height": "0"}},
        "validators": [{"address": "AA"}],
    }
    state = app_state({"AA": "0x" + "11" * 20}, epoch_length=5)
    out = configure_genesis(genesis, chain_id="planet-committee", state=state)
    assert out["consensus_params"]["abci"]["vote_extensions_enable_height"] == "1"
    assert out["chain_id"] == "planet-committee"
    assert out["app_state"] == state
    assert out["validators"] == genesis["validators"]
    assert genesis["chain_id"] == "chain-x"  # the input is not modified


def test_init_options_bad_values_raise_usage_error(tmp_path: Path) -> None:
    for options in (
        InitOptions(directory=tmp_path, validators=0),
        InitOptions(directory=tmp_path, base_port=65530),
        InitOptions(directory=tmp_path, timeout_commit="fast"),
        InitOptions(directory=tmp_path, app="redis"),
    ):
        with pytest.raises(UsageError):
            init_network(options)


def test_find_cometbft_missing_binary_hints_setup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PLANET_COMETBFT", str(tmp_path / "nope"))
    with pytest.raises(ConfigError) as raised:
        find_cometbft()
    assert "deploy/setup.sh" in (raised.value.hint or "")


def test_load_network_uninitialised_dir_hints_init(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as raised:
        load_network(tmp_path)
    assert "planet committee init" in (raised.value.hint or "")


@pytest.mark.integration
def test_init_network_real_testnet_distinct_ports_same_genesis_and_keys(tmp_path: Path) -> None:
    network = init_network(
        InitOptions(directory=tmp_path / "net", validators=4, base_port=27900, epoch_length=7)
    )
    ports = [
        p for v in network.validators for p in (v.p2p_port, v.rpc_port, v.abci_port, v.pprof_port)
    ]
    assert len(set(ports)) == 16 and all(27900 <= p < 28000 for p in ports)
    genesis_texts = {
        (Path(v.home) / "config" / "genesis.json").read_text() for v in network.validators
    }
    assert len(genesis_texts) == 1
    genesis = json.loads(genesis_texts.pop())
    assert genesis["consensus_params"]["abci"]["vote_extensions_enable_height"] == "1"
    assert genesis["app_state"]["epoch_length"] == 7
    assert genesis["app_state"]["validators"] == {
        v.validator_address: v.operator_address for v in network.validators
    }
    assert {v["address"] for v in genesis["validators"]} == set(genesis["app_state"]["validators"])
    cometbft = str(find_cometbft())
    for validator in network.validators:
        shown = subprocess.run(
            [cometbft, "show-node-id", "--home", validator.home],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert shown == validator.node_id
        key_path = Path(validator.home) / "config" / OPERATOR_KEY_FILE
        assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
        from eth_account import Account

        assert Account.from_key(read_operator_key(key_path)).address == (validator.operator_address)
        config = (Path(validator.home) / "config" / "config.toml").read_text()
        assert f'laddr = "tcp://127.0.0.1:{validator.rpc_port}"' in config
        assert "pex = false" in config
    assert load_network(tmp_path / "net") == network

    with pytest.raises(UsageError) as raised:
        init_network(InitOptions(directory=tmp_path / "net"))
    assert "--force" in (raised.value.hint or "")
    again = init_network(InitOptions(directory=tmp_path / "net", base_port=27900, force=True))
    assert again.validators[0].node_id != network.validators[0].node_id


def test_app_state_is_accepted_by_the_app_genesis_reader() -> None:
    from abci_app.genesis import Genesis

    operators = {"D2E4ED0DA213155A3FAE0571D265CB7FD205174E": "0x" + "ab" * 20}
    state = app_state(operators, epoch_length=9, committee_address="0x" + "cd" * 20)
    genesis = Genesis.parse(json.dumps(state).encode())
    assert genesis.epoch_length == 9
    assert genesis.operators == operators
    assert genesis.evm_chain_id == DEFAULT_EVM_CHAIN_ID
    assert genesis.committee_address == "0x" + "cd" * 20


def _network(directory: Path) -> Network:
    return Network(
        dir=str(directory),
        chain_id="c",
        app="planet",
        base_port=27000,
        timeout_commit="300ms",
        epoch_length=5,
        validators=tuple(
            Validator(**{**v.__dict__, "home": str(directory / f"node{v.index}")})
            for v in _validators(2)
        ),
    )


def test_read_pid_foreign_process_is_not_ours(tmp_path: Path) -> None:
    network = _network(tmp_path)
    network.pid_path("app", 0).parent.mkdir(parents=True)
    network.pid_path("app", 0).write_text(f"{os.getpid()}\n")  # alive, but not validator 0's
    network.pid_path("cometbft", 1).write_text("999999999\n")  # no such process
    assert read_pid(network, "app", 0) is None
    assert read_pid(network, "cometbft", 1) is None
    assert running_processes(network) == {}
    assert stop_network(network) == []  # idempotent, and kills nothing foreign
    assert not network.pid_path("app", 0).exists()


def test_cli_status_uninitialised_dir_exits_2_with_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from planet.main import main

    status = main(["committee", "status", "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2
    assert "no committee network" in err
    assert "hint: create one: `planet committee init" in err


def test_log_tail_shows_only_the_latest_start(tmp_path: Path) -> None:
    log = tmp_path / "app0.log"
    log.write_text(
        f"\n{START_MARKER}t1: app\nold failure\n\n{START_MARKER}t2: app\nnew line 1\nnew line 2\n"
    )
    assert log_tail(log) == "new line 1\nnew line 2"
    assert log_tail(tmp_path / "missing.log") == "(no log)"
