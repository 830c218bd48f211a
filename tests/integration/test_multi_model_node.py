"""One node process serves two models (issue 44), over real processes: the 1-part int8 SmolLM2
set and the 2-part int8 set (another model hash: another shard count), from the prepared model
cache (~/.cache/planet).

Home 1 starts its compute node as a multi-model host with a memory budget (what `planet join
--memory-budget-mb` runs: `launch.start_seat`); the second model's shard 1 is added to the
running process with `planet node add`, its shard 0 as another home's node (what `planet join
--into` runs); a seat past the budget is refused by name while the others keep serving; a
question is answered on each model through the client, over TLS pinned to each seat's own node
key; then each seat leaves (what `planet leave` runs: `launch.leave_seat`), the others keep
serving, and the host stops with its last seat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.ports import ephemeral_port
from node.agent.launch import leave_seat, seat_of, start_seat
from node.agent.node_host import NodeLaunch
from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.keys import PASSWORD_ENV, load_or_create_node_key
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.server.launcher import pid_alive
from node.server.seats import read_seats, read_status, resident_weight_bytes
from planet.main import main

pytestmark = pytest.mark.integration

PASSWORD = "multi-model-test"
CAPS = ("--max-cache-mb", "48", "--prefix-cache-mb", "0")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _prepared(parts: int) -> Path:
    """The int8 SmolLM2 set of `parts` shards: the prepared cache's (harness/gateway_net.py
    reads it the same way), else prepared now."""
    from node.model.prepare import prepare  # lazy: torch
    from node.model.source import models_dir

    cached = models_dir() / f"smollm2-135m-{parts}p-int8" / "manifest.json"
    if cached.is_file():
        return cached
    return Path(prepare(parts=parts, quant="int8", progress=lambda _msg: None))


def _key(home: Path) -> tuple[Path, str]:
    path = home / "node_key.json"
    home.mkdir(parents=True, exist_ok=True)
    return path, load_or_create_node_key(path, PASSWORD).verify_key.encode().hex()


def _add(seats: Path, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`planet node add` (the command itself, in this process: the host is the real process
    under test); its exit status and output."""
    status = main(["node", "add", "--seats", str(seats), "--", *argv])
    out = capsys.readouterr()
    return status, out.out + out.err


async def _ask(manifest: Path, head: ClientHead, hops: list[Hop]) -> str:
    m = Manifest.load(manifest)
    ids = head.chat_ids(QUESTION)
    async with aiohttp.ClientSession() as http:
        await check_circuit(http, hops, m.model_hash, m.total_layers)
        async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
            tokens = [t async for t in client.generate(head, ids, max_new_tokens=8)]
    return head.tokenizer.decode(tokens)


async def _both(*asks: Coroutine[Any, Any, str]) -> list[str]:
    """Both questions at once: the two models' sessions live side by side in the process."""
    return list(await asyncio.gather(*asks))


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_one_process_serves_two_models_and_refuses_a_seat_past_its_budget(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)  # `planet node add` reads the seat's key with it
    one_part, two_part = _prepared(1), _prepared(2)
    model_one, model_two = Manifest.load(one_part).model_hash, Manifest.load(two_part).model_hash
    assert model_one != model_two
    weights = sum(
        resident_weight_bytes(e.size, e.quant)
        for m in (one_part, two_part)
        for e in Manifest.load(m).shards
    )
    budget_mb = (weights + 3 * 48 * 1024**2) // 1024**2 + 8  # the three seats, not a fourth
    p0, p1, p2, p3 = (ephemeral_port() for _ in range(4))
    (key0, pub0), (key1, pub1), (key2, pub2) = (_key(tmp_path / f"h{i}") for i in range(3))
    run1 = tmp_path / "h0" / "run"
    seat0 = seat_of(NodeLaunch(one_part, "127.0.0.1", CAPS, key0), 0, p0)
    pid, _log, seats = start_seat(run1, seat0, PASSWORD, budget_mb, None)
    try:
        # the client's heads load while the host takes the second model
        heads = {m: ClientHead.load(m, device="cpu") for m in (one_part, two_part)}
        code, said = _add(
            seats, seat_of(NodeLaunch(two_part, "127.0.0.1", CAPS, key2), 1, p2).argv, capsys
        )
        assert code == 0, said
        assert f"serving shard 1 of {model_two} at https://127.0.0.1:{p2}" in said
        hops = ("--next-hops", f"https://127.0.0.1:{p2}")
        launch1 = NodeLaunch(two_part, "127.0.0.1", (*CAPS, *hops), key1)
        assert (
            start_seat(tmp_path / "h1" / "run", seat_of(launch1, 0, p1), PASSWORD, None, seats)[0]
            == pid
        )

        # a fourth seat (the 1-part model again) does not fit: refused by name, nothing stops
        code, said = _add(
            seats, seat_of(NodeLaunch(one_part, "127.0.0.1", CAPS, key0), 0, p3).argv, capsys
        )
        assert code == 6, said
        assert "memory_budget_exceeded" in said and f"shard 0 of {model_one}" in said
        assert "taken out of the seats file" in said
        status = read_status(seats)
        assert status["pid"] == pid and pid_alive(pid)
        assert [(s["port"], s["state"]) for s in status["seats"]] == [
            (p0, "serving"),
            (p2, "serving"),
            (p1, "serving"),
            (p3, "refused"),  # the pass that refused it; the file no longer lists it
        ]
        assert [seat.port() for seat in read_seats(seats)] == [p0, p2, p1]
        assert status["used_bytes"] <= status["budget_bytes"] == budget_mb * 1024**2

        answers = asyncio.run(
            _both(
                _ask(one_part, heads[one_part], [Hop(f"https://127.0.0.1:{p0}", 0, pub0)]),
                _ask(
                    two_part,
                    heads[two_part],
                    [
                        Hop(f"https://127.0.0.1:{p1}", 0, pub1),
                        Hop(f"https://127.0.0.1:{p2}", 1, pub2),
                    ],
                ),
            )
        )
        assert all("Paris" in answer for answer in answers), answers

        # seats leave one by one: the others keep serving; the last one stops the process
        assert leave_seat(seats, p0, pid)
        assert not _answers(p0) and _answers(p1) and _answers(p2) and pid_alive(pid)
        assert leave_seat(seats, p1, pid) and leave_seat(seats, p2, pid)
        assert not pid_alive(pid)
    finally:
        if pid_alive(pid):
            import os
            import signal

            os.kill(pid, signal.SIGKILL)
    assert "shard 0 layers 0-30" in (run1 / "node-host.log").read_text()
