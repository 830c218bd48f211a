"""ShardModel and ClientHead against the full transformers model (tiny random Llama/Qwen2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel, cache_bytes
from protocol.errors import ProtocolError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

PROMPT = [{"role": "user", "content": "w1 w7 w3 w40 w5 w99 w12"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_model(root / "src", layers=6, hidden=64, tied=False)
    return root, model


def _prepared(tiny: tuple[Path, Any], parts: int, split: list[int] | None = None) -> Path:
    root, _ = tiny
    name = f"p{parts}" + ("-" + "_".join(map(str, split)) if split else "")
    return prepare(root / "src", parts=parts, split=split, out=root / name, progress=lambda _: None)


def _chain(
    shards: list[ShardModel], hidden: torch.Tensor, positions: torch.Tensor, caches: list[Any]
) -> list[torch.Tensor]:
    """Outputs after each shard."""
    outputs = []
    for shard, cache in zip(shards, caches, strict=True):
        hidden = shard.forward(hidden, positions, cache)
        outputs.append(hidden)
    return outputs


def _greedy(head: ClientHead, shards: list[ShardModel], ids: list[int], steps: int) -> list[int]:
    caches = [shard.new_cache() for shard in shards]
    hidden = _chain(shards, head.embed(ids), torch.arange(len(ids)), caches)[-1]
    tokens = [int(head.logits(hidden).argmax())]
    while len(tokens) < steps and tokens[-1] not in head.eos_token_ids:
        position = torch.tensor([len(ids) + len(tokens) - 1])
        hidden = _chain(shards, head.embed([tokens[-1]]), position, caches)[-1]
        tokens.append(int(head.logits(hidden).argmax()))
    return tokens


@pytest.mark.parametrize(("parts", "split"), [(2, None), (3, None), (3, [1, 3, 2])])
def test_shard_chain_hidden_states_equal_full_model(tiny, parts, split) -> None:
    _, model = tiny
    manifest = _prepared(tiny, parts, split)
    head = ClientHead.load(manifest)
    shards = [ShardModel.load(manifest, k) for k in range(parts)]
    ids = head.chat_ids(PROMPT)
    outputs = _chain(
        shards, head.embed(ids), torch.arange(len(ids)), [s.new_cache() for s in shards]
    )
    with torch.no_grad():
        full = model(torch.tensor([ids]), output_hidden_states=True)
    # hidden_states[i] is the input of layer i: compare at every internal shard boundary.
    for shard, out in zip(shards[:-1], outputs[:-1], strict=True):
        expected = full.hidden_states[shard.layers[1]]
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.all_logits(outputs[-1]), full.logits[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("parts", "split"), [(2, None), (3, None), (3, [2, 1, 3])])
def test_shard_greedy_decode_with_caches_equals_generate(tiny, parts, split) -> None:
    _, model = tiny
    manifest = _prepared(tiny, parts, split)
    head = ClientHead.load(manifest)
    shards = [ShardModel.load(manifest, k) for k in range(parts)]
    ids = head.chat_ids(PROMPT)
    steps = 24
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([ids]), max_new_tokens=steps, do_sample=False, min_new_tokens=steps
        )[0, len(ids) :].tolist()
    head_no_eos = _without_eos(head)
    assert _greedy(head_no_eos, shards, ids, steps) == expected


def _without_eos(head: ClientHead) -> ClientHead:
    head.eos_token_ids = frozenset()
    return head


def test_shard_chunked_prefill_equals_single_prefill(tiny) -> None:
    manifest = _prepared(tiny, 3)
    head = ClientHead.load(manifest)
    shards = [ShardModel.load(manifest, k) for k in range(3)]
    ids = head.chat_ids(PROMPT)
    hidden = head.embed(ids)
    whole = _chain(shards, hidden, torch.arange(len(ids)), [s.new_cache() for s in shards])[-1]
    caches = [s.new_cache() for s in shards]
    cut = 4
    first = _chain(shards, hidden[:, :cut], torch.arange(cut), caches)[-1]
    second = _chain(shards, hidden[:, cut:], torch.arange(cut, len(ids)), caches)[-1]
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-5, atol=1e-5)
    assert shards[1].cache_length(caches[1]) == len(ids)
    assert cache_bytes(caches[1]) > 0


def test_shard_forward_bad_shape_raises_protocol_error(tiny) -> None:
    manifest = _prepared(tiny, 2)
    shard = ShardModel.load(manifest, 1)
    with pytest.raises(ProtocolError):
        shard.forward(torch.zeros(1, 3, shard.hidden_size + 1), torch.arange(3), shard.new_cache())
    with pytest.raises(ProtocolError):
        shard.forward(torch.zeros(1, 3, shard.hidden_size), torch.arange(2), shard.new_cache())


def test_shard_sessions_do_not_share_caches(tiny) -> None:
    manifest = _prepared(tiny, 2)
    head = ClientHead.load(manifest)
    shard = ShardModel.load(manifest, 0)
    ids = head.chat_ids(PROMPT)
    alone = shard.forward(head.embed(ids), torch.arange(len(ids)), shard.new_cache())
    other = shard.new_cache()
    shard.forward(head.embed([9, 10, 11]), torch.arange(3), other)
    again = shard.forward(head.embed(ids), torch.arange(len(ids)), shard.new_cache())
    torch.testing.assert_close(again, alone, rtol=0, atol=0)


def test_shard_qwen2_family_equals_full_model(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "src", model_type="qwen2", layers=4, tied=True)
    manifest = prepare(tmp_path / "src", parts=2, out=tmp_path / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest)
    shards = [ShardModel.load(manifest, k) for k in range(2)]
    ids = head.chat_ids(PROMPT)
    hidden = _chain(
        shards, head.embed(ids), torch.arange(len(ids)), [s.new_cache() for s in shards]
    )[-1]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(head.all_logits(hidden), expected, rtol=1e-5, atol=1e-5)
