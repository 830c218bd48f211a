"""`planet devnet` edges that need no processes: nothing running, bad sizes, the argv shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.devnet.plan import read_state
from deploy.devnet.processes import argv_tail
from deploy.devnet.status import running
from planet import main as cli

pytestmark = pytest.mark.unit


def test_devnet_status_and_down_without_a_devnet(tmp_path: Path, capsys) -> None:
    assert cli.main(["devnet", "status", "--home", str(tmp_path)]) == 0
    assert "no devnet" in capsys.readouterr().out
    assert cli.main(["devnet", "status", "--json", "--home", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "absent"
    for _ in range(2):  # idempotent
        assert cli.main(["devnet", "down", "--home", str(tmp_path)]) == 0
        assert "no devnet was running" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--validators", "0", "--validators must be 1..16"),
        ("--nodes", "10", "--nodes must be 1..9"),
        ("--verifiers", "5", "--verifiers must be 0 to --validators (4)"),
        ("--verifiers", "-1", "--verifiers must be 0 to --validators (4)"),
        ("--credit-positions", "-1", "--credit-positions must be 0 (free) or a positive count"),
        ("--gateway-node-cooldown-s", "-1", "--gateway-node-cooldown-s must be 0..3600 seconds"),
        ("--verifier-challenges", "-1", "--verifier-challenges must be 0..64"),
    ],
)
def test_devnet_up_bad_sizes_are_usage_errors_before_anything_starts(
    tmp_path: Path, capsys, flag: str, value: str, message: str
) -> None:
    assert cli.main(["devnet", "up", flag, value, "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err and "Traceback" not in err
    assert not (tmp_path / "devnet").exists()


def test_devnet_state_of_a_dead_devnet_is_not_running(tmp_path: Path) -> None:
    directory = tmp_path / "devnet"
    directory.mkdir()
    (directory / "devnet.json").write_text(json.dumps({"pids": {"anvil": 999_999_999}}))
    state = read_state(directory)
    assert state is not None and not running(state)
    (directory / "devnet.json").write_text("{not json")
    assert read_state(directory) is None


def test_devnet_failed_command_is_shown_as_typed() -> None:
    argv = ["/usr/bin/python3", "-m", "planet", "join", "--shard", "1"]
    assert argv_tail(argv) == ["planet", "join", "--shard", "1"]


def test_devnet_verifiers_default_to_every_validator_and_cheat_nodes_join_last() -> None:
    """Every validator runs a verifier unless told otherwise (reputation and verdicts need the
    reports of ≥ 2/3 of the power); `--cheat-node` nodes are joined after the honest ones, by
    the test entry point that wraps `planet join` (the product has no cheat flag)."""
    from deploy.devnet.operators import _join_argv
    from deploy.devnet.plan import CHEAT_JOIN_MODULE, DevnetOptions

    options = DevnetOptions(home=Path("/x"), validators=4, nodes=3, cheat_nodes=("silent",))
    assert options.verifier_count == 4 and options.all_nodes == 4
    assert DevnetOptions(home=Path("/x"), verifiers=0).verifier_count == 0
    honest = _join_argv(options, 2)("join", "--shard", "2")
    assert argv_tail(honest) == ["planet", "join", "--shard", "2"]
    cheat = _join_argv(options, 3)("join", "--shard", "0")
    assert cheat[1:] == ["-m", CHEAT_JOIN_MODULE, "--cheat", "silent", "join", "--shard", "0"]


def test_devnet_cheat_node_without_the_gateway_is_a_usage_error(tmp_path: Path, capsys) -> None:
    argv = ["devnet", "up", "--cheat-node", "silent", "--no-gateway", "--home", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "error: --cheat-node needs the gateway" in capsys.readouterr().err


def test_cheating_join_refuses_other_commands_and_bad_modes(capsys) -> None:
    from tests.doubles import cheating_join

    assert cheating_join.main(["--cheat", "silent", "node", "serve"]) == 2
    assert "only `join` can cheat" in capsys.readouterr().err
    assert cheating_join.main(["--cheat", "lazy", "join"]) != 0
    assert "unknown cheat mode" in capsys.readouterr().err


def test_devnet_status_shows_each_verifier_and_its_findings_url(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deploy.devnet.status as devnet_status

    report = {
        "status": "up", "running": True, "dir": str(tmp_path), "evm_rpc": "http://127.0.0.1:8545",
        "processes": {"anvil": True},
        "verifiers": [
            {"validator": 0, "alive": True, "findings_url": "http://127.0.0.1:8700"},
            {"validator": 1, "alive": False, "findings_url": None},
        ],
    }  # fmt: skip
    monkeypatch.setattr(devnet_status, "status", lambda home: report)
    assert cli.main(["devnet", "status", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "verifier of validator0: up, findings at http://127.0.0.1:8700" in out
    assert "verifier of validator1: DOWN, findings URL not on chain yet" in out


def test_consensus_public_key_is_read_from_the_validator_home(tmp_path: Path) -> None:
    import base64

    from nacl.signing import SigningKey

    from deploy.devnet.status import consensus_public_key

    key = SigningKey(b"\x07" * 32)
    public = key.verify_key.encode()
    (tmp_path / "config").mkdir()
    record = {"pub_key": {"type": "tendermint/PubKeyEd25519",
                          "value": base64.b64encode(public).decode()}}  # fmt: skip
    (tmp_path / "config" / "priv_validator_key.json").write_text(json.dumps(record))
    assert consensus_public_key(tmp_path) == public.hex()
    assert consensus_public_key(tmp_path / "absent") is None


def test_devnet_nodes_charge_credits_and_the_gateway_pays_them_buying_from_every_validator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every compute node joins charging a credit per DEVNET_CREDIT_POSITIONS (64) positions,
    and the gateway starts with its credit file and its top-up buying from every validator —
    however many verifiers run (`--verifiers 0` too): the validators' stake watchers publish
    the keys credits are signed with. `--credit-positions 0`: free nodes, nothing bought."""
    from deploy.devnet import operators, services
    from deploy.devnet.hosts import Placement
    from deploy.devnet.plan import DEVNET_CREDIT_POSITIONS, DevnetOptions

    assert DEVNET_CREDIT_POSITIONS == 64 == DevnetOptions(home=tmp_path).node_price
    for verifiers in (0, 2, 3):
        assert DevnetOptions(home=tmp_path, verifiers=verifiers).node_price == 64
    assert DevnetOptions(home=tmp_path, verifiers=0, credit_positions=8).node_price == 8
    assert DevnetOptions(home=tmp_path, credit_positions=0).node_price == 0
    started: dict[str, list[list[str]]] = {}

    def run_parallel(commands: list, timeout_s: float, progress: object, step: str) -> None:
        started[step] = [argv for _, argv, _ in commands]

    monkeypatch.setattr(operators, "run_parallel", run_parallel)
    monkeypatch.setattr(operators, "read_joined", lambda run: None)
    monkeypatch.setattr(operators, "write_state", lambda *a: None)
    monkeypatch.setattr(services, "write_state", lambda *a: None)
    monkeypatch.setattr(services, "gateway_identity", lambda *a: ("k", "0x"))
    monkeypatch.setattr(services, "fund_gateway_credits", lambda *a: None)
    monkeypatch.setattr(services, "spawn", lambda argv, log: started.setdefault("gw", [argv]) and 1)
    rpcs = ["http://127.0.0.1:27001", "http://127.0.0.1:27011"]
    state = {
        "password_file": "pw", "shards": 3, "manifest": "m.json", "pids": {},
        "evm_rpc": "http://127.0.0.1:8545", "deployment": "d.json", "committee_rpc": rpcs,
    }  # fmt: skip
    options = DevnetOptions(home=tmp_path, nodes=2, verifiers=0)
    place = Placement.from_state({})
    operators.run_operator_commands(
        options, state, [tmp_path / "n0", tmp_path / "n1"], place, lambda _: None
    )
    for argv in started["planet join"]:
        assert argv[argv.index("--credit-positions") + 1] == "64"
    services.start_gateway(options, state, place, lambda _: None)
    [gateway] = started["gw"]
    assert gateway[gateway.index("--credits-file") + 1] == state["gateway_credits"]
    assert [gateway[i + 1] for i, a in enumerate(gateway) if a == "--validator-rpc"] == rpcs
    assert int(gateway[gateway.index("--top-up") + 1]) > 0
    assert "--top-up-below" in gateway and "--top-up" in gateway
    free = DevnetOptions(home=tmp_path, nodes=2, credit_positions=0)
    started.clear()
    services.start_gateway(free, state, place, lambda _: None)
    [gateway] = started["gw"]
    assert gateway[gateway.index("--top-up") + 1] == "0" and "--validator-rpc" not in gateway


def test_devnet_passes_the_gateway_cooldown_and_the_verifiers_challenges_only_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--gateway-node-cooldown-s S` reaches the gateway as `--node-cooldown-s S` and
    `--verifier-challenges 0` each verifier as `--challenges-per-epoch 0 --sampled-per-epoch 0`
    (issue 41); unset, both keep their own defaults (no flag passed)."""
    from types import SimpleNamespace

    from deploy.devnet import services
    from deploy.devnet.hosts import Placement
    from deploy.devnet.plan import DevnetOptions

    spawned: list[list[str]] = []
    monkeypatch.setattr(services, "write_state", lambda *a: None)
    monkeypatch.setattr(services, "gateway_identity", lambda *a: ("k", "0x"))
    monkeypatch.setattr(services, "spawn", lambda argv, log: spawned.append(argv) or 1)
    monkeypatch.setattr(services, "rpc_call", lambda *a: None)
    monkeypatch.setattr(services, "free_ports", lambda n, low, high: list(range(low, low + n)))
    monkeypatch.setattr(
        services, "create_dev_wallet", lambda path, pw: SimpleNamespace(address="0x" + "11" * 20)
    )
    (tmp_path / "pw").write_text("pw")
    state = {
        "password_file": str(tmp_path / "pw"), "shards": 3, "manifest": "m.json", "pids": {},
        "evm_rpc": "http://127.0.0.1:8545", "deployment": "d.json",
        "committee_rpc": ["http://127.0.0.1:27001"], "gateway_url": "http://127.0.0.1:8000",
    }  # fmt: skip
    validator = SimpleNamespace(
        index=0, name="validator0", home=str(tmp_path / "v0"), rpc_url="http://127.0.0.1:27001"
    )
    network = SimpleNamespace(validators=[validator])
    place = Placement.from_state({})

    def started(options: DevnetOptions) -> tuple[list[str], list[str]]:
        spawned.clear()
        services.start_gateway(options, state, place, lambda _: None)
        services.start_verifiers(options, state, network, place, lambda _: None)  # type: ignore[arg-type]
        gateway, verifier = spawned
        return gateway, verifier

    gateway, verifier = started(DevnetOptions(home=tmp_path, credit_positions=0))
    assert "--node-cooldown-s" not in gateway
    assert "--challenges-per-epoch" not in verifier and "--sampled-per-epoch" not in verifier
    short = DevnetOptions(
        home=tmp_path, credit_positions=0, gateway_node_cooldown_s=3, verifier_challenges=0
    )
    gateway, verifier = started(short)
    assert gateway[gateway.index("--node-cooldown-s") + 1] == "3"
    assert verifier[verifier.index("--challenges-per-epoch") + 1] == "0"
    assert verifier[verifier.index("--sampled-per-epoch") + 1] == "0"
    gateway, verifier = started(
        DevnetOptions(home=tmp_path, credit_positions=0, verifier_challenges=2)
    )
    assert verifier[verifier.index("--challenges-per-epoch") + 1] == "2"
    assert "--sampled-per-epoch" not in verifier
