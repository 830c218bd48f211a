"""Prefix-aware routing with real node processes (harness/replica_net.py): SmolLM2 int8 in 2
shards, two nodes for shard 0 (A, B) and one for shard 1 (C), each with its prefix cache on
(the default, 128 MiB; blocks advertised in /info `prefix_routes` once 2 sessions reached them).

A user's assistant sends the same ~200-token system prompt with every question. After two
questions through A, A advertises the prompt's blocks; a question with that system prompt and a
new user turn is then routed to A (not B, which is as cheap and holds nothing advertised), A
serves the system prompt's positions from its cache (its /info `hit_positions`), and the greedy
tokens are exactly those of the same question asked cold through B. The first-token times are
printed, not asserted (bench/prefix.py measures them; a timed assertion fails on a loaded box).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from harness.gateway_net import prepared_manifest
from harness.replica_net import ReplicaNet
from node.client.costs import CostBook
from tests.doubles.choice import FirstOrLast

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKENS = 8
SYSTEM = (
    "You are Planet's astronomy tutor. Answer in plain words for a curious twelve-year-old. "
    "Keep each answer short: two or three sentences at most, with one concrete example from "
    "the night sky that the student can look for tonight without a telescope. When a question "
    "mixes up two ideas, say which one you are answering first. Never invent numbers: when you "
    "are not sure of a distance, a size or a date, say so and give the order of magnitude "
    "instead. Use metric units. If the student asks about something dangerous, such as looking "
    "at the Sun, warn them first and explain why. Mention the planets by their English names, "
    "the stars by their common names, and the constellations by their Latin names. End every "
    "answer with one question that invites the student to observe something for themselves. "
    "Prefer what a city dweller can see: the Moon, the bright planets and the brightest stars."
)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaNet]:
    manifest = prepared_manifest(parts=2, quant="int8")
    network = ReplicaNet.start(tmp_path_factory.mktemp("prefix-nodes"), manifest, [0, 0, 1])
    try:
        yield network
    finally:
        network.close()


def _info(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/info", timeout=10) as answer:
        return json.loads(answer.read())


def test_a_question_sharing_a_system_prompt_goes_to_its_holder_reuses_its_cache_same_tokens(
    net: ReplicaNet,
) -> None:
    from node.model.head import ClientHead

    head = ClientHead.load(net.manifest_path, device="cpu")

    def chat(question: str) -> list[int]:
        return head.chat_ids(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        )

    first = chat("Why is the sky blue?")
    second = chat("What is a shooting star?")
    assert len(first) >= 200 and len(second) >= 200
    holder, other, last = net.replicas
    assert (holder.shard, other.shard, last.shard) == (0, 0, 1)

    async def ask(
        prompt: list[int], hops: list[Any] | None = None, book: CostBook | None = None
    ) -> tuple[list[int], float, list[str]]:
        args: dict[str, Any] = {"prompt": prompt, "costs": book or CostBook()}
        if hops is not None:
            args["hops"] = hops
        tokens, timings, source = await net.answer(
            head, prompt, max_new_tokens=TOKENS, source_args=args
        )
        return tokens, timings.prefill_ms, [hop.url for hop in source.circuits[-1]]

    # the cold answer through B (one session there: nothing advertised)
    cold, cold_ms, cold_circuit = asyncio.run(ask(second, hops=[other.hop, last.hop]))
    assert cold_circuit == [other.url, last.url]
    # two sessions of the system prompt through A: A advertises its blocks
    for _ in range(2):
        asyncio.run(ask(first, hops=[holder.hop, last.hop]))
    routes = _info(holder.url)["prefix_routes"]
    assert routes and routes["keys"], routes
    before = _info(holder.url)["prefix_cache"]["hit_positions"]

    # a client that has measured neither replica, with a band wide enough that this box's load
    # cannot part them, and whose coin would pick B (the last of the tied): the prefix decides
    pick = FirstOrLast()
    pick.last = True
    warm, warm_ms, circuit = asyncio.run(ask(second, book=CostBook(rng=pick, near=100.0)))
    assert circuit == [holder.url, last.url], "not routed to the node holding the prefix"
    reused = _info(holder.url)["prefix_cache"]["hit_positions"] - before
    system_blocks = (len(chat("")) - 16) // 16  # whole 16-position blocks of the shared part
    assert reused >= system_blocks * 16 > 150, (reused, system_blocks)
    assert warm == cold, "a prefix served from cache changed the greedy tokens"
    print(
        f"first token: cold on B {cold_ms:.0f} ms, routed to A with {reused} positions "
        f"from its cache {warm_ms:.0f} ms",
        file=sys.stderr,
    )
