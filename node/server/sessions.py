"""Per-session KV caches on a node: open at position 0, advance contiguously, evict, share fairly.

A session is named by the client's capability for this hop (a random secret the client drew for
this node alone). The store never keeps the capability: it keys sessions by
`protocol.frames.sessions.session_tag(capability)` and logs only a prefix of that tag, so
neither a log nor a memory dump of one node lets anyone act on a session, and nothing a node
sees lets it name another hop's session. No user, wallet or query id travels with a session.

Fair share ("caller" = the peer address that opened the session; see node/server/peers.py):
- a caller holds at most `max_sessions_per_peer` sessions and `max_cache_bytes_per_peer` bytes
  of KV cache (429 busy), under the node-wide caps `max_sessions` / `max_cache_bytes` (503 busy);
- a session idle longer than `idle_timeout_s`, or older than `max_session_age_s`, is evicted;
- when the node is full, a newcomer may reclaim one session idle at least `reclaim_idle_s` from
  the caller holding the most (only if that caller holds more than the newcomer), so keeping
  slots with a 1-token frame every few minutes does not keep other callers out.
Evicted sessions answer `session_expired` (410) to their client, who can start over.

The store is plain Python (clock injectable) so eviction and caps are unit-testable.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import BusyError
from protocol.frames.errors import BadPositionsError

_BUSY_HINT = "retry later or use another node for this shard"


class PeerQuotaError(BusyError):
    """One caller (peer address) reached its share of the node; others still get sessions."""

    http_status = 429


def short_tag(tag: str) -> str:
    """What logs and messages show of a session tag."""
    return tag[:16]


@dataclass(eq=False)
class Session:
    tag: str  # session_tag(capability): the key, never the capability itself
    cache: Any
    peer: str = ""  # the caller charged for this session's slot and cache bytes
    length: int = 0  # positions held in the cache: the next frame must start here
    cache_bytes: int = 0
    pending_bytes: int = 0  # reserved for positions being computed (counted against the caps)
    prefix: Any = None  # its PrefixChain where the node has a prefix cache (prefix_cache.py)
    opened_s: float = 0.0
    last_used_s: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionStore:
    """Open sessions keyed by tag, their caps and per-caller shares."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_cache_bytes: int,
        idle_timeout_s: float,
        max_sessions_per_peer: int | None = None,
        max_cache_bytes_per_peer: int | None = None,
        max_session_age_s: float = float("inf"),
        reclaim_idle_s: float = float("inf"),
        bytes_per_position: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_cache_bytes = max_cache_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions_per_peer = min(max_sessions_per_peer or max_sessions, max_sessions)
        self.max_cache_bytes_per_peer = min(
            max_cache_bytes_per_peer or max_cache_bytes, max_cache_bytes
        )
        self.max_session_age_s = max_session_age_s
        self.reclaim_idle_s = reclaim_idle_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        # KV bytes per position: known from the shard up front (so even the first frame is
        # accounted before it is computed), else learned from the first forward
        self._bytes_per_position = bytes_per_position

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, tag: object) -> bool:
        return tag in self._sessions

    @property
    def total_cache_bytes(self) -> int:
        return sum(s.cache_bytes + s.pending_bytes for s in self._sessions.values())

    def peer_sessions(self, peer: str) -> int:
        return sum(1 for s in self._sessions.values() if s.peer == peer)

    def peer_cache_bytes(self, peer: str) -> int:
        return sum(
            s.cache_bytes + s.pending_bytes for s in self._sessions.values() if s.peer == peer
        )

    def peers(self) -> int:
        return len({s.peer for s in self._sessions.values()})

    @staticmethod
    def check_start(session: Session, start: int) -> None:
        if start != session.length:
            raise BadPositionsError(
                f"session {short_tag(session.tag)} holds {session.length} positions; "
                f"the next frame must start at {session.length}, not {start}"
            )

    def rewound(self, session: Session, length: int, cache_bytes: int) -> None:
        """The session's cache now holds `length` positions (the rest were dropped)."""
        session.length = length
        session.cache_bytes = cache_bytes

    # ------------------------------------------------------------------------------ capacity
    def reserve(
        self,
        new_positions: int,
        *,
        new_session: bool,
        peer: str = "",
        session: Session | None = None,
    ) -> list[str]:
        """Make room for `new_positions` more positions (in a new session of `peer` or not).
        With `session`, the room is held for it (`pending_bytes`) until `advance` or `release`,
        so frames computing at the same time cannot together overshoot the caps.

        Returns the tags of sessions reclaimed from other callers to make room; raises
        PeerQuotaError (429) when `peer` is over its own share, BusyError (503) when the node
        is full and nothing can be reclaimed."""
        self.evict_idle()
        reclaimed: list[str] = []
        if new_session:
            held = self.peer_sessions(peer)
            # a quota equal to the node's cap is the node's cap: answered 503 below
            if held >= self.max_sessions_per_peer < self.max_sessions:
                raise PeerQuotaError(
                    f"this address holds {held} sessions on the node "
                    f"(per-caller quota {self.max_sessions_per_peer})",
                    hint="close finished sessions, or ask the node operator to raise "
                    "max_sessions_per_peer for a gateway",
                )
            while len(self._sessions) >= self.max_sessions:
                victim = self._reclaimable(peer, by_bytes=False)
                if victim is None:
                    raise BusyError(
                        f"node holds {len(self._sessions)} sessions (cap {self.max_sessions})",
                        hint=_BUSY_HINT,
                    )
                self.close(victim)
                reclaimed.append(victim)
        extra = new_positions * self._bytes_per_position
        peer_bytes = self.peer_cache_bytes(peer)
        if peer_bytes + extra > self.max_cache_bytes_per_peer < self.max_cache_bytes:
            raise PeerQuotaError(
                f"this address's KV cache would reach {peer_bytes + extra} bytes "
                f"(per-caller quota {self.max_cache_bytes_per_peer})",
                hint="close finished sessions or send shorter prompts",
            )
        while self.total_cache_bytes + extra > self.max_cache_bytes:
            victim = self._reclaimable(peer, by_bytes=True)
            if victim is None:
                raise BusyError(
                    f"KV cache would reach {self.total_cache_bytes + extra} bytes "
                    f"(cap {self.max_cache_bytes})",
                    hint=_BUSY_HINT,
                )
            self.close(victim)
            reclaimed.append(victim)
        if session is not None:
            session.pending_bytes += extra
        return reclaimed

    def release(self, session: Session, positions: int) -> None:
        """Give back held room for positions that will not be computed."""
        session.pending_bytes = max(0, session.pending_bytes - positions * self._bytes_per_position)

    def _reclaimable(self, peer: str, *, by_bytes: bool) -> str | None:
        """A session `peer` may take over: the longest-idle session (idle >= reclaim_idle_s,
        not computing) of the caller holding the most (sessions or bytes), if that caller holds
        more than `peer` does."""
        usage: Counter[str] = Counter()
        for s in self._sessions.values():
            usage[s.peer] += s.cache_bytes if by_bytes else 1
        now = self._clock()
        mine = usage.get(peer, 0)
        for owner, amount in usage.most_common():
            if owner == peer or amount <= mine:
                continue
            idle = [
                s
                for s in self._sessions.values()
                if s.peer == owner
                and not s.lock.locked()
                and now - s.last_used_s >= self.reclaim_idle_s
            ]
            if idle:
                return min(idle, key=lambda s: s.last_used_s).tag
        return None

    # ------------------------------------------------------------------------------ life cycle
    def open(self, tag: str, cache: Any, peer: str = "") -> Session:
        now = self._clock()
        session = Session(tag=tag, cache=cache, peer=peer, opened_s=now, last_used_s=now)
        self._sessions[tag] = session
        return session

    def advance(self, session: Session, count: int, cache_bytes: int) -> None:
        self.release(session, count)
        session.length += count
        session.cache_bytes = cache_bytes
        session.last_used_s = self._clock()
        if session.length:
            self._bytes_per_position = max(self._bytes_per_position, cache_bytes // session.length)

    def touch(self, session: Session) -> None:
        session.last_used_s = self._clock()

    def close(self, tag: str) -> bool:
        """Drop a session (its cache too); True if it was open. A frame of it still on its way
        finds `session.cache` gone and answers session_expired."""
        session = self._sessions.pop(tag, None)
        if session is None:
            return False
        session.cache = None
        return True

    def evict_idle(self) -> list[str]:
        """Close sessions idle longer than the timeout or older than the age cap (skipping busy
        ones); their tags."""
        now = self._clock()
        stale = [
            s.tag
            for s in self._sessions.values()
            if not s.lock.locked()
            and (
                now - s.last_used_s > self.idle_timeout_s
                or now - s.opened_s > self.max_session_age_s
            )
        ]
        for tag in stale:
            self.close(tag)
        return stale
