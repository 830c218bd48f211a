"""The fast shard path (node/model/fast.py) against the hf path it replaces on CPU: greedy
tokens identical for fp32 shards (tiny Llama and Qwen2, three prompts, 32 tokens, across a
cache that has to grow), pooled static-cache slots reused by a later session without anything
of the earlier one leaking into it, and positions that do not continue a cache refused."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from node.model import fast
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel, cache_bytes
from protocol.errors import ConfigError, ProtocolError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

PROMPTS = ["w1 w7 w3", "w40 w5 w99 w12 w8 w9 w10", "w3 w4 w5 w6 w11 w3 w4 w5"]
STEPS = 32


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def prepared(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"tiny-fast-{request.param}")
    make_tiny_model(root / "src", model_type=request.param, layers=4, hidden=64, tied=False)
    return prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)


def _load(manifest: Path, path: str) -> tuple[ClientHead, list[ShardModel]]:
    head = ClientHead.load(manifest)
    head.eos_token_ids = frozenset()
    return head, [ShardModel.load(manifest, k, path=path) for k in range(2)]


def _greedy(
    head: ClientHead, shards: list[ShardModel], ids: list[int], chunk: int = 0
) -> list[int]:
    """Greedy tokens; the prompt goes in `chunk`-sized pieces when chunk > 0."""
    caches = [s.new_cache() for s in shards]
    pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)] if chunk else [ids]
    start = 0
    for piece in pieces:
        hidden = head.embed(piece)
        for shard, cache in zip(shards, caches, strict=True):
            hidden = shard.forward(hidden, torch.arange(start, start + len(piece)), cache)
        start += len(piece)
    tokens = [int(head.logits(hidden[0, -1]).argmax())]
    for step in range(STEPS - 1):
        hidden = head.embed([tokens[-1]])
        for shard, cache in zip(shards, caches, strict=True):
            hidden = shard.forward(hidden, torch.tensor([len(ids) + step]), cache)
        tokens.append(int(head.logits(hidden[0, -1]).argmax()))
    return tokens


def test_fast_path_greedy_tokens_equal_hf_path(prepared: Path, monkeypatch) -> None:
    # A small block makes every session's cache grow (copying what it holds) several times.
    monkeypatch.setattr(fast, "BLOCK", 8)
    head, hf = _load(prepared, "hf")
    _, quick = _load(prepared, "fast")
    assert [s.path for s in quick] == ["fast", "fast"] and hf[0].path == "hf"
    for number, prompt in enumerate(PROMPTS):
        ids = head.encode(prompt)
        expected = _greedy(head, hf, ids)
        assert _greedy(head, quick, ids, chunk=3 * number) == expected  # 0: one prefill


def test_fast_path_is_the_cpu_default_and_env_selects_hf(prepared: Path, monkeypatch) -> None:
    assert ShardModel.load(prepared, 0).path == "fast"
    monkeypatch.setenv("PLANET_SHARD_PATH", "hf")
    assert ShardModel.load(prepared, 0).path == "hf"
    monkeypatch.setenv("PLANET_SHARD_PATH", "turbo")
    with pytest.raises(ConfigError, match="PLANET_SHARD_PATH"):
        ShardModel.load(prepared, 0)


def test_static_cache_slot_is_reused_without_leaking(prepared: Path) -> None:
    head, shards = _load(prepared, "fast")
    shard = shards[0]
    first = shard.new_cache()
    long_ids = head.encode(PROMPTS[1] + " " + PROMPTS[2])
    shard.forward(head.embed(long_ids), torch.arange(len(long_ids)), first)
    address = first.keys.data_ptr()
    del first
    gc.collect()
    reused = shard.new_cache()
    assert reused.keys.data_ptr() == address  # the dropped session's buffers
    assert shard.cache_length(reused) == 0
    ids = head.encode(PROMPTS[0])
    got = shard.forward(head.embed(ids), torch.arange(len(ids)), reused)
    step = shard.forward(head.embed([5]), torch.tensor([len(ids)]), reused)
    _, fresh_shards = _load(prepared, "fast")
    clean = fresh_shards[0].new_cache()
    want = fresh_shards[0].forward(head.embed(ids), torch.arange(len(ids)), clean)
    want_step = fresh_shards[0].forward(head.embed([5]), torch.tensor([len(ids)]), clean)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(step, want_step, rtol=0, atol=0)
    assert shard.cache_bytes_per_position() * (len(ids) + 1) == cache_bytes(reused)


def test_positions_must_continue_the_cache(prepared: Path) -> None:
    head, shards = _load(prepared, "fast")
    shard = shards[0]
    cache = shard.new_cache()
    shard.forward(head.embed([1, 2, 3]), torch.arange(3), cache)
    with pytest.raises(ProtocolError, match="continue the cache at 3"):
        shard.forward(head.embed([4]), torch.tensor([5]), cache)
    with pytest.raises(ProtocolError, match="does not belong"):
        shard.forward(head.embed([4]), torch.tensor([0]), object())
