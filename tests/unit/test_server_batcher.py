"""Batcher: decode steps waiting together run as one batch; prefill chunks alone; the first
item of each batch is granted round-robin across callers; a full queue answers busy."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from node.server.batcher import Batcher, QueueFullError
from protocol.errors import BusyError
from tests.doubles.fake_shard import FakeCache, FakeShard

pytestmark = pytest.mark.unit

H = 8


class _GatedShard(FakeShard):
    """Blocks every forward until `gate` is set; records each call's first values."""

    def __init__(self) -> None:
        super().__init__(hidden_size=H)
        self.gate = threading.Event()
        self.calls_seen: list[list[float]] = []

    def forward(self, hidden, positions, cache):
        self.calls_seen.append([float(hidden[0, 0, 0])])
        self.gate.wait(5)
        return super().forward(hidden, positions, cache)

    def forward_batch(self, hidden, positions, caches):
        self.calls_seen.append([float(v) for v in hidden[:, 0, 0]])
        self.batch_sizes.append(len(caches))
        self.gate.wait(5)
        rows = [  # the plain fake's forward: one recorded call per batch, not per row
            FakeShard.forward(self, hidden[b : b + 1], positions[b : b + 1], c)
            for b, c in enumerate(caches)
        ]
        return np.concatenate(rows)


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `condition` (the batcher's queue, the shard's calls) until it holds, at most
    `timeout_s`: the event these tests wait on, not a guess at how long it takes."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the batcher never got there"
        await asyncio.sleep(0.002)


def _rows(value: float, rows: int = 1) -> np.ndarray:
    return np.full((1, rows, H), value, dtype=np.float32)


async def test_batcher_decode_steps_waiting_together_run_as_one_batch() -> None:
    shard = _GatedShard()
    batcher = Batcher(shard, ThreadPoolExecutor(1), max_batch=8)
    first = asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(0.0, 3), 0))
    await _until(lambda: len(shard.calls_seen) == 1)  # the prefill computes (blocked on the gate)
    caches = [FakeCache(positions=[0, 1]) for _ in range(5)]
    rest = [
        asyncio.ensure_future(batcher.run(f"c{i % 2}", caches[i], _rows(10.0 + i), 2))
        for i in range(5)
    ]
    await _until(lambda: batcher.queued == 5)
    shard.gate.set()
    await first
    outputs = await asyncio.gather(*rest)
    assert shard.batch_sizes == [5]  # one batched forward for the 5 decode steps
    assert [float(out[0, 0, 0]) for out, _ in outputs] == [11.0 + i for i in range(5)]
    assert all(c.positions == [0, 1, 2] for c in caches)
    assert batcher.stats.batches == 2 and batcher.stats.rows == 6


async def test_batcher_first_item_round_robin_across_callers_fifo_within_one() -> None:
    shard = _GatedShard()
    batcher = Batcher(shard, ThreadPoolExecutor(1), max_batch=8)
    jobs = [asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(0.0, 2), 0))]
    await _until(lambda: len(shard.calls_seen) == 1)
    for i in range(1, 4):  # a's queued prefills, then one each from b and c
        jobs.append(asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(float(i), 2), 0)))
    jobs.append(asyncio.ensure_future(batcher.run("b", FakeCache(), _rows(10.0, 2), 0)))
    jobs.append(asyncio.ensure_future(batcher.run("c", FakeCache(), _rows(20.0, 2), 0)))
    await _until(lambda: batcher.queued == 5)
    shard.gate.set()
    await asyncio.gather(*jobs)
    assert [c[0] for c in shard.calls_seen] == [0.0, 1.0, 10.0, 20.0, 2.0, 3.0]


async def test_batcher_full_queue_answers_busy_and_keeps_serving() -> None:
    shard = _GatedShard()
    batcher = Batcher(shard, ThreadPoolExecutor(1), max_batch=4, max_queued=3)
    running = asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(0.0, 2), 0))
    await _until(lambda: len(shard.calls_seen) == 1)
    queued = [asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(1.0), 0)) for _ in range(3)]
    await _until(lambda: batcher.queued == 3)
    with pytest.raises(QueueFullError) as refused:
        await batcher.run("b", FakeCache(), _rows(2.0), 0)
    assert isinstance(refused.value, BusyError) and refused.value.code == "busy"
    assert batcher.queued == 3  # bounded: the refused frame took no memory in the queue
    shard.gate.set()
    await asyncio.gather(running, *queued)
    out, _ = await batcher.run("b", FakeCache(), _rows(2.0), 0)
    assert float(out[0, 0, 0]) == 3.0


async def test_batcher_cancelled_waiter_is_skipped() -> None:
    shard = _GatedShard()
    batcher = Batcher(shard, ThreadPoolExecutor(1))
    running = asyncio.ensure_future(batcher.run("a", FakeCache(), _rows(0.0, 2), 0))
    await _until(lambda: len(shard.calls_seen) == 1)
    gone_cache = FakeCache()
    gone = asyncio.ensure_future(batcher.run("b", gone_cache, _rows(5.0, 2), 0))
    await _until(lambda: batcher.queued == 1)
    gone.cancel()
    shard.gate.set()
    await running
    out, _ = await batcher.run("c", FakeCache(), _rows(1.0, 2), 0)
    assert float(out[0, 0, 0]) == 2.0 and gone_cache.positions == []
