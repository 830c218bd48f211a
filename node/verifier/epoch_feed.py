"""The committee's current epoch, read by one task per verifier process, for the others to wait on.

The worker's `follow` task reads `/epochs` every poll and publishes what it reads; the spot
checker waits for the next epoch here instead of reading `/epochs` every second itself (on the
verification devnet's 4 verifiers that was ~4 committee queries a second for nothing).

    feed = EpochFeed(poll_s=0.5)
    feed.publish(epoch)                          # the follower, after each read
    await feed.wait_past(seen, stop, timeout_s)  # a waiter: a later epoch, a stop, or the timeout
    feed.recent()                                # the last reading, None when none is recent

A waiter compares epochs, not a flag it clears: an epoch published while it was busy wakes it
at once (nothing is lost between its work and its wait).
"""

from __future__ import annotations

import asyncio
import contextlib

STALE_POLLS = 10  # a reading older than 10 of the follower's polls is not trusted (it failed)


class EpochFeed:
    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s  # how often the follower reads
        self.current: int | None = None  # the highest epoch read so far
        self._read_at = 0.0  # loop time of the last reading
        self._changed = asyncio.Event()  # replaced by a fresh one at each new epoch

    def publish(self, epoch: int) -> None:
        """Record one reading of the committee's epoch; a later epoch wakes the waiters."""
        self._read_at = asyncio.get_running_loop().time()
        if self.current is None or epoch > self.current:
            self.current = epoch
            self._changed.set()
            self._changed = asyncio.Event()

    def recent(self) -> int | None:
        """The current epoch when the follower read it within STALE_POLLS polls, else None
        (the caller reads `/epochs` itself)."""
        age = asyncio.get_running_loop().time() - self._read_at
        fresh = age <= self.poll_s * STALE_POLLS
        return self.current if fresh else None

    async def wait_past(self, epoch: int, stop: asyncio.Event, timeout_s: float) -> None:
        """Return once an epoch after `epoch` is published (at once if one already was), `stop`
        is set, or `timeout_s` has passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not stop.is_set() and (self.current is None or self.current <= epoch):
                    changed = asyncio.ensure_future(self._changed.wait())
                    stopped = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait((changed, stopped), return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
                        stopped.cancel()
