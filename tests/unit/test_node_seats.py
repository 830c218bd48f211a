"""A multi-model node's seats (node/server/seats.py, node/server/host.py): the memory budget
admits seats until full and refuses the next by name; the seats file is parsed or refused; the
host starts each listed seat once (a pass adds new ones and leaves running ones alone), refuses
a seat past the budget before loading it, keeps serving the others, and writes its status.
The seats' apps here are in-process fakes on loopback (the real shard apps run in
tests/integration/test_multi_model_node.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.ports import ephemeral_port
from node.cli.seats import parse_seat
from node.server.config import ServerConfig
from node.server.host import SeatHost
from node.server.seats import (
    BadSeatsFile,
    MemoryBudget,
    MemoryBudgetExceeded,
    SeatSpec,
    append_seat,
    read_seats,
    remove_seat,
    resident_weight_bytes,
    seat_cost,
    status_path,
)
from protocol.errors import ConfigError, IntegrityError, UsageError

pytestmark = pytest.mark.unit

MIB = 1024**2
MODEL_A = "sha256:" + "a" * 64
MODEL_B = "sha256:" + "b" * 64


# --- the budget ---------------------------------------------------------------------------------


def test_budget_admits_until_full_then_refuses_naming_the_model_and_holds_nothing_for_it():
    budget = MemoryBudget(300 * MIB)
    budget.admit(1, seat_cost(MODEL_A, 0, 100 * MIB, 50 * MIB))
    budget.admit(2, seat_cost(MODEL_B, 1, 100 * MIB, 40 * MIB))
    assert budget.used() == 290 * MIB and budget.free() == 10 * MIB
    with pytest.raises(MemoryBudgetExceeded) as refused:
        budget.admit(3, seat_cost(MODEL_B, 0, 5 * MIB, 6 * MIB))
    assert refused.value.code == "memory_budget_exceeded"
    assert f"shard 0 of {MODEL_B}" in refused.value.message
    assert "10.0 MiB of 300.0 MiB left" in refused.value.message
    assert set(budget.held) == {1, 2}
    budget.release(2)
    budget.admit(3, seat_cost(MODEL_B, 0, 5 * MIB, 6 * MIB))  # fits once a seat went
    assert budget.used() == 161 * MIB


def test_budget_zero_is_no_budget_and_one_port_holds_one_seat():
    budget = MemoryBudget(0)
    budget.admit(1, seat_cost(MODEL_A, 0, 10**12, 0))
    with pytest.raises(ConfigError, match="port 1 already has a seat"):
        budget.admit(1, seat_cost(MODEL_B, 0, 1, 0))
    with pytest.raises(ConfigError):
        MemoryBudget(-1)


# --- the seats file -----------------------------------------------------------------------------


def test_seats_file_round_trip_and_append(tmp_path: Path):
    path = tmp_path / "seats.json"
    append_seat(path, SeatSpec(("--manifest", "m1", "--shard", "0")))
    append_seat(path, SeatSpec(("--manifest", "m2", "--shard", "1")))
    assert read_seats(path) == [
        SeatSpec(("--manifest", "m1", "--shard", "0")),
        SeatSpec(("--manifest", "m2", "--shard", "1")),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"seats": {}}',
        '{"seats": [], "extra": 1}',
        '{"seats": [{"argv": []}]}',
        '{"seats": [{"argv": ["--shard", 0]}]}',
        '{"seats": [{"argv": ["x"], "more": 1}]}',
        '{"seats": [["--shard"]]}',
        json.dumps({"seats": [{"argv": ["x"]}] * 65}),
        json.dumps({"seats": [{"argv": ["x" * 5000]}]}),
    ],
)
def test_a_malformed_seats_file_is_refused_by_name(tmp_path: Path, text: str):
    path = tmp_path / "seats.json"
    path.write_text(text)
    with pytest.raises(BadSeatsFile) as refused:
        read_seats(path)
    assert refused.value.code == "bad_seats_file"


def test_a_seat_takes_serve_arguments_and_refuses_others(tmp_path: Path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    config, key = parse_seat(
        ("--manifest", str(manifest), "--shard", "2", "--port", "1234", "--plaintext-links")
    )
    assert (config.shard_id, config.port, key) == (2, 1234, None)
    with pytest.raises(UsageError, match="seat: "):
        parse_seat(("--shard", "2"))  # no manifest
    with pytest.raises(UsageError, match="seat: "):
        parse_seat(("--manifest", str(manifest), "--shard", "x"))
    with pytest.raises(UsageError, match="node key"):
        parse_seat(("--manifest", str(manifest), "--shard", "0"))  # neither key nor plaintext


# --- the host -----------------------------------------------------------------------------------

# manifest name -> (model, weight bytes); the fake parse takes `--manifest NAME --shard K --port P`
MODELS = {"a": (MODEL_A, 100 * MIB), "b": (MODEL_B, 60 * MIB)}


def _parse(argv: tuple[str, ...]) -> tuple[ServerConfig, Any]:
    args = dict(zip(argv[::2], argv[1::2], strict=True))
    if "--shard" not in args:
        raise UsageError("seat: the following arguments are required: --shard")
    config = ServerConfig(
        manifest_path=Path(args["--manifest"]),
        shard_id=int(args["--shard"]),
        port=int(args["--port"]),
        max_cache_bytes=10 * MIB,
        prefix_cache_bytes=0,
        plaintext_links=True,
    )
    return config, None


def _cost(config: ServerConfig) -> Any:
    model, weights = MODELS[config.manifest_path.name]
    return seat_cost(model, config.shard_id, weights, config.max_cache_bytes)


class Loads:
    """The fake shard loader: an app answering /info with its model; `fail` names a manifest
    whose load fails (a corrupted shard)."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, int]] = []
        self.fail: str | None = None

    def __call__(self, config: ServerConfig, _key: Any) -> tuple[web.Application, None, Any]:
        name = config.manifest_path.name
        if name == self.fail:
            raise IntegrityError(f"shard {config.shard_id} of {name}: hash mismatch")
        self.loaded.append((name, config.shard_id))
        model = MODELS[name][0]

        async def info(_request: web.Request) -> web.Response:
            return web.json_response({"model_hash": model, "shard": config.shard_id})

        app = web.Application()
        app.router.add_get("/info", info)
        return app, None, None


def _seat(name: str, shard: int, port: int) -> SeatSpec:
    return SeatSpec(("--manifest", name, "--shard", str(shard), "--port", str(port)))


async def _info(port: int) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/info") as answer,
    ):
        return await answer.json()


async def test_host_adds_a_second_model_to_the_running_process_and_refuses_past_the_budget(
    tmp_path: Path,
):
    seats = tmp_path / "seats.json"
    loads = Loads()
    host = SeatHost(seats, MemoryBudget(200 * MIB), _parse, loads, cost=_cost)
    pa, pb, pc = ephemeral_port(), ephemeral_port(), ephemeral_port()
    append_seat(seats, _seat("a", 0, pa))
    try:
        first = await host.reload()
        assert [(e["port"], e["state"], e["model"]) for e in first] == [(pa, "serving", MODEL_A)]
        append_seat(seats, _seat("b", 1, pb))  # another model: 70 MiB, fits (110 + 70)
        append_seat(seats, _seat("b", 0, pc))  # 70 MiB more does not (20 left)
        second = await host.reload()
        assert [(e["port"], e["state"]) for e in second] == [
            (pa, "serving"),
            (pb, "serving"),
            (pc, "refused"),
        ]
        assert second[2]["code"] == "memory_budget_exceeded"
        assert f"shard 0 of {MODEL_B}" in second[2]["message"]
        assert loads.loaded == [("a", 0), ("b", 1)]  # a loaded once; the refused seat never
        assert (await _info(pa))["model_hash"] == MODEL_A
        assert (await _info(pb)) == {"model_hash": MODEL_B, "shard": 1}
        status = json.loads(status_path(seats).read_text())
        assert status["pass"] == 2 and status["used_bytes"] == 180 * MIB
        assert status["budget_bytes"] == 200 * MIB and status["seats"] == second
    finally:
        await host.close()
    assert host.running == {} and host.budget.used() == 0


async def test_a_seat_that_fails_to_load_or_parse_is_refused_and_frees_its_budget(tmp_path: Path):
    seats = tmp_path / "seats.json"
    loads = Loads()
    loads.fail = "b"
    host = SeatHost(seats, MemoryBudget(200 * MIB), _parse, loads, cost=_cost)
    pa, pb = ephemeral_port(), ephemeral_port()
    append_seat(seats, _seat("b", 0, pb))
    append_seat(seats, SeatSpec(("--manifest", "a")))  # unparsable: no shard
    append_seat(seats, _seat("a", 0, pa))
    try:
        entries = await host.reload()
        assert [e["state"] for e in entries] == ["refused", "refused", "serving"]
        assert entries[1]["code"] == "usage" and entries[1]["argv"] == ["--manifest", "a"]
        assert entries[1]["port"] is None
        assert entries[0]["code"] == "integrity" and "hash mismatch" in entries[0]["message"]
        assert host.budget.used() == 110 * MIB  # only the seat that serves
        loads.fail = None  # the shard is fixed: the next pass starts it
        again = await host.reload()
        assert [e["state"] for e in again] == ["serving", "refused", "serving"]
    finally:
        await host.close()


async def test_a_broken_seats_file_keeps_the_running_seats(tmp_path: Path):
    seats = tmp_path / "seats.json"
    host = SeatHost(seats, MemoryBudget(0), _parse, Loads(), cost=_cost)
    pa = ephemeral_port()
    append_seat(seats, _seat("a", 0, pa))
    try:
        await host.reload()
        seats.write_text("{")
        entries = await host.reload()
        assert entries[0]["code"] == "bad_seats_file"
        assert (await _info(pa))["model_hash"] == MODEL_A
    finally:
        await host.close()


# --- planet join / leave of a seat --------------------------------------------------------------


def test_a_seat_names_its_port_and_leaves_the_file_by_it(tmp_path: Path):
    path = tmp_path / "seats.json"
    append_seat(path, _seat("a", 0, 1001))
    append_seat(path, _seat("b", 1, 1002))
    assert [seat.port() for seat in read_seats(path)] == [1001, 1002]
    assert SeatSpec(("--port", "x")).port() is None and SeatSpec(("--shard", "0")).port() is None
    assert remove_seat(path, 1001) and not remove_seat(path, 1001)
    assert read_seats(path) == [_seat("b", 1, 1002)]


def test_join_builds_the_seat_as_it_starts_a_node(tmp_path: Path):
    from node.agent.launch import seat_of
    from node.agent.node_host import NodeLaunch

    launch = NodeLaunch(tmp_path / "m.json", "10.0.0.5", ("--max-sessions", "16"), tmp_path / "k")
    assert seat_of(launch, 2, 18102).argv == (
        "--manifest", str(tmp_path / "m.json"), "--shard", "2", "--port", "18102",
        "--host", "10.0.0.5", "--node-key", str(tmp_path / "k"), "--max-sessions", "16",
    )  # fmt: skip


def _join_args(**kw: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(**{"memory_budget_mb": None, "into": None, "rebalance": None, **kw})


def test_join_refuses_host_flags_that_do_not_go_together(tmp_path: Path):
    from node.cli.operator import _host_seats

    run = tmp_path / "me" / "run"
    assert _host_seats(_join_args(), run) is None
    assert _host_seats(_join_args(memory_budget_mb=512), run) is None
    for bad, words in [
        (_join_args(memory_budget_mb=0), "--memory-budget-mb must be"),
        (_join_args(memory_budget_mb=512, into=tmp_path), "pick one"),
        (_join_args(memory_budget_mb=512, rebalance=True), "does not rebalance"),
        (_join_args(into=tmp_path / "other"), "runs no multi-model host"),
    ]:
        with pytest.raises(UsageError, match=words):
            _host_seats(bad, run)


def test_join_into_a_running_host_finds_its_seats_file(tmp_path: Path):
    import os

    from node.cli.operator import _host_seats

    other = tmp_path / "other" / "run"
    other.mkdir(parents=True)
    (other / "seats.json.status.json").write_text(json.dumps({"pid": os.getpid(), "pass": 1}))
    assert _host_seats(_join_args(into=tmp_path / "other"), tmp_path / "me" / "run") == (
        other / "seats.json"
    )
    with pytest.raises(UsageError, match="this home itself"):
        _host_seats(_join_args(into=tmp_path / "other"), other)


def test_leave_takes_the_seat_out_even_when_the_host_is_gone(tmp_path: Path):
    from node.agent.launch import JOINED_FILE, stop_joined

    seats = tmp_path / "host" / "run" / "seats.json"
    seats.parent.mkdir(parents=True)
    append_seat(seats, _seat("a", 0, 1001))
    append_seat(seats, _seat("b", 0, 1002))
    run = tmp_path / "me" / "run"
    run.mkdir(parents=True)
    dead = 2**22 + 17  # above pid_max's default: no such process
    joined = {
        "shard": 0, "port": 1002, "endpoint": "https://127.0.0.1:1002", "model": MODEL_B,
        "manifest": "m", "node_pid": dead, "agent_pid": dead, "node_key": "k" * 64,
        "node_log": "l", "agent_log": "l", "seats": str(seats),
    }  # fmt: skip
    (run / JOINED_FILE).write_text(json.dumps(joined))
    assert stop_joined(run) == {"agent": False, "node": False}
    assert read_seats(seats) == [_seat("a", 0, 1001)]  # the other home's seat stays
    assert not (run / JOINED_FILE).exists()


async def test_a_seat_taken_out_of_the_file_stops_and_frees_its_budget(tmp_path: Path):
    seats = tmp_path / "seats.json"
    host = SeatHost(seats, MemoryBudget(200 * MIB), _parse, Loads(), cost=_cost)
    pa, pb = ephemeral_port(), ephemeral_port()
    append_seat(seats, _seat("a", 0, pa))
    append_seat(seats, _seat("b", 0, pb))
    try:
        await host.reload()
        assert remove_seat(seats, pa)
        entries = await host.reload()
        assert [e["port"] for e in entries] == [pb] and set(host.running) == {pb}
        assert host.budget.used() == 70 * MIB
        with pytest.raises(aiohttp.ClientConnectionError):
            await _info(pa)
        assert (await _info(pb))["model_hash"] == MODEL_B
    finally:
        await host.close()


def test_a_quantized_shard_counts_as_loaded_not_as_its_file():
    assert resident_weight_bytes(100, "none") == 100
    assert resident_weight_bytes(100, "int8") == 600  # de-quantized to fp32 at load on CPU
    assert resident_weight_bytes(100, "int4") == 1700
    assert resident_weight_bytes(100, "fp4") == 1700  # unknown: the largest factor


async def test_a_seat_whose_key_does_not_open_is_refused_by_the_key_error(
    tmp_path: Path, monkeypatch
):
    """`planet join --into` from a home with another password: the host's refusal names the
    key's own error for that seat's port (what `planet node add` / `join` then print)."""
    from node.keys import PASSWORD_ENV, create_node_key
    from node.server.seats import SeatRefused, serving_entry

    key = tmp_path / "node_key.json"
    create_node_key(key, "the joining home's password")
    monkeypatch.setenv(PASSWORD_ENV, "the host's password")
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    seats = tmp_path / "seats.json"
    port = ephemeral_port()
    argv = (
        "--manifest",
        str(manifest),
        "--shard",
        "0",
        "--port",
        str(port),
        "--node-key",
        str(key),
    )
    append_seat(seats, SeatSpec(argv))
    host = SeatHost(seats, MemoryBudget(0), parse_seat, Loads(), cost=_cost)
    try:
        entries = await host.reload()
    finally:
        await host.close()
    assert entries[0]["port"] == port and entries[0]["state"] == "refused"
    with pytest.raises(SeatRefused) as refused:
        serving_entry(json.loads(status_path(seats).read_text()), port)
    assert refused.value.refusal == entries[0]["code"] != "seat_missing"


async def test_a_seat_must_name_its_port_as_the_host_keys_it(tmp_path: Path):
    """The host knows a running seat by the `--port P` of its line (a pass must not take a
    seat written `--port=P` for a new one, or stop it as unlisted)."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    seats = tmp_path / "seats.json"
    port = ephemeral_port()
    plain = ("--manifest", str(manifest), "--shard", "0", "--plaintext-links")
    for argv in [
        (*plain, f"--port={port}"),
        (*plain, "--port", "0"),
        (*plain, "--port", str(port), "--port", "1"),
    ]:
        append_seat(seats, SeatSpec(argv))
    host = SeatHost(seats, MemoryBudget(0), parse_seat, Loads(), cost=_cost)
    try:
        entries = await host.reload()
    finally:
        await host.close()
    assert [(e["state"], e["code"]) for e in entries] == [("refused", "usage")] * 3
    assert "as two words" in entries[0]["message"] and "and then 1" in entries[2]["message"]
