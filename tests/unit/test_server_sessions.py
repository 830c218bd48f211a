"""SessionStore: contiguous growth, caps and idle eviction, with an injected clock."""

from __future__ import annotations

import pytest

from node.server.sessions import SessionStore
from protocol.errors import BusyError
from protocol.frames.errors import BadPositionsError

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


def test_store_open_holds_nothing_until_a_frame_advances_it():
    store = _store(Clock())
    session = store.open("s-00000001", cache=object())
    assert len(store) == 1 and session.length == 0 and store.total_cache_bytes == 0
    store.check_start(session, 0)
    with pytest.raises(BadPositionsError):
        store.check_start(session, 4)


def test_store_advance_requires_contiguous_start():
    store = _store(Clock())
    session = store.open("s-00000001", cache=object())
    store.advance(session, 5, cache_bytes=500)
    store.check_start(session, 5)
    with pytest.raises(BadPositionsError):
        store.check_start(session, 4)
    with pytest.raises(BadPositionsError):
        store.check_start(session, 6)


def test_store_idle_session_evicted_after_timeout_only():
    clock = Clock()
    store = _store(clock)
    session = store.open("s-00000001", cache=object())
    clock.now = 299.0
    assert store.evict_idle() == []
    clock.now = 301.0
    assert store.evict_idle() == ["s-00000001"]
    assert "s-00000001" not in store and session.cache is None  # its frames: session_expired


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


def test_store_close_frees_the_cache_once():
    store = _store(Clock())
    session = store.open("s-00000001", cache=object())
    assert store.close("s-00000001")
    assert session.cache is None and len(store) == 0
    assert not store.close("s-00000001")


def test_store_peer_quota_refuses_one_caller_not_another():
    from node.server.sessions import PeerQuotaError

    store = _store(Clock(), max_sessions=4, max_sessions_per_peer=2)
    for i in range(2):
        store.reserve(1, new_session=True, peer="10.0.0.1")
        store.open(f"tag-a{i}", cache=object(), peer="10.0.0.1")
    with pytest.raises(PeerQuotaError) as caught:
        store.reserve(1, new_session=True, peer="10.0.0.1")
    assert caught.value.code == "busy" and caught.value.http_status == 429
    assert store.reserve(1, new_session=True, peer="10.0.0.2") == []


def test_store_full_node_reclaims_idle_session_of_biggest_caller_only():
    clock = Clock()
    store = _store(clock, max_sessions=3, reclaim_idle_s=30.0)
    store.open("tag-a0", cache=object(), peer="a")
    clock.now = 10.0
    store.open("tag-a1", cache=object(), peer="a")
    store.open("tag-b0", cache=object(), peer="b")
    clock.now = 20.0
    with pytest.raises(BusyError):  # nothing idle for 30 s yet
        store.reserve(1, new_session=True, peer="c")
    clock.now = 35.0
    assert store.reserve(1, new_session=True, peer="c") == ["tag-a0"]  # a holds the most
    store.open("tag-c0", cache=object(), peer="c")
    clock.now = 100.0
    with pytest.raises(BusyError):  # a, b and c hold one each: no one holds more than c
        store.reserve(1, new_session=True, peer="c")
    assert "tag-a0" not in store


def test_store_session_older_than_age_cap_evicted_even_if_used():
    clock = Clock()
    store = _store(clock, max_session_age_s=100.0)
    session = store.open("tag-old", cache=object())
    for now in (50.0, 99.0, 101.0):
        clock.now = now
        store.touch(session)
    assert store.evict_idle() == ["tag-old"]


def test_peer_key_groups_ipv6_by_64_and_unwraps_mapped_ipv4():
    from node.server.peers import UNKNOWN_PEER, peer_key

    assert peer_key("2001:db8::1") == peer_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert peer_key("2001:db8:0:1::1") != peer_key("2001:db8::1")
    assert peer_key("::ffff:10.0.0.1") == "10.0.0.1" == peer_key("10.0.0.1")
    assert peer_key(None) == peer_key("") == peer_key("not-an-ip") == UNKNOWN_PEER


def test_malformed_http_log_record_becomes_one_info_line():
    import logging
    import sys

    from aiohttp.http_exceptions import BadHttpMessage

    from node.http_logs import MalformedHttpLogFilter

    try:
        raise BadHttpMessage("Invalid method encountered:\n\n  b'BREW / HTTP/1.1'")
    except BadHttpMessage:
        record = logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request",
            (),
            sys.exc_info(),
        )
    assert MalformedHttpLogFilter().filter(record)
    assert record.levelno == logging.INFO and record.exc_info is None
    assert "\n" not in record.getMessage() and "BadHttpMessage" in record.getMessage()
