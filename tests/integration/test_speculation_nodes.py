"""Speculative decoding through a real 3-node circuit of SmolLM2 (node processes forwarding to
each other over WebSockets): greedy tokens identical to plain decoding on the held-out and the
repetitive prompt sets (bench/_prompt_sets.py), with guesses kept on the repetitive set and
rejected ones rewound at every node. One circuit for the module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._prompt_sets import heldout_prompts, repetitive_prompts
from node.client.circuit import CircuitClient
from node.client.speculation import SpeculationConfig, SpeculationStats
from node.client.types import Hop
from node.model.head import ClientHead
from node.server.launcher import NodeProcess, free_ports, start_node, stop_pid, wait_healthy

pytestmark = pytest.mark.integration

MAX_NEW_TOKENS = 24
PORTS = (21800, 21900)  # this module's share of the test port range
SETS = {"heldout": heldout_prompts(), "repetitive": repetitive_prompts()}


@pytest.fixture(scope="module")
def circuit(tmp_path_factory) -> Iterator[tuple[ClientHead, list[Hop]]]:
    from node.model.prepare import prepare

    manifest = Path(prepare(parts=3, quant="none", progress=lambda _msg: None))
    run_dir = tmp_path_factory.mktemp("nodes-spec")
    nodes: list[NodeProcess] = []
    ports = free_ports(3, *PORTS)
    next_hops = ("--next-hops", ",".join(f"http://127.0.0.1:{port}" for port in ports))
    try:
        for shard, port in enumerate(ports):
            nodes.append(
                start_node(
                    manifest=manifest, shard=shard, port=port, run_dir=run_dir, extra_args=next_hops
                )
            )
        wait_healthy(nodes, timeout_s=240)
        head = ClientHead.load(manifest, device="cpu")
        yield head, [Hop(url=n.url, shard=n.shard) for n in nodes]
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)


def _both(head: ClientHead, hops: list[Hop], ids: list[int], stats: SpeculationStats):
    async def run() -> tuple[list[int], list[int]]:
        async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
            plain = [t async for t in client.generate(head, ids, max_new_tokens=MAX_NEW_TOKENS)]
            spec = [
                t
                async for t in client.generate(
                    head,
                    ids,
                    max_new_tokens=MAX_NEW_TOKENS,
                    speculation=SpeculationConfig(),
                    stats=stats,
                )
            ]
        return plain, spec

    return asyncio.run(run())


@pytest.mark.parametrize("name", list(SETS))
def test_speculative_greedy_tokens_identical_to_plain(circuit, name):
    head, hops = circuit
    stats = SpeculationStats()
    for prompt, messages in SETS[name].items():
        plain, spec = _both(head, hops, head.chat_ids(messages), stats)
        assert len(plain) >= 5, prompt
        assert spec == plain, prompt
    assert stats.proposed > stats.accepted  # some guesses rejected, so every node rewound
    if name == "repetitive":
        assert stats.accepted > 0 and stats.tokens_per_pass > 1.3, stats.to_json()
