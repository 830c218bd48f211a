"""Circuits: node-to-node forwarding (client → A → B → C → client over WebSockets) with real tiny
models on in-process nodes: greedy tokens equal transformers `generate` for 2, 3 and 5 nodes; many
concurrent sessions over the same links are batched at the shards and stay exact; full prefill
returns every position; the gateway's pool shares, redials and reaps clients."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch

from node.client.circuit import CircuitClient
from node.client.types import Timings
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.app import STATE_KEY
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("tiny-circuit")
    model = make_tiny_model(root / "src", layers=5, hidden=64, tied=False)
    return root, model


async def _circuit(aiohttp_server, manifest: Path, parts: int, **config: Any):
    return await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=manifest, shard_id=shard, **config),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(parts)
        ],
    )


def _expected(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("parts", [2, 3, 5])
async def test_circuit_forwarding_greedy_tokens_equal_generate(aiohttp_server, tiny, parts):
    root, model = tiny
    manifest = prepare(root / "src", parts=parts, out=root / f"p{parts}", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    servers, hops = await _circuit(aiohttp_server, manifest, parts)
    timings = Timings()
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5) as client:
        tokens = [
            t
            async for t in client.generate(
                head, ids, max_new_tokens=STEPS, timings=timings, stop_on_eos=False
            )
        ]
    assert tokens == _expected(model, ids)
    # one transfer per hop: the client sent only to the first node and heard only the last
    states = [s.app[STATE_KEY] for s in servers]
    assert all(st.forwards == -(-len(ids) // 5) + STEPS - 1 for st in states)
    assert timings.wire_bytes_sent > 0 and timings.wire_bytes_received > 0
    assert all(len(st.store) == 0 for st in states) or await _settled(states)


async def _settled(states: list[Any]) -> bool:
    for _ in range(50):  # close messages are fire-and-forget: give them a moment
        if all(len(st.store) == 0 for st in states):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_circuit_concurrent_sessions_batched_at_shards_and_exact(aiohttp_server, tiny):
    root, model = tiny
    manifest = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    prompts = [head.encode(p) for p in ("w1 w2", "w3 w4 w5 w6 w7", "w8", "w9 w10 w11")]
    servers, hops = await _circuit(aiohttp_server, manifest, 2)

    async def one(client: CircuitClient, ids: list[int]) -> list[int]:
        gen = client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
        return [t async for t in gen]

    async with CircuitClient(hops, hidden_size=64) as client:
        got = await asyncio.gather(*(one(client, ids) for ids in prompts))
    assert got == [_expected(model, ids) for ids in prompts]
    stats = [s.app[STATE_KEY].batcher.stats for s in servers]
    assert max(st.largest_batch for st in stats) > 1  # decode steps really met in a batch


def _final_hidden(model: Any, ids: list[int]) -> np.ndarray:
    """The monolithic model's residual stream after its last layer (the final norm's input)."""
    seen: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda _m, args, _o: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        hook.remove()
    return seen[0][0].float().numpy()


async def test_circuit_full_prefill_returns_every_position_and_logits_callback(
    aiohttp_server, tiny
):
    """prefill_last_only=False: the last hop answers every prompt position (chunk by chunk,
    equal to the monolithic model's final hidden states); on_logits sees what each token was
    sampled from (the model's own logits at that step)."""
    root, model = tiny
    manifest = prepare(root / "src", parts=3, out=root / "full3", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    _, hops = await _circuit(aiohttp_server, manifest, 3)
    chunks: list[tuple[int, np.ndarray]] = []
    logits: list[np.ndarray] = []
    # float32 frames: compared with the monolithic model's own numbers (fp16 would round them)
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5, dtype="float32") as client:
        gen = client.generate(
            head,
            ids,
            max_new_tokens=STEPS,
            stop_on_eos=False,
            prefill_last_only=False,
            on_prefill=lambda start, hidden: chunks.append((start, hidden)),
            on_logits=logits.append,
        )
        tokens = [t async for t in gen]
    assert [start for start, _ in chunks] == [0, 5, 10]
    assert [h.shape for _, h in chunks] == [(1, 5, 64), (1, 5, 64), (1, 2, 64)]
    got = np.concatenate([h[0] for _, h in chunks], axis=0)
    np.testing.assert_allclose(got, _final_hidden(model, ids), atol=1e-4, rtol=1e-4)
    assert tokens == _expected(model, ids)  # full prefill changes nothing downstream
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert len(logits) == STEPS
    assert [int(np.argmax(v)) for v in logits] == tokens
    for step, row in enumerate(out.logits):
        np.testing.assert_allclose(logits[step], row[0].float().numpy(), atol=1e-3, rtol=1e-3)


async def test_circuit_pool_shares_one_client_per_circuit_reconnects_and_reaps(
    aiohttp_server, tiny
):
    """The gateway's pool: concurrent questions on one circuit share one client (one dial);
    after a node closed its streams (a restart) the next question dials again and is exact;
    idle clients are closed by reap, and close() closes every link."""
    from node.gateway.circuits import CircuitPool
    from node.server.stream import close_streams

    root, model = tiny
    manifest = prepare(root / "src", parts=2, out=root / "pool2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    prompts = [head.encode(p) for p in ("w1 w2 w3", "w4 w5", "w6 w7 w8 w9")]
    servers, hops = await _circuit(aiohttp_server, manifest, 2)

    async def ask(pool: CircuitPool, ids: list[int]) -> list[int]:
        async with pool.use(hops) as client:
            gen = client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
            return [t async for t in gen]

    async with aiohttp.ClientSession() as http:
        pool = CircuitPool(http, hidden_size=64)
        try:
            got = await asyncio.gather(*(ask(pool, ids) for ids in prompts))
            assert got == [_expected(model, ids) for ids in prompts]
            assert pool.dials == 1 and len(pool) == 1
            async with pool.use(hops) as first:
                pass
            await close_streams(servers[1].app)  # node 1 "restarts": its links drop
            for _ in range(100):
                if not first.alive:
                    break
                await asyncio.sleep(0.01)
            assert not first.alive
            assert await ask(pool, prompts[0]) == _expected(model, prompts[0])
            assert pool.dials == 2 and len(pool) == 1
            async with pool.use(hops) as second:
                assert second is not first and second.alive
            assert await pool.reap(now=time.monotonic()) == 0  # just used: kept
            assert await pool.reap(now=time.monotonic() + pool.idle_s) == 1
            assert len(pool) == 0 and not second.alive
            async with pool.use(hops) as third:
                pass
        finally:
            await pool.close()
        assert not third.alive and len(pool) == 0


async def test_circuit_next_hop_link_lost_during_an_open_is_replaced_and_exact(
    aiohttp_server, tiny
):
    """Node A's pooled link to B is shared by questions (one dial for two); when it dies right
    after A sent a session's attach on it (before B's `attached` came back, A's frames behind
    it), A attaches again on a fresh link and sends those frames again: the question gets the
    exact tokens and nothing fails."""
    root, model = tiny
    manifest = prepare(root / "src", parts=2, out=root / "lost2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    servers, hops = await _circuit(aiohttp_server, manifest, 2)
    a = servers[0].app[STATE_KEY]
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5) as client:

        async def ask() -> list[int]:
            gen = client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
            return [t async for t in gen]

        assert await ask() == _expected(model, ids)
        assert await ask() == _expected(model, ids)
        assert a.links.stats.dialled == 1  # the second question opened no new link
        link = a.links.link(hops[1].url)
        assert link is not None
        attach = link.attach

        async def attach_then_die(feed: str) -> Any:
            sent = await attach(feed)
            link.ws.get_extra_info("socket").shutdown(socket.SHUT_RDWR)  # killed underneath
            return sent

        link.attach = attach_then_die  # type: ignore[method-assign]
        assert await ask() == _expected(model, ids)
    assert a.links.stats.reattached == 1 and a.links.stats.dialled == 2


async def test_circuit_compressed_codec_carries_fewer_bytes(aiohttp_server, tiny):
    """`planet ask --compress` over a circuit: every link carries the compressed codec (the
    client's own bytes shrink) and the answer keeps its length. A client given no dtype sends
    float16 frames (WIRE_DTYPE): about half float32's bytes."""
    from protocol.frames.codecs import COMPRESSED_CODEC

    root, _ = tiny
    manifest = prepare(root / "src", parts=2, out=root / "codec2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    _, hops = await _circuit(aiohttp_server, manifest, 2)
    sizes = {}
    for label, options in (
        ("fp32", {"dtype": "float32"}),
        ("default", {}),
        ("compressed", {"codec": COMPRESSED_CODEC, "dtype": "float32"}),
    ):
        timings = Timings()
        async with CircuitClient(hops, hidden_size=64, **options) as client:
            assert client.dtype == options.get("dtype", "float16")
            gen = client.generate(
                head, ids, max_new_tokens=STEPS, timings=timings, stop_on_eos=False
            )
            assert len([t async for t in gen]) == STEPS
        sizes[label] = timings.wire_bytes_sent + timings.wire_bytes_received
    assert sizes["compressed"] < 0.6 * sizes["fp32"]
    assert 0.45 * sizes["fp32"] < sizes["default"] < 0.55 * sizes["fp32"]
