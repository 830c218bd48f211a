"""Speculative decoding through a real 3-node circuit of SmolLM2 (node processes forwarding to
each other over WebSockets): greedy tokens identical to plain decoding on the held-out and the
repetitive prompt sets (bench/_prompt_sets.py), with guesses kept on the repetitive set and
rejected ones rewound at every node. One circuit for the module: the session's uneven 3-part one
(tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from bench._prompt_sets import heldout_prompts, repetitive_prompts
from harness.shard_cache import UNEVEN_SPLIT
from node.client.circuit import CircuitClient
from node.client.speculation import SpeculationConfig, SpeculationStats
from node.client.types import Hop
from node.model.head import ClientHead

pytestmark = pytest.mark.integration

# 12 tokens a prompt: replayed from the whole model's greedy answers (transformers, the
# Drafter's own rule), the repetitive set keeps 18-19 of 43-71 guesses, 1.69-1.76 tokens a
# pass (the assertion: > 1.3), the held-out one rejects 14-23 of 20-30 (whether lone-token
# drafts pay or not); 24 tokens cost twice the passes for the same assertions
MAX_NEW_TOKENS = 12
SPLIT = UNEVEN_SPLIT  # layers per node: 4, 17, 9
SETS = {"heldout": heldout_prompts(), "repetitive": repetitive_prompts()}


@pytest.fixture(scope="module")
def circuit(plain_circuits: Any) -> Iterator[tuple[ClientHead, list[Hop]]]:
    """The session's uneven 3-part circuit (4/17/9 layers; test_pipeline_http's too,
    tests/integration/conftest.py), stopped after this module."""
    manifest, nodes = plain_circuits.get(3, SPLIT)
    yield ClientHead.load(manifest, device="cpu"), [Hop(url=n.url, shard=n.shard) for n in nodes]
    plain_circuits.release(3, SPLIT)


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
