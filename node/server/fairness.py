"""One compute slot shared fairly: granted round-robin across callers, FIFO within a caller.

The forward pass runs on one worker thread. A plain FIFO in front of it lets one caller with
many queued frames (big prefills) delay everybody else by all of them; here a waiting caller is
served after at most one frame of each other waiting caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairSlot:
    """`async with slot.held(caller):` runs the body with the single slot held."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def held(self, caller: str) -> AsyncIterator[None]:
        await self._acquire(caller)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, caller: str) -> None:
        if not self._busy and not self._waiting:
            self._busy = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # granted just as we were cancelled: pass it on
            else:
                self._forget(caller, future)
            raise

    def _forget(self, caller: str, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(caller)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(future)
            if not queue:
                del self._waiting[caller]

    def _release(self) -> None:
        """Hand the slot to the oldest waiter of the next caller in turn, or free it."""
        while self._waiting:
            caller, queue = next(iter(self._waiting.items()))
            future = queue.popleft()
            if queue:
                self._waiting.move_to_end(caller)  # this caller's next frame waits its turn
            else:
                del self._waiting[caller]
            if not future.done():
                future.set_result(None)
                return
        self._busy = False
