"""The node's pool of next-hop links (node/server/link_pool.py) with in-process fake WebSockets:
one dial per next hop however many sessions use it, warm targets dialled ahead and again after
a drop, a dead link never handed out, idle links closed, the pool bounded, and a link lost
before `attached` failing the attach as LinkLostError (the open then attaches again)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from node.server.link_pool import DownLink, LinkLostError, LinkPool, WarmTarget
from protocol.stream import DownstreamError

pytestmark = pytest.mark.unit

A = ("http://127.0.0.1:1001", None)
B = ("http://127.0.0.1:1002", None)
C = ("https://10.0.0.7:18100", "ab" * 32)


class FakeWs:
    """A dialled WebSocket: records what is sent; the test answers or drops it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.closed = False
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()

    def __aiter__(self) -> FakeWs:
        return self

    async def __anext__(self) -> Any:
        item = await self._inbox.get()
        if item is None:
            self.closed = True
            raise StopAsyncIteration
        return item

    async def send_json(self, data: Any) -> None:
        if self.closed:
            raise ConnectionResetError("closed")
        self.sent.append(data)

    async def send_bytes(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("closed")
        self.sent.append(data)

    async def close(self) -> None:
        self.drop()

    def answer(self, op: str, sid: int) -> None:
        body: dict[str, Any] = {"op": op, "sid": sid}
        if op == "error":
            body |= {"code": "bad_feed", "message": "no"}
        text = json.dumps(body)
        self._inbox.put_nowait(SimpleNamespace(type=aiohttp.WSMsgType.TEXT, data=text))

    def drop(self) -> None:
        """The connection dies underneath (the peer went away)."""
        self.closed = True
        self._inbox.put_nowait(None)


class Dialer:
    def __init__(self, fail: set[tuple[str, str | None]] | None = None) -> None:
        self.dials: list[tuple[str, str | None]] = []
        self.sockets: list[FakeWs] = []
        self.fail = fail or set()

    async def __call__(self, url: str, key: str | None) -> FakeWs:
        if (url, key) in self.fail:
            raise DownstreamError(f"cannot reach next hop {url}: ClientConnectorError")
        self.dials.append((url, key))
        ws = FakeWs()
        self.sockets.append(ws)
        return ws


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pool(dial: Dialer, clock: Clock | None = None, **kwargs: Any) -> LinkPool:
    return LinkPool(dial, clock=clock or Clock(), **kwargs)


async def test_one_dial_per_next_hop_and_key_shared_by_every_session() -> None:
    dial = Dialer()
    pool = _pool(dial)
    links = [await pool.get(*A) for _ in range(5)]
    assert all(link is links[0] for link in links)
    other_key = await pool.get(A[0], "cd" * 32)  # the pin is part of the link's identity
    assert other_key is not links[0]
    assert dial.dials == [A, (A[0], "cd" * 32)]
    assert pool.stats.dialled == 2 and len(pool) == 2
    sid1, _ = await links[0].attach("f" * 43)
    sid2, _ = await links[1].attach("g" * 43)
    assert (sid1, sid2) == (1, 2)  # sessions are told apart by sid on the shared link
    await pool.close()


async def test_a_dead_link_is_never_handed_out_and_is_dialled_again() -> None:
    dial = Dialer()
    pool = _pool(dial)
    first = await pool.get(*A)
    dial.sockets[0].drop()
    await asyncio.sleep(0)  # the reader sees the end
    assert first.closed and pool.link(*A) is None
    second = await pool.get(*A)
    assert second is not first and not second.closed
    assert pool.stats.dialled == 2
    await pool.close()


async def test_warm_targets_are_dialled_ahead_and_again_after_a_drop() -> None:
    dial = Dialer()

    async def targets() -> list[tuple[str, str | None]]:
        return [A, C]

    pool = _pool(dial, targets=targets)
    await pool.warm_round()
    assert dial.dials == [A, C] and pool.stats.warm_dialled == 2
    await pool.get(*A)  # a question finds it open: no dial
    assert pool.stats.dialled == 2
    dial.sockets[0].drop()
    await asyncio.sleep(0)
    await pool.warm_round()
    assert dial.dials == [A, C, A] and pool.link(*A) is not None
    await pool.close()


async def test_the_background_loop_redials_a_dropped_link_without_a_question() -> None:
    dial = Dialer()

    async def targets() -> list[tuple[str, str | None]]:
        return [A]

    pool = LinkPool(dial, targets=targets, refresh_s=60.0, min_round_s=0.01)
    pool.start()
    for _ in range(100):
        if pool.link(*A) is not None:
            break
        await asyncio.sleep(0.01)
    assert dial.dials == [A]
    dial.sockets[0].drop()  # woken at once, not after refresh_s
    for _ in range(300):
        if len(dial.dials) == 2 and pool.link(*A) is not None:
            break
        await asyncio.sleep(0.01)
    assert dial.dials == [A, A] and pool.link(*A) is not None
    await pool.close()
    assert dial.sockets[1].closed


async def test_a_next_hop_questions_used_is_kept_warm_then_forgotten_when_idle() -> None:
    dial, clock = Dialer(), Clock()
    pool = _pool(dial, clock, idle_s=300.0)
    await pool.get(*C)  # a question's next hop (an https key a client named)
    dial.sockets[0].drop()
    await asyncio.sleep(0)
    await pool.warm_round()
    assert pool.warm == (C,) and dial.dials == [C, C]  # dialled again before the next question
    clock.now += 301
    await pool.warm_round()
    assert pool.warm == () and pool.link(*C) is None and pool.stats.idle_closed == 1
    await pool.close()


async def test_a_failing_target_is_counted_and_does_not_stop_the_others() -> None:
    dial = Dialer(fail={A})

    async def targets() -> list[tuple[str, str | None]]:
        return [A, B]

    pool = _pool(dial, targets=targets)
    await pool.warm_round()
    assert pool.stats.dial_failures == 1 and pool.link(*B) is not None
    await pool.close()


async def test_idle_links_close_but_warm_targets_stay() -> None:
    dial, clock = Dialer(), Clock()

    async def targets() -> list[tuple[str, str | None]]:
        return [A]

    pool = _pool(dial, clock, targets=targets, idle_s=300.0)
    await pool.warm_round()
    await pool.get(*B)
    clock.now += 299
    await pool.warm_round()
    assert pool.link(*B) is not None
    clock.now += 2
    await pool.warm_round()
    assert pool.link(*B) is None and pool.link(*A) is not None
    assert pool.stats.idle_closed == 1
    await pool.close()


async def test_the_pool_is_bounded_idle_links_make_room_busy_ones_refuse() -> None:
    dial, clock = Dialer(), Clock()
    pool = _pool(dial, clock, max_links=2, max_warm=1, idle_s=300.0)
    first = await pool.get(*A)
    await pool.get(*B)
    with pytest.raises(DownstreamError, match="most next-hop links"):
        await pool.get(*C)  # both carried traffic just now
    clock.now += 400
    (await pool.get(*B)).last_used = clock.now  # B used again; A idle
    await pool.get(*C)
    assert first.closed and pool.link(*A) is None and pool.stats.evicted == 1
    assert len(pool) == 2
    await pool.close()


async def test_warm_targets_are_capped() -> None:
    dial = Dialer()
    many = [(f"http://127.0.0.1:{2000 + i}", None) for i in range(10)]

    async def targets() -> list[tuple[str, str | None]]:
        return many

    pool = _pool(dial, targets=targets, max_links=8, max_warm=3)
    await pool.warm_round()
    assert dial.dials == many[:3] and len(pool) == 3
    await pool.close()


async def test_a_link_lost_before_attached_fails_the_attach_as_link_lost() -> None:
    ws = FakeWs()
    link = DownLink("http://127.0.0.1:1001", ws, lambda _n: None)
    sid, answer = await link.attach("f" * 43)
    ws.drop()
    with pytest.raises(LinkLostError):
        await link.wait_attached(sid, answer)
    with pytest.raises(LinkLostError):  # a closed link refuses a new attach at once
        await link.attach("g" * 43)


async def test_a_refused_attach_is_not_a_lost_link() -> None:
    ws = FakeWs()
    link = DownLink("http://127.0.0.1:1001", ws, lambda _n: None)
    sid, answer = await link.attach("f" * 43)
    ws.answer("error", sid)
    with pytest.raises(DownstreamError, match="refused: bad_feed") as refused:
        await link.wait_attached(sid, answer)
    assert not isinstance(refused.value, LinkLostError)
    sid, answer = await link.attach("g" * 43)
    ws.answer("attached", sid)
    await link.wait_attached(sid, answer)
    await link.close()


async def test_a_target_that_cannot_be_dialled_is_tried_again_soon_not_after_refresh() -> None:
    dial = Dialer(fail={A})

    async def targets() -> list[tuple[str, str | None]]:
        return [A]

    pool = LinkPool(dial, targets=targets, refresh_s=60.0, min_round_s=0.01)
    pool.start()
    for _ in range(100):
        if pool.stats.dial_failures:
            break
        await asyncio.sleep(0.01)
    dial.fail.clear()  # the next hop is back (a proxy re-enabled, a node restarted)
    for _ in range(300):
        if pool.link(*A) is not None:
            break
        await asyncio.sleep(0.01)
    assert pool.link(*A) is not None and pool.stats.warm_dialled == 1
    await pool.close()


async def test_a_warm_target_behind_nat_is_dialled_at_its_second_relay_when_the_first_is_down():
    """A warm target with other addresses (a node behind NAT: its ports at its other relays)
    is dialled there, pinned to the same key, when its first address is down; an open that
    names its first address (and the others as alternates) finds that link: no dial."""
    first, second = "https://10.0.0.7:44001", "https://10.0.0.8:44002"
    key = "ab" * 32
    dial = Dialer(fail={(first, key)})

    async def targets() -> list[WarmTarget]:
        return [WarmTarget(first, key, (second,))]

    pool = _pool(dial, targets=targets)
    assert await pool.warm_round()  # reached: nothing missed
    assert dial.dials == [(second, key)] and pool.stats.warm_dialled == 1
    assert pool.info()["warm_targets"] == 1
    link = await pool.reach((first, second), key)
    assert link is pool.link(second, key) and dial.dials == [(second, key)]
    assert pool.stats.dialled == 1
    await pool.close()


async def test_a_question_next_hop_behind_nat_is_kept_warm_at_all_its_addresses() -> None:
    """A next hop a question reached at its second relay stays a warm target with both
    addresses (not its dead first address alone): after the link drops, the warm round
    dials it at the second again."""
    first, second = "https://10.0.0.7:44001", "https://10.0.0.8:44002"
    key = "ab" * 32
    dial = Dialer(fail={(first, key)})
    pool = _pool(dial)
    await pool.reach((first, second), key)
    dial.sockets[0].drop()
    await asyncio.sleep(0)
    assert await pool.warm_round()
    assert pool.warm == ((first, key), (second, key))
    assert dial.dials == [(second, key), (second, key)] and pool.link(second, key) is not None
    await pool.close()
