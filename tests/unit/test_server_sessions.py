"""SessionStore: contiguous growth, caps and idle eviction, with an injected clock."""

from __future__ import annotations

import pytest

from node.server.sessions import SessionStore
from protocol.errors import BusyError
from protocol.frames import BadPositionsError, SessionExpiredError, UnknownSessionError

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _store(clock: Clock, **over: float) -> SessionStore:
    kw = {"max_sessions": 2, "max_cache_bytes": 10_000, "idle_timeout_s": 300.0}
    kw.update(over)
    return SessionStore(clock=clock, **kw)  # type: ignore[arg-type]


def test_store_lookup_new_id_at_zero_opens_nothing_yet():
    store = _store(Clock())
    assert store.lookup("s-00000001", 0) is None and len(store) == 0


def test_store_lookup_new_id_past_zero_is_unknown_session():
    with pytest.raises(UnknownSessionError):
        _store(Clock()).lookup("s-00000001", 4)


def test_store_advance_requires_contiguous_start():
    store = _store(Clock())
    session = store.open("s-00000001", cache=object())
    store.advance(session, 5, cache_bytes=500)
    assert store.lookup("s-00000001", 5) is session
    with pytest.raises(BadPositionsError):
        store.lookup("s-00000001", 4)
    with pytest.raises(BadPositionsError):
        store.lookup("s-00000001", 6)


def test_store_idle_session_evicted_after_timeout_only():
    clock = Clock()
    store = _store(clock)
    store.open("s-00000001", cache=object())
    clock.now = 299.0
    assert store.evict_idle() == []
    clock.now = 301.0
    assert store.evict_idle() == ["s-00000001"]
    with pytest.raises(SessionExpiredError):
        store.lookup("s-00000001", 0)


def test_store_recently_used_session_survives_eviction():
    clock = Clock()
    store = _store(clock)
    session = store.open("s-00000001", cache=object())
    clock.now = 200.0
    store.advance(session, 1, cache_bytes=100)
    clock.now = 400.0
    assert store.evict_idle() == [] and "s-00000001" in store


def test_store_reserve_session_cap_busy_then_idle_eviction_frees_room():
    clock = Clock()
    store = _store(clock)
    store.open("s-00000001", cache=object())
    store.open("s-00000002", cache=object())
    with pytest.raises(BusyError):
        store.reserve(1, new_session=True)
    clock.now = 1000.0
    store.reserve(1, new_session=True)  # both idle → evicted → room
    assert len(store) == 0


def test_store_reserve_cache_cap_uses_learned_bytes_per_position():
    store = _store(Clock())
    session = store.open("s-00000001", cache=object())
    store.reserve(100, new_session=False)  # nothing learned yet
    store.advance(session, 10, cache_bytes=9_000)  # 900 B per position
    store.reserve(1, new_session=False)
    with pytest.raises(BusyError):
        store.reserve(2, new_session=False)


def test_store_close_forgets_when_asked():
    store = _store(Clock())
    store.open("s-00000001", cache=object())
    assert store.close("s-00000001", remember=False)
    assert store.lookup("s-00000001", 0) is None
    assert not store.close("s-00000001")
