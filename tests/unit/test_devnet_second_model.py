"""The devnet's second model (issue 44, deploy/devnet/second_model.py), without starting one:
when it is served, node0 joining as a multi-model host, the seat's home and port, and the
gateway started with both models."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.devnet import services
from deploy.devnet.hosts import NODE_PORT, SEAT_PORT, Placement, exposed_ports
from deploy.devnet.plan import DevnetOptions
from deploy.devnet.second_model import HOST_MEMORY_BUDGET_MB, host_join_args, seat_homes

pytestmark = pytest.mark.unit


def test_every_devnet_serves_a_second_model_unless_its_first_is_that_set(tmp_path: Path) -> None:
    default = DevnetOptions(home=tmp_path)
    assert default.with_second_model and default.shards == 3
    assert seat_homes(default) == [tmp_path / "devnet" / "operators" / "seat0"]
    assert DevnetOptions(home=tmp_path, nodes=2).with_second_model  # a 2-part first model
    assert DevnetOptions(home=tmp_path, nodes=1, quant="none").with_second_model
    # `--nodes 1 --quant int8`: the first model is the 1-part int8 set itself
    assert not DevnetOptions(home=tmp_path, nodes=1).with_second_model
    one = DevnetOptions(home=tmp_path, second_model=False)  # `--one-model`
    assert not one.with_second_model and seat_homes(one) == []


def test_node0_joins_as_a_multi_model_host_and_its_host_exposes_the_seat_port(
    tmp_path: Path,
) -> None:
    options = DevnetOptions(home=tmp_path)
    assert host_join_args(options, 0) == ["--memory-budget-mb", str(HOST_MEMORY_BUDGET_MB)]
    assert host_join_args(options, 1) == [] == host_join_args(options, 2)
    assert host_join_args(DevnetOptions(home=tmp_path, second_model=False), 0) == []
    assert exposed_ports("node0") == (NODE_PORT, SEAT_PORT)
    assert exposed_ports("node1") == (NODE_PORT,)


def test_the_gateway_is_started_with_every_model_the_devnet_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[list[str]] = []
    monkeypatch.setattr(services, "write_state", lambda *a: None)
    monkeypatch.setattr(services, "gateway_identity", lambda *a: ("k", "0x"))
    monkeypatch.setattr(services, "spawn", lambda argv, log: spawned.append(argv) or 1)
    (tmp_path / "pw").write_text("pw")
    state = {
        "password_file": str(tmp_path / "pw"), "manifest": "m3.json", "pids": {},
        "more_manifests": ["m1.json"], "evm_rpc": "http://127.0.0.1:8545",
        "deployment": "d.json", "committee_rpc": ["http://127.0.0.1:27001"],
    }  # fmt: skip
    options = DevnetOptions(home=tmp_path, credit_positions=0)
    services.start_gateway(options, state, Placement.from_state({}), lambda _: None)
    argv = spawned[0]
    manifests = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--manifest"]
    assert manifests == ["m3.json", "m1.json"]


def test_down_takes_the_seats_out_of_their_host_before_the_nodes_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node0's process hosts seat0's seat: both leaving it at once would race on its seats
    file (each a read-modify-write) and could leave the host serving. Every agent stops
    first, then the seats leave, then the nodes stop (a host with its last seat)."""
    from deploy.devnet import down
    from deploy.devnet.plan import write_state

    operators = tmp_path / "devnet" / "operators"
    homes = [operators / name for name in ("node0", "node1", "seat0")]
    state = {"status": "up", "pids": {}, "operators": [str(h) for h in homes],
             "seats": [str(homes[2])]}  # fmt: skip
    (tmp_path / "devnet").mkdir()
    write_state(tmp_path / "devnet", state)
    calls: list[tuple[str, bool]] = []

    def stop_joined(run: Path, *, node: bool = True) -> dict[str, bool]:
        calls.append((run.parent.name, node))
        return {"agent": not node, "node": node}

    monkeypatch.setattr(down, "stop_joined", stop_joined)
    stopped = down.down(tmp_path, progress=lambda _line: None)
    assert set(calls[:3]) == {("node0", False), ("node1", False), ("seat0", False)}
    assert calls[3] == ("seat0", True)  # alone, before any node stops
    assert set(calls[4:]) == {("node0", True), ("node1", True)}
    assert stopped == ["node0", "node1", "seat0"]


def test_a_personal_client_on_the_devnet_serves_every_model_it_registers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`planet gateway serve --personal` with no --manifest, on the running devnet's committee:
    the devnet's models, the first first; --manifest given: those alone."""
    import argparse
    import json

    from node.cli.gateway import _personal_devnet_defaults

    rpc = "http://127.0.0.1:27001"
    (tmp_path / "devnet").mkdir()
    (tmp_path / "devnet" / "devnet.json").write_text(
        json.dumps({
            "status": "up", "evm_rpc": "http://127.0.0.1:8545", "committee_rpc": [rpc],
            "chain_id": 31337, "deployment": str(tmp_path / "d.json"),
            "manifest": "/m/3p/manifest.json", "more_manifests": ["/m/1p/manifest.json"],
        })
    )  # fmt: skip
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    monkeypatch.delenv("PLANET_DEVNET", raising=False)
    args = argparse.Namespace(manifest=None, private_endpoints=False)
    manifests, private = _personal_devnet_defaults(args, rpc)
    assert manifests == (Path("/m/3p/manifest.json"), Path("/m/1p/manifest.json")) and private
    args = argparse.Namespace(manifest=[Path("/x/manifest.json")], private_endpoints=False)
    assert _personal_devnet_defaults(args, rpc)[0] == (Path("/x/manifest.json"),)
