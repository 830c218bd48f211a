"""A span hop: one node serving consecutive shards as one hop (node/server/span_backend.py), in
circuits planned by the client (node/client/replicas.py) over in-process nodes of a tiny model
(fp32, so greedy tokens are exact)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch

from node.client.failover import FailoverPolicy, generate
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop, Timings
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend, served_span
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList
from node.server.span_backend import SpanBackend
from protocol.errors import ConfigError
from tests.doubles.tiny_model import make_tiny_model

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 10
H = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    root = tmp_path_factory.mktemp("tiny-span")
    model = make_tiny_model(root / "src", layers=6, hidden=H, tied=False)
    manifest = prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None)
    return model, Path(manifest)


def _expected(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    return out[0, len(ids) :].tolist()


def _backend(manifest: Path, first: int, last: int) -> Any:
    if first == last:
        return ModelShardBackend(manifest, first, device="cpu")
    return SpanBackend(
        [ModelShardBackend(manifest, s, device="cpu") for s in range(first, last + 1)]
    )


async def _nodes(
    aiohttp_server: Any, manifest: Path, spans: list[tuple[int, int]]
) -> tuple[list[Hop], list[Any], list[list[int]]]:
    """One in-process node per (first, last) span; each may forward to any of them. Returns the
    hops, the servers, and per node the positions it ran."""
    servers, seen_all = [], []
    for first, last in spans:
        backend = _backend(manifest, first, last)
        config = ServerConfig(
            manifest_path=manifest, shard_id=first, last_shard=None if first == last else last
        )
        app = create_app(config, backend)
        seen: list[int] = []
        app[STATE_KEY].forward_hooks.append(
            lambda _t, positions, _i, _o, seen=seen: seen.extend(int(p) for p in positions)
        )
        servers.append(await aiohttp_server(app))
        seen_all.append(seen)
    urls = frozenset(str(s.make_url("")).rstrip("/") for s in servers)
    for server in servers:
        state = server.app[STATE_KEY]
        state.next_hops = ForwardList(served_span(state.backend).last, urls)
    hops = [
        Hop(url=str(s.make_url("")).rstrip("/"), shard=first, last=None if first == last else last)
        for s, (first, last) in zip(servers, spans, strict=True)
    ]
    return hops, servers, seen_all


def _source(http: aiohttp.ClientSession, manifest: Path, hops: list[Hop]) -> ReplicaCircuits:
    from node.model.manifest import Manifest

    loaded = Manifest.load(manifest)
    expected = {s.shard_id: (loaded.model_hash, s.layers) for s in loaded.shards}
    return ReplicaCircuits(http, hops, expected=expected, hidden_size=H, prefill_chunk=5)


async def _answer(source: ReplicaCircuits, head: Any, ids: list[int], on_token: Any = None):
    timings = Timings()
    tokens: list[int] = []
    async for token in generate(
        source,
        head,
        ids,
        max_new_tokens=STEPS,
        stop_on_eos=False,
        timings=timings,
        policy=FailoverPolicy(backoff_s=0.01),
    ):
        tokens.append(token)
        if on_token is not None:
            await on_token(len(tokens))
    return tokens, timings


def test_span_backend_forward_equals_its_shards_in_order(tiny) -> None:
    _, manifest = tiny
    singles = [ModelShardBackend(manifest, s, device="cpu") for s in (1, 2)]
    span = SpanBackend([ModelShardBackend(manifest, s, device="cpu") for s in (1, 2)])
    assert span.shard_id == 1 and span.shards == (1, 2)
    assert span.layers == (singles[0].layers[0], singles[1].layers[1])
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((1, 7, H)).astype(np.float32)
    caches = [b.new_cache() for b in singles]
    cache = span.new_cache()
    want = singles[1].forward(
        singles[0].forward(hidden, np.arange(7), caches[0]), np.arange(7), caches[1]
    )
    got = span.forward(hidden, np.arange(7), cache)
    assert np.array_equal(got, want)
    assert span.cache_bytes(cache) == sum(
        b.cache_bytes(c) for b, c in zip(singles, caches, strict=True)
    )
    # a decode step after a rewind lands where the shards' own would
    span.rewind(cache, 5)
    for b, c in zip(singles, caches, strict=True):
        b.rewind(c, 5)
    step = rng.standard_normal((1, 1, H)).astype(np.float32)
    want = singles[1].forward(
        singles[0].forward(step, np.array([5]), caches[0]), np.array([5]), caches[1]
    )
    stages = span.forward_stages(step, np.array([5]), cache)
    assert len(stages) == 2 and np.array_equal(stages[-1], want)


def test_span_backend_refuses_shards_that_are_not_consecutive(tiny) -> None:
    _, manifest = tiny
    with pytest.raises(ConfigError, match="consecutive"):
        SpanBackend([ModelShardBackend(manifest, s, device="cpu") for s in (0, 2)])


async def test_span_hop_answers_the_same_greedy_tokens_as_single_hops_and_generate(
    aiohttp_server, tiny
) -> None:
    model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    want = _expected(model, ids)
    singles, _, _ = await _nodes(aiohttp_server, manifest, [(0, 0), (1, 1), (2, 2)])
    spanned, _, seen = await _nodes(aiohttp_server, manifest, [(0, 0), (1, 2)])
    async with aiohttp.ClientSession() as http:
        single_tokens, _ = await _answer(_source(http, manifest, singles), head, ids)
        source = _source(http, manifest, spanned)
        span_tokens, _ = await _answer(source, head, ids)
    assert single_tokens == want
    assert span_tokens == want
    assert [len(c) for c in source.circuits] == [2]  # two hops: shard 0, then span 1-2
    assert seen[1] == list(range(len(ids) + STEPS - 1))  # the span ran every position once


async def test_client_prefers_the_span_and_fails_over_to_single_shards(
    aiohttp_server, tiny
) -> None:
    model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    hops, servers, _ = await _nodes(aiohttp_server, manifest, [(0, 0), (1, 2), (1, 1), (2, 2)])
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)

        async def on_token(count: int) -> None:
            if count == 4:
                await servers[1].close()  # the span dies mid-answer

        tokens, timings = await _answer(source, head, ids, on_token)
    assert tokens == _expected(model, ids)
    first, second = source.circuits
    assert first == (hops[0], hops[1])  # fewer hops: the span
    assert second == (hops[0], hops[2], hops[3])  # its shards by single-shard nodes
    (failover,) = timings.failovers
    assert failover.hops == (1,)


async def test_client_refuses_a_span_node_that_announces_other_shards(aiohttp_server, tiny) -> None:
    """A node listed as span 1-2 that serves shard 1 alone is not used (its /info disagrees)."""
    _, manifest = tiny
    hops, _, _ = await _nodes(aiohttp_server, manifest, [(0, 0), (1, 1), (2, 2)])
    liar = Hop(url=hops[1].url, shard=1, last=2)
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, [*hops, liar])
        await source.refresh()
        assert liar in source._wrong and hops[1] not in source._wrong


def test_client_refuses_nodes_that_cover_no_chain_of_shards(tiny) -> None:
    _, manifest = tiny
    with pytest.raises(ConfigError, match="no node serves shard 2"):
        _source(None, manifest, [Hop("http://a", 0), Hop("http://b", 1)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not in the model"):
        _source(None, manifest, [Hop("http://a", 0), Hop("http://b", 1, last=3)])  # type: ignore[arg-type]
