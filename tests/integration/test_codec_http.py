"""The opt-in codecs (ohq7, rq) through a real 2-node circuit of SmolLM2 (the nodes forward to
each other over WebSockets): greedy tokens equal the uncompressed circuit's on the short prompt
of test_pipeline_http.py, and the nodes answer in the codec they were sent (the client checks
every answer's codec). `--compress` stays hq9. The 2-part circuit (two node processes) is the
session's shared one (tests/integration/conftest.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.model.head import ClientHead
from node.server.launcher import NodeProcess
from protocol.frames.codecs import COMPRESSED_CODEC

pytestmark = pytest.mark.integration

MAX_NEW_TOKENS = 24
PROMPTS: dict[str, list[dict[str, str]]] = {
    "short": [{"role": "user", "content": "What is the capital of France?"}],
}  # one prompt keeps the module near 30 s on an idle 2-core box


@pytest.fixture(scope="module")
def circuit(plain_circuits: Any) -> tuple[Path, list[NodeProcess]]:
    return plain_circuits.get(2)  # kept for test_pipeline_http's 2-part circuit (conftest.py)


def _greedy(nodes: list[NodeProcess], head: ClientHead, ids: list[int], codec: str) -> list[int]:
    async def run() -> list[int]:
        hops = [Hop(url=n.url, shard=n.shard) for n in nodes]
        client = CircuitClient(hops, hidden_size=head.hidden_size, codec=codec, dtype="float32")
        async with client:
            return [t async for t in client.generate(head, ids, max_new_tokens=MAX_NEW_TOKENS)]

    return asyncio.run(run())


def test_compress_stays_hq9_because_rq_costs_far_more_cpu_per_token():
    assert COMPRESSED_CODEC == "hq9"


@pytest.fixture(scope="module")
def head(circuit) -> ClientHead:
    """The client side, loaded once for the module."""
    return ClientHead.load(circuit[0], device="cpu")


@pytest.fixture(scope="module")
def uncompressed(circuit, head) -> dict[str, list[int]]:
    """Greedy tokens of each prompt through the circuit with raw fp32 frames (computed once)."""
    _, nodes = circuit
    return {p: _greedy(nodes, head, head.chat_ids(m), "raw") for p, m in PROMPTS.items()}


@pytest.mark.parametrize("codec", ["ohq7", "rq"])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_codec_greedy_tokens_equal_uncompressed_circuit(circuit, head, uncompressed, prompt, codec):
    _, nodes = circuit
    raw = uncompressed[prompt]
    assert len(raw) >= 5
    assert _greedy(nodes, head, head.chat_ids(PROMPTS[prompt]), codec) == raw
