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
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.procs import spawn_logged
from harness.ports import ephemeral_port
from node.server.launcher import node_env
from planet.main import main

pytestmark = pytest.mark.integration

CAPS = ["--max-cache-mb", "48", "--prefix-cache-mb", "0", "--plaintext-links"]
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


def _seat(manifest: Path, shard: int, port: int, *extra: str) -> list[str]:
    return ["--manifest", str(manifest), "--shard", str(shard), "--port", str(port), *CAPS, *extra]


def _status(seats: Path) -> dict:
    try:
        return json.loads(seats.with_name(seats.name + ".status.json").read_text())
    except (OSError, ValueError):
        return {}


def _add(seats: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
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


def test_one_process_serves_two_models_and_refuses_a_seat_past_its_budget(tmp_path, capsys):
    one_part, two_part = _prepared(1), _prepared(2)
    models = {Manifest.load(one_part).model_hash, Manifest.load(two_part).model_hash}
    assert len(models) == 2
    weights = sum(e.size for m in (one_part, two_part) for e in Manifest.load(m).shards)
    budget_mb = (weights + 3 * 48 * 1024**2) // 1024**2 + 8  # the three seats, not a fourth
    p0, p1, p2, p3 = (ephemeral_port() for _ in range(4))
    seats = tmp_path / "seats.json"
    seats.write_text(json.dumps({"seats": [{"argv": _seat(one_part, 0, p0)}]}))
    host = spawn_logged(
        [
            sys.executable,
            "-m",
            "planet",
            "node",
            "host",
            "--seats",
            str(seats),
            "--memory-budget-mb",
            str(budget_mb),
            "--threads",
            "1",
        ],
        tmp_path / "host.log",
        env=node_env(),
    )
    try:
        # the client's heads load while the host starts
        heads = {m: ClientHead.load(m, device="cpu") for m in (one_part, two_part)}
        deadline = time.monotonic() + 120
        while _status(seats).get("pass", 0) < 1 and time.monotonic() < deadline:
            assert host.poll() is None, (tmp_path / "host.log").read_text()[-2000:]
            time.sleep(0.2)
        assert [s["state"] for s in _status(seats)["seats"]] == ["serving"]

        # the second model joins the running process: its two shards, shard 0 forwarding to 1
        hop = f"http://127.0.0.1:{p2}"
        assert _add(seats, _seat(two_part, 1, p2), capsys)[0] == 0
        code, said = _add(seats, _seat(two_part, 0, p1, "--next-hops", hop), capsys)
        assert code == 0, said
        assert f"of {Manifest.load(two_part).model_hash} at http://127.0.0.1:{p1}" in said

        # a fourth seat (the 1-part model again) does not fit: refused by name, nothing stops
        code, said = _add(seats, _seat(one_part, 0, p3), capsys)
        assert code == 6, said
        assert "memory_budget_exceeded" in said and Manifest.load(one_part).model_hash in said
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
            _both(
                _ask(one_part, heads[one_part], [Hop(url=f"http://127.0.0.1:{p0}", shard=0)]),
                _ask(
                    two_part,
                    heads[two_part],
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


async def _both(*asks: Coroutine[Any, Any, str]) -> list[str]:
    """Both questions at once: the two models' sessions live side by side in the process."""
    return list(await asyncio.gather(*asks))
