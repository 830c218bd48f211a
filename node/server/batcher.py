"""The shard's compute queue: continuous batching, fair across callers, bounded.

Every frame a node computes (from a circuit's link, node/server/stream.py) becomes one work item
here. One driver task feeds the single forward worker thread:
- decode items (one new position of a session) waiting together run as **one batched
  forward** (`backend.forward_batch`), up to `max_batch` sessions: the weights are read once
  for all of them, which is what lets a node serve many sessions at about the cost of one;
- a prefill chunk (several positions of one session) runs alone;
- the first item of a batch is granted round-robin across callers (FIFO within one), and the
  rest of a decode batch is filled one item per caller per round, so a caller with many queued
  frames delays another caller by at most one batch;
- at most `max_queued` items wait; one more is refused at once with `busy` (503) instead of
  growing memory (`QueueFullError`).

A session never has two items queued (its handler holds the session lock while it waits), so
the items of one batch always belong to distinct sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.errors import BusyError


class QueueFullError(BusyError):
    """The node's compute queue is full: back-pressure, not a failure."""

    http_status = 503


@dataclass(eq=False)
class _Item:
    hidden: np.ndarray  # [1, T, H] float32
    start: int
    cache: Any
    future: asyncio.Future[tuple[np.ndarray, float]]
    chain: Any = None  # the session's PrefixChain (node/server/prefix_cache.py), if cached

    @property
    def decode(self) -> bool:
        return self.hidden.shape[1] == 1


@dataclass
class BatchStats:
    batches: int = 0  # forward calls on the worker
    rows: int = 0  # items computed (a batch of 8 decode steps counts 8)
    largest_batch: int = 0
    busy_s: float = 0.0  # worker time spent computing
    decode_batches: int = 0  # of the forward calls: decode steps (batched or not)
    decode_s: float = 0.0  # worker time spent on them (a client's cost model reads it)


@dataclass
class Batcher:
    backend: Any  # node.server.backend.ShardBackend
    executor: Executor
    max_batch: int = 32
    max_queued: int = 256
    prefix: Any = None  # node.server.prefix_cache.PrefixCache: prefills reuse cached blocks
    stats: BatchStats = field(default_factory=BatchStats)
    _waiting: OrderedDict[str, deque[_Item]] = field(default_factory=OrderedDict)
    _driver: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def run(
        self, caller: str, cache: Any, hidden: np.ndarray, start: int, chain: Any = None
    ) -> tuple[np.ndarray, float]:
        """Compute `hidden` [1, T, H] at positions start.. on `cache`; (output, seconds the
        forward call that computed it took). With the session's prefix `chain` (and a prefix
        cache), a prefill's leading cached blocks are copied instead of computed."""
        if self.queued >= self.max_queued:
            raise QueueFullError(
                f"compute queue full ({self.max_queued} frames waiting)",
                hint="retry in a moment or use another node for this shard",
            )
        future: asyncio.Future[tuple[np.ndarray, float]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting.setdefault(caller, deque()).append(_Item(hidden, start, cache, future, chain))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive())
        return await future

    def _next_of(self, caller: str, *, decode_only: bool) -> _Item | None:
        """Pop `caller`'s first live item (its first decode item if `decode_only`)."""
        queue = self._waiting[caller]
        for item in list(queue):
            if item.future.done():  # cancelled while waiting
                queue.remove(item)
                continue
            if decode_only and not item.decode:
                continue
            queue.remove(item)
            return item
        return None

    def _pick(self) -> list[_Item]:
        batch: list[_Item] = []
        while self._waiting and not batch:
            caller = next(iter(self._waiting))
            self._waiting.move_to_end(caller)  # its next item waits for the others' turn
            item = self._next_of(caller, decode_only=False)
            if item is not None:
                batch.append(item)
            self._drop_empty()
        if batch and batch[0].decode:
            taken = True
            while taken and len(batch) < self.max_batch:
                taken = False
                for caller in list(self._waiting):
                    if len(batch) >= self.max_batch:
                        break
                    item = self._next_of(caller, decode_only=True)
                    if item is not None and all(item.cache is not b.cache for b in batch):
                        batch.append(item)
                        taken = True
                    elif item is not None:  # same session twice: put it back
                        self._waiting[caller].appendleft(item)
                self._drop_empty()
        return batch

    def _drop_empty(self) -> None:
        for caller in [c for c, q in self._waiting.items() if not q]:
            del self._waiting[caller]

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            batch = self._pick()
            if not batch:
                continue
            try:
                outputs, seconds = await loop.run_in_executor(self.executor, self._compute, batch)
            except Exception as error:
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            self.stats.batches += 1
            self.stats.rows += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            self.stats.busy_s += seconds
            if batch[0].decode:
                self.stats.decode_batches += 1
                self.stats.decode_s += seconds
            for item, out in zip(batch, outputs, strict=True):
                if not item.future.done():
                    item.future.set_result((out, seconds))

    def _compute(self, batch: list[_Item]) -> tuple[list[np.ndarray], float]:
        """Worker thread."""
        t0 = time.perf_counter()
        if len(batch) == 1 and self.prefix is not None and batch[0].chain is not None:
            item = batch[0]
            outputs = [self.prefix.forward(item.chain, item.hidden, item.start, item.cache)]
        elif len(batch) == 1:
            item = batch[0]
            positions = np.arange(item.start, item.start + item.hidden.shape[1], dtype=np.int64)
            outputs = [self.backend.forward(item.hidden, positions, item.cache)]
        else:
            for item in batch:  # decode steps end a session's prefix chain
                if item.chain is not None:
                    item.chain.end()
            hidden = np.concatenate([item.hidden for item in batch])  # [B, 1, H]
            positions = np.array([item.start for item in batch], dtype=np.int64)
            out = self.backend.forward_batch(hidden, positions, [item.cache for item in batch])
            outputs = [out[b : b + 1] for b in range(len(batch))]
        return outputs, time.perf_counter() - t0
