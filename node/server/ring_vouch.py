"""The last hop's vouches for one ring session (protocol/ring_vouch.py).

    writer = VouchWriter(sid, send)         the session was opened `back` with `vouch: true`
    writer.add(position, row_body)          an output went back up: its last row's digest
    writer.stop()                           the session closed

Whatever is ready goes to the client in one message (at most MAX_VOUCHES, in position order)
on the client's own link to this hop, as ring tokens go from the first hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from protocol.ring_vouch import MAX_VOUCHES, pack_ring_vouch, row_digest


class VouchWriter:
    """One session's vouches to its client (module docstring)."""

    def __init__(self, sid: int, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.sid = sid
        self.send = send
        self._ready: list[tuple[int, bytes]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, position: int, row: bytes) -> None:
        """The row at `position` went back up the circuit: vouch for it."""
        self._ready.append((position, row_digest(row)))
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._write())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _write(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready:
                batch, self._ready = self._ready[:MAX_VOUCHES], self._ready[MAX_VOUCHES:]
                await self.send(pack_ring_vouch(self.sid, batch))
