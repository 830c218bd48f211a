"""Continuous batching at the shard: decode steps of several sessions run as one batched
forward and give the same greedy tokens as running each session alone (tiny Llama and Qwen2)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

PROMPTS = ["w1 w7 w3", "w40 w5 w99 w12 w8 w9 w10", "w2", "w3 w4 w5 w6 w11"]
STEPS = 16


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def circuit(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[ClientHead, list[Any]]:
    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    make_tiny_model(root / "src", model_type=request.param, layers=4, hidden=64, tied=False)
    manifest = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest)
    head.eos_token_ids = frozenset()
    return head, [ShardModel.load(manifest, k) for k in range(2)]


def _prefill(head: ClientHead, shards: list[ShardModel], ids: list[int]) -> tuple[int, list[Any]]:
    caches = [s.new_cache() for s in shards]
    hidden = head.embed(ids)
    for shard, cache in zip(shards, caches, strict=True):
        hidden = shard.forward(hidden, torch.arange(len(ids)), cache)
    return int(head.logits(hidden[0, -1]).argmax()), caches


def _greedy_alone(head: ClientHead, shards: list[ShardModel], ids: list[int]) -> list[int]:
    token, caches = _prefill(head, shards, ids)
    tokens = [token]
    for step in range(STEPS - 1):
        hidden = head.embed([tokens[-1]])
        for shard, cache in zip(shards, caches, strict=True):
            hidden = shard.forward(hidden, torch.tensor([len(ids) + step]), cache)
        tokens.append(int(head.logits(hidden[0, -1]).argmax()))
    return tokens


def _greedy_batched(head: ClientHead, shards: list[ShardModel], prompts: list[list[int]]):
    starts = [_prefill(head, shards, ids) for ids in prompts]
    tokens = [[token] for token, _ in starts]
    caches = [c for _, c in starts]
    for step in range(STEPS - 1):
        hidden = torch.cat([head.embed([t[-1]]) for t in tokens])  # [B, 1, H]
        positions = torch.tensor([len(ids) + step for ids in prompts])
        for k, shard in enumerate(shards):
            hidden = shard.forward_batch(hidden, positions, [c[k] for c in caches])
        for b in range(len(prompts)):
            tokens[b].append(int(head.logits(hidden[b, -1]).argmax()))
    return tokens


def test_batched_decode_same_greedy_tokens_as_unbatched(circuit) -> None:
    head, shards = circuit
    assert all(s.batched_decode for s in shards)  # the batched path really runs
    prompts = [head.encode(p) for p in PROMPTS]
    alone = [_greedy_alone(head, shards, ids) for ids in prompts]
    assert _greedy_batched(head, shards, prompts) == alone


def test_batched_decode_hidden_states_close_to_unbatched(circuit) -> None:
    head, shards = circuit
    prompts = [head.encode(p) for p in PROMPTS]
    shard = shards[0]
    single, batched = [], []
    for ids in prompts:
        cache_a, cache_b = shard.new_cache(), shard.new_cache()
        shard.forward(head.embed(ids), torch.arange(len(ids)), cache_a)
        shard.forward(head.embed(ids), torch.arange(len(ids)), cache_b)
        single.append(cache_a)
        batched.append(cache_b)
    new = torch.cat([head.embed([7 + b]) for b in range(len(prompts))])
    positions = torch.tensor([len(ids) for ids in prompts])
    expected = torch.cat(
        [
            shard.forward(new[b : b + 1], positions[b : b + 1], single[b])
            for b in range(len(prompts))
        ]
    )
    got = shard.forward_batch(new, positions, batched)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert [shard.cache_length(c) for c in batched] == [len(ids) + 1 for ids in prompts]
