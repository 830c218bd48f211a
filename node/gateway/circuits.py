"""The gateway's live `CircuitClient`s, one per circuit, shared by the questions routed there.

A circuit is the tuple of its hops ((url, shard, node key), in shard order): a client's links are
pinned to the keys it was dialled with (node/links.py), so another key is another client. Questions
on the same circuit share one client, so their sessions ride the same WebSockets and their decode
steps meet in one batch at every shard and at the LM head (one head object for all). A client whose
link died (a node stopped or restarted) is closed and dialled again by the next question; a client
that no question used for `idle_s` is closed by a reaper task; `close()` (gateway shutdown) closes
all. All links are dialled on the gateway's own aiohttp session (not closed here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from node.client.circuit import CircuitClient
from node.client.paying import CreditPayer
from node.client.types import Hop
from protocol.frames.dtypes import WIRE_DTYPE

log = logging.getLogger(__name__)

IDLE_S = 120.0
# Positions per prefill frame: a prompt goes in chunks, pipelined across the circuit's
# nodes (hop A computes chunk 2 while hop B computes chunk 1). A node counts a session's chunks
# once against the gateway's in-flight quota (`max_inflight_per_peer`, 16 sessions, the router's
# per-node limit) and at most MAX_SESSION_FRAMES of them; the client keeps ≤ 8 outstanding.
PREFILL_CHUNK = 64

CircuitKey = tuple[tuple[str, int, int, str | None], ...]


def circuit_key(hops: Sequence[Hop]) -> CircuitKey:
    return tuple((hop.url, hop.shard, hop.span.last, hop.key) for hop in hops)


@dataclass(eq=False)
class _Entry:
    client: CircuitClient
    users: int = 0
    last_used: float = 0.0


class CircuitPool:
    """Live CircuitClients keyed by circuit. `async with pool.use(hops) as client: ...`"""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        *,
        hidden_size: int,
        codec: str = "raw",
        dtype: str = WIRE_DTYPE,
        request_timeout_s: float = 60.0,
        idle_s: float = IDLE_S,
        prefill_chunk: int = PREFILL_CHUNK,
        payer: CreditPayer | None = None,
        overlay: Any = None,
    ) -> None:
        self.http = http
        # reach nodes through relay paths (node/client/overlay.py `OverlayRoute.dialer`)
        self.overlay = overlay
        self.payer = payer  # pays the charging nodes with credits (a personal client)
        self.hidden_size = hidden_size
        self.codec = codec
        self.dtype = dtype
        self.request_timeout_s = request_timeout_s
        self.idle_s = idle_s
        self.prefill_chunk = prefill_chunk
        self._entries: dict[CircuitKey, _Entry] = {}
        self._dialling: dict[CircuitKey, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.dials = 0  # clients connected so far (each dials one WebSocket per hop)

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def use(self, hops: Sequence[Hop]) -> AsyncIterator[CircuitClient]:
        """A live client for this circuit, held (not reaped) while the block runs."""
        entry = await self._get(circuit_key(hops), hops)
        entry.users += 1
        try:
            yield entry.client
        finally:
            entry.users -= 1
            entry.last_used = time.monotonic()

    async def _get(self, key: CircuitKey, hops: Sequence[Hop]) -> _Entry:
        if self._closed:
            raise RuntimeError("CircuitPool used after close()")
        entry = self._entries.get(key)
        if entry is not None and entry.client.alive:
            return entry
        async with self._dialling.setdefault(key, asyncio.Lock()):
            entry = self._entries.get(key)
            if entry is not None and entry.client.alive:
                return entry
            if entry is not None:  # a link died: its sessions failed already; dial again
                log.info("circuit link lost; reconnecting circuit=%s", [u for u, *_ in key])
                del self._entries[key]
                await entry.client.__aexit__()
            client = CircuitClient(
                hops,
                hidden_size=self.hidden_size,
                codec=self.codec,
                dtype=self.dtype,
                request_timeout_s=self.request_timeout_s,
                prefill_chunk=self.prefill_chunk,
                http=self.http,
                payer=self.payer,
                overlay=self.overlay,
            )
            await client.__aenter__()  # UnavailableError when a node cannot be reached
            self.dials += 1
            entry = self._entries[key] = _Entry(client, last_used=time.monotonic())
            self._start_reaper()
            return entry

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        while self._entries:
            await asyncio.sleep(max(self.idle_s / 4, 0.05))
            await self.reap()

    async def reap(self, now: float | None = None) -> int:
        """Close the clients nobody uses that sat idle `idle_s` or lost a link; how many."""
        now = time.monotonic() if now is None else now
        gone = [
            key
            for key, entry in self._entries.items()
            if entry.users == 0 and (now - entry.last_used >= self.idle_s or not entry.client.alive)
        ]
        for key in gone:
            entry = self._entries.pop(key)
            await entry.client.__aexit__()
        return len(gone)

    async def close(self) -> None:
        """Close every client (gateway shutdown); questions still running fail as unavailable."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            await entry.client.__aexit__()
