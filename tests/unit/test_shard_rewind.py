"""Speculative decoding at the shard: a forward of k+1 positions, then a rewind to the accepted
length, leaves the cache exactly as plain one-by-one decoding would (tiny Llama and Qwen2), and
the rewind's bounds are checked."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from protocol.errors import ProtocolError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12"
STEPS = 10


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def prepared(request, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp(f"tiny-rewind-{request.param}")
    make_tiny_model(root / "src", model_type=request.param, layers=4, hidden=64, tied=False)
    return prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)


@pytest.fixture(scope="module", params=["fast", "hf"])
def circuit(request, prepared: Any) -> tuple[ClientHead, list[Any]]:
    head = ClientHead.load(prepared)
    return head, [ShardModel.load(prepared, k, path=request.param) for k in range(2)]


def _run(shards: list[ShardModel], caches: list[Any], hidden: torch.Tensor, start: int):
    positions = torch.arange(start, start + hidden.shape[1])
    for shard, cache in zip(shards, caches, strict=True):
        hidden = shard.forward(hidden, positions, cache)
    return hidden


def _plain(head: ClientHead, shards: list[ShardModel], ids: list[int]) -> list[int]:
    caches = [s.new_cache() for s in shards]
    out = _run(shards, caches, head.embed(ids), 0)
    tokens = [int(head.logits(out[0, -1]).argmax())]
    for step in range(STEPS - 1):
        out = _run(shards, caches, head.embed([tokens[-1]]), len(ids) + step)
        tokens.append(int(head.logits(out[0, -1]).argmax()))
    return tokens


def test_verify_then_rewind_gives_plain_greedy_tokens(circuit) -> None:
    """Every pass verifies the true next tokens with a wrong guess spliced in at varying depth:
    the accepted prefix is kept, the rest rewound, and the tokens equal plain decoding."""
    head, shards = circuit
    ids = head.encode(PROMPT)
    expected = _plain(head, shards, ids)
    caches = [s.new_cache() for s in shards]
    out = _run(shards, caches, head.embed(ids), 0)
    tokens = [int(head.logits(out[0, -1]).argmax())]
    length = len(ids)
    passes = 0
    while len(tokens) < STEPS:
        depth = passes % 3  # how many guesses are right before the wrong one
        guess = [*expected[len(tokens) : len(tokens) + depth], (tokens[-1] + 1) % 50]
        feed = [tokens[-1], *guess]
        out = _run(shards, caches, head.embed(feed), length)
        logits = head.all_logits(out[0])
        accepted = 0
        while accepted < len(guess) and int(logits[accepted].argmax()) == guess[accepted]:
            accepted += 1
        new = [*guess[:accepted], int(logits[accepted].argmax())]
        length += 1 + accepted
        for shard, cache in zip(shards, caches, strict=True):
            shard.rewind(cache, length)
            assert shard.cache_length(cache) == length
        tokens.extend(new)
        passes += 1
    assert tokens[:STEPS] == expected
    assert passes < STEPS - 1  # some passes accepted more than one token


def test_rewind_cache_equals_plain_cache(circuit) -> None:
    head, shards = circuit
    ids = head.encode(PROMPT)
    plain = [s.new_cache() for s in shards]
    _run(shards, plain, head.embed(ids), 0)
    spec = [s.new_cache() for s in shards]
    _run(shards, spec, head.embed(ids[:3]), 0)
    _run(shards, spec, head.embed([*ids[3:5], 7, 8, 9]), 3)
    for shard, cache in zip(shards, spec, strict=True):
        shard.rewind(cache, 5)
    _run(shards, spec, head.embed(ids[5:]), 5)
    for shard, a, b in zip(shards, plain, spec, strict=True):
        assert shard.cache_length(a) == shard.cache_length(b) == len(ids)
        for index in range(*shard.layers):
            for mine, theirs in zip(
                shard.cache_kv(a, index), shard.cache_kv(b, index), strict=True
            ):
                torch.testing.assert_close(mine, theirs)


def test_rewind_bounds(circuit) -> None:
    head, shards = circuit
    shard = shards[0]
    cache = shard.new_cache()
    shard.forward(head.embed([1, 2, 3]), torch.arange(3), cache)
    with pytest.raises(ProtocolError, match="cache holds 3"):
        shard.rewind(cache, 4)
    with pytest.raises(ProtocolError):
        shard.rewind(cache, -1)
    shard.rewind(cache, 3)  # no-op
    shard.rewind(cache, 0)
    assert shard.cache_length(cache) == 0
