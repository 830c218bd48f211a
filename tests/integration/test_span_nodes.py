"""A span hop with real node processes: a tiny 3-shard model (fp32) served by node A (shard 0)
and node B (`planet node serve --shards 1-2`, one hop), and by three single-shard nodes. The
client (node/client/replicas.py over node/client/failover.py, as `planet ask` runs it) answers
the same greedy tokens through A → B as through the three single-shard nodes and as transformers'
`generate`; B ran every position once through both of its shards; a node killed mid-answer is
replaced by single-shard nodes of its shards with the same answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from harness.gateway_net import http_json
from node.client.failover import FailoverPolicy, generate
from node.client.info import check_circuit
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop, Timings
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.server.launcher import NodeProcess, free_ports, start_node, stop_pid, wait_healthy
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.integration

PORTS = (28400, 28500)  # this module's share of the test port range
PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12
H = 64
# (first, last) per node: A, B (span), then single-shard nodes of shards 1 and 2
SPANS = [(0, 0), (1, 2), (1, 1), (2, 2)]


class Net:
    def __init__(self, model: Any, manifest: Path, nodes: list[NodeProcess]) -> None:
        self.model = model
        self.manifest = manifest
        self.nodes = nodes

    def hop(self, index: int) -> Hop:
        first, last = SPANS[index]
        return Hop(self.nodes[index].url, first, last=None if first == last else last)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    root = tmp_path_factory.mktemp("span-nodes")
    model = make_tiny_model(root / "src", layers=6, hidden=H, tied=False)
    manifest = Path(prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None))
    ports = free_ports(len(SPANS), *PORTS)
    urls = ",".join(f"http://127.0.0.1:{port}" for port in ports)
    nodes = [
        start_node(
            manifest=manifest,
            shard=first,
            last=None if first == last else last,
            port=port,
            run_dir=root / "run",
            extra_args=["--next-hops", urls],
        )
        for (first, last), port in zip(SPANS, ports, strict=True)
    ]
    try:
        wait_healthy(nodes)
        yield Net(model, manifest, nodes)
    finally:
        for node in nodes:
            stop_pid(node.pid)


def _expected(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    return out[0, len(ids) :].tolist()


async def _answer(net: Net, hops: list[Hop], on_token: Any = None) -> tuple[list[int], Any]:
    head = ClientHead.load(net.manifest, device="cpu")
    ids = head.encode(PROMPT)
    manifest = Manifest.load(net.manifest)
    expected = {s.shard_id: (manifest.model_hash, s.layers) for s in manifest.shards}
    async with aiohttp.ClientSession() as http:
        source = ReplicaCircuits(http, hops, expected=expected, hidden_size=H, prefill_chunk=5)
        tokens: list[int] = []
        timings = Timings()
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
                await on_token(len(tokens), source)
    return tokens, (ids, timings, source)


def _positions(net: Net, index: int) -> int:
    return http_json(f"{net.nodes[index].url}/info")["load"]["tokens"]


def test_span_node_announces_its_shards_and_the_span_layers(net: Net) -> None:
    info = http_json(f"{net.nodes[1].url}/info")
    manifest = Manifest.load(net.manifest)
    assert info["shard"] == 1 and info["shards"] == [1, 2]
    assert info["layers"] == [manifest.shard(1).layers[0], manifest.shard(2).layers[1]]

    async def check() -> None:
        async with aiohttp.ClientSession() as http:
            await check_circuit(
                http, [net.hop(0), net.hop(1)], manifest.model_hash, manifest.total_layers
            )

    asyncio.run(check())


def test_span_hop_answers_as_three_single_shard_nodes_and_generate(net: Net) -> None:
    singles, _ = asyncio.run(_answer(net, [net.hop(0), net.hop(2), net.hop(3)]))
    before = _positions(net, 1)
    spanned, (ids, _, source) = asyncio.run(_answer(net, [net.hop(0), net.hop(1)]))
    assert singles == spanned == _expected(net.model, ids)
    assert source.circuits == [(net.hop(0), net.hop(1))]
    # one pass through the span per position: the prompt, then every step but the last
    assert _positions(net, 1) - before == len(ids) + STEPS - 1


def test_client_prefers_the_span_and_replaces_it_by_single_shard_nodes(net: Net) -> None:
    hops = [net.hop(i) for i in range(len(SPANS))]

    async def on_token(count: int, source: Any) -> None:
        if count == 5:
            assert source.current == (net.hop(0), net.hop(1))
            stop_pid(net.nodes[1].pid)  # the span node goes away mid-answer

    tokens, (ids, timings, source) = asyncio.run(_answer(net, hops, on_token))
    assert tokens == _expected(net.model, ids)
    assert [len(circuit) for circuit in source.circuits] == [2, 3]
    assert source.circuits[-1] == (net.hop(0), net.hop(2), net.hop(3))
    assert [f.hops for f in timings.failovers] == [(1,)]
