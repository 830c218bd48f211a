"""The prefix cache (node/server/prefix_cache.py) on real SmolLM2 shard sets from the shared cache
(fp32 and int8, every hop of a 3-shard pipeline, in-process) and on a fake shard for its book-
keeping: a prompt served from cached blocks gives the tokens and hidden states a cold prefill
gives, the next hop reuses its own blocks, and the budget, salts, decode and rewind rules hold."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from node.server.prefix_cache import PrefixCache
from tests.doubles.fake_shard import FakeCache, FakeShard

pytestmark = pytest.mark.unit

MODELS = Path.home() / ".cache" / "planet" / "models"
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 16


# ------------------------------------------------------------------------------ real shards
@dataclass
class Pipeline:
    head: Any
    shards: list[Any]
    prefix: list[PrefixCache]

    def ask(
        self,
        ids: list[int],
        *,
        cached: bool,
        salt: str | None = None,
        new: int = 3,
        split: int | None = None,
    ):
        """Prefill `ids` through every hop (with or without the prefix caches; without, in two
        frames cut at `split` if given), then `new` greedy decode steps: (tokens, every hop's
        prefill output)."""
        hidden = self.head.embed_np(ids).reshape(1, len(ids), -1)
        caches = [shard.new_cache() for shard in self.shards]
        outputs = []
        cuts = [0, *([split] if split else []), len(ids)]
        for shard, prefix, cache in zip(self.shards, self.prefix, caches, strict=True):
            if cached:
                hidden = prefix.forward(prefix.chain(salt), hidden, 0, cache)
            else:
                hidden = np.concatenate(
                    [
                        shard.forward(hidden[:, a:b], np.arange(a, b, dtype=np.int64), cache)
                        for a, b in itertools.pairwise(cuts)
                    ],
                    axis=1,
                )
            outputs.append(hidden)
        tokens: list[int] = []
        for step in range(new):
            tokens.append(int(np.argmax(self.head.logits_np(hidden[0, -1]))))
            hidden = self.head.embed_np([tokens[-1]]).reshape(1, 1, -1)
            for shard, cache in zip(self.shards, caches, strict=True):
                hidden = shard.forward(hidden, np.array([len(ids) + step]), cache)
        return tokens, outputs


def _pipeline(name: str, path: str | None = None, parts: int | None = None) -> Pipeline:
    from node.model.head import ClientHead
    from node.model.manifest import Manifest
    from node.server.backend import ModelShardBackend

    manifest = MODELS / name / "manifest.json"
    if not manifest.is_file():
        pytest.skip(f"{name} is not in the shared cache")
    before = os.environ.get("PLANET_SHARD_PATH")
    if path is not None:
        os.environ["PLANET_SHARD_PATH"] = path
    try:
        ids = [s.shard_id for s in Manifest.load(manifest).shards][:parts]
        shards = [ModelShardBackend(manifest, shard, "cpu") for shard in ids]
    finally:
        if before is None:
            os.environ.pop("PLANET_SHARD_PATH", None)
        else:
            os.environ["PLANET_SHARD_PATH"] = before
    if path is not None:
        assert all(shard.model.path == path for shard in shards)
    head = ClientHead.load(manifest, "cpu")
    return Pipeline(head, shards, [PrefixCache(s, 64 * 1024**2) for s in shards])


@pytest.fixture(scope="module", params=["smollm2-135m-3p-none", "smollm2-135m-3p-int8"])
def pipeline(request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    yield _pipeline(request.param)


def test_a_cached_prompt_is_its_cold_prefill_on_every_hop(pipeline: Pipeline) -> None:
    system = pipeline.head.encode(SYSTEM)[:96]
    ids = system + pipeline.head.encode(" What is the capital of France?")
    cold_tokens, cold = pipeline.ask(ids, cached=False)
    first_tokens, first = pipeline.ask(ids, cached=True)  # a miss: fills the caches
    assert all(p.stats.hit_positions == 0 for p in pipeline.prefix)
    hit_tokens, hit = pipeline.ask(ids, cached=True)
    reused = 16 * (len(ids) // 16)
    for prefix in pipeline.prefix:  # every hop reused its own blocks (the chain matched)
        assert prefix.stats.hit_positions == reused
    # the same prompt sent cold in two frames cut where the cached blocks end
    chunked_tokens, chunked = pipeline.ask(ids, cached=False, split=reused)
    assert cold_tokens == first_tokens == hit_tokens == chunked_tokens
    for hop in range(len(pipeline.shards)):
        assert np.array_equal(first[hop], cold[hop])
        # positions served from cache: byte for byte the cold prefill's outputs
        assert np.array_equal(hit[hop][:, :reused], cold[hop][:, :reused]), f"hop {hop}"
        # the rest: byte for byte a cold prefill chunked at the same position (a prompt in two
        # frames), within float rounding of the one-frame prefill
        assert np.array_equal(hit[hop], chunked[hop]), f"hop {hop}: not the chunked prefill"
        np.testing.assert_allclose(hit[hop], cold[hop], rtol=1e-4, atol=1e-4)

    # another question behind the same system prompt: its shared blocks come from the cache
    # (byte for byte what the first question's prefill computed), the rest is computed
    other = system + pipeline.head.encode(" Name one primary colour.")
    other_cold_tokens, other_cold = pipeline.ask(other, cached=False)
    hits_before = pipeline.prefix[0].stats.hit_positions
    other_tokens, other_hit = pipeline.ask(other, cached=True)
    shared = pipeline.prefix[0].stats.hit_positions - hits_before
    assert shared == 16 * (96 // 16)
    assert other_tokens == other_cold_tokens
    for hop in range(len(pipeline.shards)):
        assert np.array_equal(other_hit[hop][:, :shared], first[hop][:, :shared])
        np.testing.assert_allclose(other_hit[hop], other_cold[hop], rtol=1e-4, atol=2e-3)
    _spot_checks_pass(pipeline, other, other_hit)


def _spot_checks_pass(pipeline: Pipeline, ids: list[int], served: list[np.ndarray]) -> None:
    """What a verifier does with a ticket (docs/verification.md §2): recompute every hop over
    the inputs it was sent, in one prefill, and judge the committed fingerprints of what it
    sent on (cached positions included) with the calibrated tolerance of its quant."""
    import torch

    from node.verifier.calibration import load_calibration
    from node.verifier.fingerprint import check, fingerprint_bytes

    calibration = load_calibration()
    inputs = pipeline.head.embed_np(ids).reshape(1, len(ids), -1)
    for shard, out in zip(pipeline.shards, served, strict=True):
        own = shard.forward(inputs, np.arange(len(ids), dtype=np.int64), shard.new_cache())
        data = fingerprint_bytes(torch.from_numpy(out), 0)
        verdict = check(data, torch.from_numpy(own), 0, calibration.tolerance(shard.quant))
        assert verdict.passed, (shard.shard_id, verdict)
        inputs = out


def test_the_hf_path_reuses_blocks_too() -> None:
    pipeline = _pipeline("smollm2-135m-3p-none", path="hf", parts=1)
    ids = pipeline.head.encode(SYSTEM)[:40] + pipeline.head.encode(" Hello there.")
    _, cold = pipeline.ask(ids, cached=False, new=0)
    pipeline.ask(ids, cached=True, new=0)
    _, hit = pipeline.ask(ids, cached=True, new=0)
    reused = 16 * (len(ids) // 16)
    _, chunked = pipeline.ask(ids, cached=False, new=0, split=reused)
    assert pipeline.prefix[0].stats.hit_positions == reused
    assert np.array_equal(hit[0][:, :reused], cold[0][:, :reused])
    assert np.array_equal(hit[0], chunked[0])


def test_a_long_prompt_whose_cache_grew_is_reused() -> None:
    """Past 256 positions a session's buffers grow inside the forward (inference tensors), and
    the pool hands them to the next session: blocks are copied into them all the same."""
    pipeline = _pipeline("smollm2-135m-3p-none", parts=1)
    ids = (pipeline.head.encode(SYSTEM) * 3)[:300]
    _, cold = pipeline.ask(ids, cached=False, new=0)
    pipeline.ask(ids, cached=True, new=0)
    _, hit = pipeline.ask(ids, cached=True, new=0)
    assert pipeline.prefix[0].stats.hit_positions == 288
    assert np.array_equal(hit[0][:, :288], cold[0][:, :288])


# ------------------------------------------------------------------------------ bookkeeping
class KVFake(FakeShard):
    """The fake shard with KV blocks to copy: its cache lists the positions it holds."""

    def export_kv(self, cache: FakeCache, start: int, end: int) -> list[int]:
        assert len(cache.positions) >= end
        return cache.positions[start:end]

    def import_kv(self, cache: FakeCache, block: list[int]) -> None:
        assert block[0] == len(cache.positions)
        cache.positions.extend(block)


def _frame(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, rows, 8)).astype(np.float32)


def _prefill(prefix: PrefixCache, hidden: np.ndarray, salt: str | None = None) -> FakeCache:
    cache = FakeCache()
    out = prefix.forward(prefix.chain(salt), hidden, 0, cache)
    assert np.array_equal(out, hidden + 1) and cache.positions == list(range(hidden.shape[1]))
    return cache


def test_blocks_are_reused_only_for_the_same_inputs_and_salt() -> None:
    shard = KVFake()
    prefix = PrefixCache(shard, 10**6, block=4)
    prompt = _frame(10)
    _prefill(prefix, prompt)
    assert len(prefix) == 2 and prefix.stats.hit_positions == 0
    calls = shard.calls
    _prefill(prefix, prompt)
    assert prefix.stats.hit_positions == 8 and shard.calls == calls + 1  # rows 8, 9 computed
    changed = prompt.copy()
    changed[0, 5, 0] += 1e-6  # one value of the second block
    _prefill(prefix, changed)
    assert prefix.stats.hit_positions == 12  # only the first block matched
    _prefill(prefix, prompt, salt="a-user-of-its-own-salt-0001")  # isolated: no hit
    assert prefix.stats.hit_positions == 12
    _prefill(prefix, prompt, salt="a-user-of-its-own-salt-0001")  # its own blocks: hits
    assert prefix.stats.hit_positions == 20


def test_chunked_prefill_continues_the_chain_and_decode_ends_it() -> None:
    shard = KVFake()
    prefix = PrefixCache(shard, 10**6, block=4)
    prompt = _frame(12)
    chain, cache = prefix.chain(), FakeCache()
    for start in (0, 3, 6):  # chunks that cut blocks: the partial rows carry over
        prefix.forward(chain, prompt[:, start : start + 3], start, cache)
    assert len(prefix) == 2 and chain.blocks == 2 and chain.pending == 1
    prefix.forward(chain, prompt[:, 9:10], 9, cache)  # one position: a decode step
    assert not chain.live
    prefix.forward(chain, prompt[:, 10:12], 10, cache)
    assert len(prefix) == 2 and cache.positions == list(range(12))
    second = FakeCache()
    out = prefix.forward(prefix.chain(), prompt, 0, second)
    assert np.array_equal(out, prompt + 1) and prefix.stats.hit_positions == 8


def test_the_budget_evicts_a_chain_from_its_end() -> None:
    shard = KVFake(bytes_per_position=96)  # a block: 4 × (96 + 4 × 8) = 512 bytes
    prefix = PrefixCache(shard, 3 * 512, block=4)
    first, second = _frame(8, seed=1), _frame(8, seed=2)
    _prefill(prefix, first)
    _prefill(prefix, second)  # 4 blocks do not fit: the first prompt's last block goes
    assert len(prefix) == 3 and prefix.bytes == 3 * 512 and prefix.stats.evicted_blocks == 1
    _prefill(prefix, first)
    assert prefix.stats.hit_positions == 4  # its first block is still there
    assert PrefixCache(shard, 100, block=4).block_bytes > 100
    tiny = PrefixCache(shard, 100, block=4)
    _prefill(tiny, first)
    assert len(tiny) == 0 and tiny.bytes == 0  # a block over the whole budget is not kept


# ------------------------------------------------------------------------------ on the wire
async def _ask(client: Any, prompt: list[int]) -> list[int]:
    from tests.unit.fake_head import FakeHead

    gen = client.generate(FakeHead(), prompt, max_new_tokens=3, stop_on_eos=False)
    return [t async for t in gen]


async def test_a_circuit_reuses_prompt_blocks_and_isolated_users_share_only_their_own(
    aiohttp_server,
):
    from node.client.capabilities import new_session_id
    from node.client.circuit import CircuitClient
    from node.server.app import STATE_KEY
    from node.server.config import ServerConfig
    from tests.unit.fake_head import H
    from tests.unit.stream_circuit import serve_circuit

    nodes = [
        (
            ServerConfig(manifest_path=Path("x"), shard_id=s),
            KVFake(shard_id=s, hidden_size=H, layers=(2 * s, 2 * s + 2)),
        )
        for s in range(2)
    ]
    servers, hops = await serve_circuit(aiohttp_server, nodes)
    caches = [server.app[STATE_KEY].prefix for server in servers]
    prompt = list(range(1, 40))  # 39 positions: 2 full blocks of 16
    async with CircuitClient(hops, hidden_size=H) as client:
        first = await _ask(client, prompt)
        assert [c.stats.hit_positions for c in caches] == [0, 0]
        assert await _ask(client, prompt) == first
        assert [c.stats.hit_positions for c in caches] == [32, 32]  # every hop reused
    isolation = new_session_id()
    async with CircuitClient(hops, hidden_size=H, prefix_isolation=isolation) as client:
        assert await _ask(client, prompt) == first
        assert [c.stats.hit_positions for c in caches] == [32, 32]  # not the shared blocks
        assert await _ask(client, prompt) == first
        assert [c.stats.hit_positions for c in caches] == [64, 64]  # its own
    async with aiohttp.ClientSession() as http, http.get(f"{hops[0].url}/info") as answer:
        summary = (await answer.json())["prefix_cache"]
    assert summary["hit_positions"] == 64 and summary["blocks"] == 4
    assert summary["block_positions"] == 16 and summary["bytes"] == caches[0].bytes


def test_an_open_with_a_malformed_salt_is_refused_by_name() -> None:
    import json

    from protocol.frames.errors import FrameError
    from protocol.stream import open_message, parse_control

    good = open_message(1, "c" * 43, 0, None, None, prefix="s" * 43)
    assert parse_control(json.dumps(good), frozenset({"open"})).prefix == "s" * 43
    assert parse_control(json.dumps({**good, "prefix": None}), frozenset({"open"})).prefix is None
    plain = open_message(1, "c" * 43, 0, None, None)
    assert "prefix" not in plain and parse_control(json.dumps(plain), frozenset({"open"}))
    for bad in ("short", "é" * 30, 7, ["s" * 43], "s" * 65):
        with pytest.raises(FrameError) as refused:
            parse_control(json.dumps({**good, "prefix": bad}), frozenset({"open"}))
        assert refused.value.code == "bad_control"
    with pytest.raises(FrameError, match="exactly the fields"):
        parse_control(json.dumps({**good, "salt": "s" * 43}), frozenset({"open"}))
