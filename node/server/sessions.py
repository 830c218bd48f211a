"""Per-session KV caches on a node: open at position 0, advance contiguously, evict when idle.

A session id is random (chosen by the client); it names one KV cache on this node and nothing
else: no user, wallet or query id travels with it. The circuit is fixed per session: a session
lives on the node that opened it and only ever grows by the positions right after its cache.

The store is plain Python (clock injectable) so eviction and caps are unit-testable.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import BusyError
from protocol.frames import BadPositionsError, SessionExpiredError, UnknownSessionError

_EXPIRED_MEMORY = 4096  # how many evicted ids we remember, to answer session_expired


@dataclass(eq=False)
class Session:
    id: str
    cache: Any
    length: int = 0  # positions held in the cache: the next frame must start here
    cache_bytes: int = 0
    last_used_s: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionStore:
    """Open sessions, their caps, and the ids of recently evicted ones."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_cache_bytes: int,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_cache_bytes = max_cache_bytes
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._bytes_per_position = 0  # learned from the first forward

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    @property
    def total_cache_bytes(self) -> int:
        return sum(s.cache_bytes for s in self._sessions.values())

    def lookup(self, session_id: str, start: int) -> Session | None:
        """The session a frame at `start` continues, or None if the frame opens a new one."""
        session = self._sessions.get(session_id)
        if session is None:
            if session_id in self._expired:
                raise SessionExpiredError(session_id)
            if start != 0:
                raise UnknownSessionError(session_id)
            return None
        self.check_start(session, start)
        return session

    @staticmethod
    def check_start(session: Session, start: int) -> None:
        if start != session.length:
            raise BadPositionsError(
                f"session {session.id} holds {session.length} positions; "
                f"the next frame must start at {session.length}, not {start}"
            )

    def reserve(self, new_positions: int, *, new_session: bool) -> None:
        """Raise BusyError if `new_positions` more (in a new session or not) would exceed a cap."""
        self.evict_idle()
        if new_session and len(self._sessions) >= self.max_sessions:
            raise BusyError(
                f"node holds {len(self._sessions)} sessions (cap {self.max_sessions})",
                hint="retry later or use another node for this shard",
            )
        needed = self.total_cache_bytes + new_positions * self._bytes_per_position
        if needed > self.max_cache_bytes:
            raise BusyError(
                f"KV cache would reach {needed} bytes (cap {self.max_cache_bytes})",
                hint="retry later or use another node for this shard",
            )

    def open(self, session_id: str, cache: Any) -> Session:
        session = Session(id=session_id, cache=cache, last_used_s=self._clock())
        self._sessions[session_id] = session
        self._expired.pop(session_id, None)
        return session

    def advance(self, session: Session, count: int, cache_bytes: int) -> None:
        session.length += count
        session.cache_bytes = cache_bytes
        session.last_used_s = self._clock()
        if session.length:
            self._bytes_per_position = max(self._bytes_per_position, cache_bytes // session.length)

    def touch(self, session: Session) -> None:
        session.last_used_s = self._clock()

    def close(self, session_id: str, *, remember: bool = True) -> bool:
        """Drop a session; True if it was open. Remembered ids answer session_expired."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.cache = None
        if remember:
            self._expired[session_id] = None
            while len(self._expired) > _EXPIRED_MEMORY:
                self._expired.popitem(last=False)
        return True

    def evict_idle(self) -> list[str]:
        """Close sessions idle longer than the timeout (skipping busy ones); their ids."""
        now = self._clock()
        stale = [
            s.id
            for s in self._sessions.values()
            if now - s.last_used_s > self.idle_timeout_s and not s.lock.locked()
        ]
        for session_id in stale:
            self.close(session_id)
        return stale
