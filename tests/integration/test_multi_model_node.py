"""One node process serves two models (issue 44): a real `planet node host` process starts with
one seat (the 1-part int8 SmolLM2), `planet node add` adds the 2-part int8 set's two shards to
the running process (another model hash: another shard count), a third seat that does not fit
the memory budget is refused by name while the others keep serving, and a question is answered
on each model through the client (CircuitClient over the process's seats).

Both shard sets are in the prepared model cache (~/.cache/planet); one process start (~10 s of
imports on 2 shared cores) plus three int8 shard loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.procs import spawn_logged
from node.server.launcher import free_ports, node_env

pytestmark = pytest.mark.integration

PORTS = (44600, 44700)  # this module's share of the test port range
CAPS = ["--max-cache-mb", "48", "--prefix-cache-mb", "0", "--plaintext-links"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _prepared(parts: int) -> Path:
    from node.model.prepare import prepare  # lazy: torch

    return Path(prepare(parts=parts, quant="int8", progress=lambda _msg: None))


def _seat(manifest: Path, shard: int, port: int, *extra: str) -> list[str]:
    return ["--manifest", str(manifest), "--shard", str(shard), "--port", str(port), *CAPS, *extra]


def _status(seats: Path) -> dict:
    try:
        return json.loads(seats.with_name(seats.name + ".status.json").read_text())
    except (OSError, ValueError):
        return {}


def _add(seats: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planet", "node", "add", "--seats", str(seats), "--", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **node_env()},
    )


async def _ask(manifest: Path, hops: list[Hop]) -> str:
    m = Manifest.load(manifest)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.chat_ids(QUESTION)
    async with aiohttp.ClientSession() as http:
        await check_circuit(http, hops, m.model_hash, m.total_layers)
        async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
            tokens = [t async for t in client.generate(head, ids, max_new_tokens=12)]
    return head.tokenizer.decode(tokens)


def test_one_process_serves_two_models_and_refuses_a_seat_past_its_budget(tmp_path):
    one_part, two_part = _prepared(1), _prepared(2)
    models = {Manifest.load(one_part).model_hash, Manifest.load(two_part).model_hash}
    assert len(models) == 2
    weights = sum(e.size for m in (one_part, two_part) for e in Manifest.load(m).shards)
    budget_mb = (weights + 3 * 48 * 1024**2) // 1024**2 + 8  # the three seats, not a fourth
    p0, p1, p2, p3 = free_ports(4, *PORTS)
    seats = tmp_path / "seats.json"
    seats.write_text(json.dumps({"seats": [{"argv": _seat(one_part, 0, p0)}]}))
    host = spawn_logged(
        [sys.executable, "-m", "planet", "node", "host", "--seats", str(seats)]
        + ["--memory-budget-mb", str(budget_mb), "--threads", "1"],
        tmp_path / "host.log",
        env=node_env(),
    )
    try:
        deadline = time.monotonic() + 120
        while _status(seats).get("pass", 0) < 1 and time.monotonic() < deadline:
            assert host.poll() is None, (tmp_path / "host.log").read_text()[-2000:]
            time.sleep(0.2)
        assert [s["state"] for s in _status(seats)["seats"]] == ["serving"]

        # the second model joins the running process: its two shards, shard 0 forwarding to 1
        hop = f"http://127.0.0.1:{p2}"
        added = _add(seats, _seat(two_part, 1, p2))
        assert added.returncode == 0, added.stderr
        added = _add(seats, _seat(two_part, 0, p1, "--next-hops", hop))
        assert added.returncode == 0, added.stderr
        assert f"of {Manifest.load(two_part).model_hash} at http://127.0.0.1:{p1}" in added.stdout

        # a fourth seat (the 1-part model again) does not fit: refused by name, nothing stops
        refused = _add(seats, _seat(one_part, 0, p3))
        assert refused.returncode == 6, refused.stderr
        assert "memory_budget_exceeded" in refused.stderr
        assert Manifest.load(one_part).model_hash in refused.stderr
        status = _status(seats)
        assert status["pid"] == host.pid and host.poll() is None
        assert [(s["port"], s["state"]) for s in status["seats"]] == [
            (p0, "serving"),
            (p2, "serving"),
            (p1, "serving"),
            (p3, "refused"),
        ]
        assert status["used_bytes"] <= status["budget_bytes"]

        answers = asyncio.run(
            _gather(
                (one_part, [Hop(url=f"http://127.0.0.1:{p0}", shard=0)]),
                (
                    two_part,
                    [Hop(url=f"http://127.0.0.1:{p1}", shard=0), Hop(url=hop, shard=1)],
                ),
            )
        )
        for answer in answers:
            assert "Paris" in answer, answers
    finally:
        host.terminate()
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
    assert "shard 0 layers" in (tmp_path / "host.log").read_text()


async def _gather(*asks: tuple[Path, list[Hop]]) -> list[str]:
    return [await _ask(manifest, hops) for manifest, hops in asks]
