"""The personal client's relay list kept fresh (node/client/relay_refresh.py): `/relays` read
again on a jittered interval (an injected clock here) and when a relay is unreachable; new
questions draw from the fresh list, the guards are kept while listed, and a read that fails
keeps the last good list. The committee is an in-process fake serving `/relays` pages."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from node.client.overlay import OverlayRoute
from node.client.relay_guards import RelayGuards
from node.client.relay_refresh import MIN_GAP_S, RelayRefresh
from planet.main import main
from protocol.errors import RemoteError, UnavailableError
from protocol.overlay import Hop

pytestmark = pytest.mark.unit


def url(i: int) -> str:
    return f"http://198.51.{i}.1:9100"


def hop(i: int) -> Hop:
    return Hop(url(i), bytes([i]) * 32)


class FakeCommittee:
    """`/relays`, one page, listing the relays numbered in `listed`; or failing as told."""

    def __init__(self, listed: list[int]) -> None:
        self.listed = listed
        self.answer: Any = None  # a page to give instead of the listing (a malformed one)
        self.error: Exception | None = None
        self.asked = 0

    async def query(self, path: str) -> Any:
        assert path.startswith("/relays?")
        self.asked += 1
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer
        entries = [{"endpoint": url(i), "relay_key": (bytes([i]) * 32).hex()} for i in self.listed]
        return {"relays": entries, "next": None}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(
    listed: list[int], *, guards: RelayGuards | None = None, interval_s: float = 60.0
) -> tuple[OverlayRoute, RelayRefresh, FakeCommittee, Clock]:
    route = OverlayRoute(tuple(hop(i) for i in listed), paths=2, needed=2, length=2, guards=guards)
    clock = Clock()
    refresh = RelayRefresh(route, interval_s=interval_s, jitter=0.0, clock=clock)
    return route, refresh, FakeCommittee(listed), clock


def drawn(route: OverlayRoute, times: int = 50) -> set[str]:
    return {relay.url for _ in range(times) for path in route.draw() for relay in path}


async def test_a_relay_dropped_from_the_list_is_not_drawn_after_the_refresh() -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4, 5])
    assert url(1) in drawn(route, 200)
    committee.listed = [2, 3, 4, 5]
    await refresh.refresh(committee.query)
    assert url(1) not in drawn(route, 200)


async def test_a_relay_that_joins_is_drawn_after_the_refresh() -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4])
    assert url(9) not in drawn(route)
    committee.listed = [1, 2, 3, 4, 9]
    await refresh.refresh(committee.query)
    assert url(9) in drawn(route, 200)


async def test_links_already_drawn_keep_their_paths() -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4])
    before = route.draw()
    committee.listed = [5, 6, 7, 8]
    await refresh.refresh(committee.query)
    assert {r.url for path in before for r in path} == {url(i) for i in (1, 2, 3, 4)}
    assert drawn(route) == {url(i) for i in (5, 6, 7, 8)}


async def test_guards_are_kept_while_listed_and_replaced_when_they_leave() -> None:
    guards = RelayGuards(None)
    route, refresh, committee, _ = setup([1, 2, 3, 4, 5, 6, 7, 8], guards=guards)
    entries = [path[0].url for path in route.draw()]
    others = [i for i in range(1, 9) if url(i) not in entries]
    committee.listed = [i for i in range(1, 9) if i != others[0]] + [20, 21]  # one left, two new
    await refresh.refresh(committee.query)
    for _ in range(20):
        assert [path[0].url for path in route.draw()] == entries
    gone = int(entries[0].split(".")[2])
    committee.listed = [i for i in committee.listed if i != gone]
    await refresh.refresh(committee.query)
    for _ in range(20):
        now = [path[0].url for path in route.draw()]
        assert now[0] != entries[0] and now[1] == entries[1]


@pytest.mark.parametrize(
    ("error", "answer", "listed", "why"),
    [
        (UnavailableError("committee RPC unreachable"), None, [1], "unavailable"),
        (RemoteError("http://v:1", "query_1", "abci_query /relays: failed"), None, [1], "query_1"),
        (OSError("connection refused"), None, [1], "OSError"),
        (None, {"relays": "many"}, [1], "relays_answer_malformed"),
        (None, {"relays": [], "next": "not a key"}, [1], "relays_answer_malformed"),
        (None, None, [], "lists no relay"),
        (None, None, [1, 2, 3], "distinct relays"),  # too few for 2 paths of 2
    ],
)
async def test_a_failed_refresh_keeps_the_last_good_list(
    error: Exception | None, answer: Any, listed: list[int], why: str, caplog
) -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4, 5])
    committee.error, committee.answer, committee.listed = error, answer, listed
    with caplog.at_level(logging.WARNING, logger="node.client.relay_refresh"):
        await refresh.refresh(committee.query)
    assert route.relays == tuple(hop(i) for i in (1, 2, 3, 4, 5))
    assert drawn(route, 200) == {url(i) for i in (1, 2, 3, 4, 5)}
    [line] = [r.getMessage() for r in caplog.records if r.name == "node.client.relay_refresh"]
    assert line.startswith("relays: refresh failed") and why in line
    assert "keeping the 5 relays" in line and refresh.failures == 1
    committee.error, committee.answer, committee.listed = None, None, [1, 2, 3, 4]
    await refresh.refresh(committee.query)  # the next good read is taken
    assert drawn(route) == {url(i) for i in (1, 2, 3, 4)}


def test_a_malformed_entry_is_refused_without_voiding_the_others(caplog) -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4, 5])

    async def query(path: str) -> Any:
        page = await committee.query(path)
        page["relays"].insert(1, {"endpoint": "http://relay.example:1", "relay_key": "00"})
        return page

    committee.listed = [1, 2, 3, 4]
    asyncio.run(refresh.refresh(query))
    assert drawn(route) == {url(i) for i in (1, 2, 3, 4)} and refresh.failures == 0
    assert any("refused relays[1]" in r.getMessage() for r in caplog.records)


async def test_the_interval_is_honoured_with_an_injected_clock() -> None:
    _, refresh, committee, clock = setup([1, 2, 3, 4])
    clock.now += 59.9
    assert not await refresh.tick(committee.query) and committee.asked == 0
    clock.now += 0.1
    assert await refresh.tick(committee.query) and committee.asked == 1
    clock.now += 30
    assert not await refresh.tick(committee.query) and committee.asked == 1
    clock.now += 30
    assert await refresh.tick(committee.query) and committee.asked == 2


def test_the_jitter_keeps_each_wait_within_its_bounds() -> None:
    route = OverlayRoute(tuple(hop(i) for i in (1, 2, 3, 4)), paths=2, needed=2, length=2)
    clock = Clock()
    waits = set()
    for seed in range(50):
        refresh = RelayRefresh(route, jitter=0.1, clock=clock, rng=random.Random(seed))
        waits.add(refresh.next_at - clock.now)
    assert all(54 <= wait <= 66 for wait in waits) and len(waits) > 40


class FailedLink:
    failed_paths = 1

    def suspects(self) -> set[str]:
        return {url(1)}


async def test_an_unreachable_relay_asks_for_a_read_soon_but_not_at_once() -> None:
    route, refresh, committee, clock = setup([1, 2, 3, 4, 5])
    route.report(FailedLink())  # type: ignore[arg-type]
    assert refresh.next_at == clock.now + MIN_GAP_S
    assert not await refresh.tick(committee.query)
    clock.now += MIN_GAP_S
    assert await refresh.tick(committee.query) and committee.asked == 1


async def test_run_reads_again_until_cancelled() -> None:
    route, refresh, committee, _ = setup([1, 2, 3, 4])
    loop = asyncio.get_running_loop()
    refresh = RelayRefresh(route, interval_s=0.02, jitter=0.0, clock=loop.time)
    committee.listed = [5, 6, 7, 8]
    task = asyncio.create_task(refresh.run(committee.query))
    await asyncio.sleep(0.15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert committee.asked >= 2 and drawn(route) == {url(i) for i in (5, 6, 7, 8)}


async def test_a_read_failing_as_a_bug_is_logged_and_the_loop_reads_again(caplog) -> None:
    """An error `refresh` does not name (here a ValueError from the committee answer's code)
    is logged with its traceback; the loop goes on and takes the next good read."""
    route, _, committee, _ = setup([1, 2, 3, 4])
    loop = asyncio.get_running_loop()
    refresh = RelayRefresh(route, interval_s=0.02, jitter=0.0, clock=loop.time)
    committee.error = ValueError("a bug")
    task = asyncio.create_task(refresh.run(committee.query))
    with caplog.at_level(logging.ERROR, logger="node.client.relay_refresh"):
        await asyncio.sleep(0.1)
        committee.error, committee.listed = None, [5, 6, 7, 8]
        await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert any("refresh pass failed" in r.getMessage() and r.exc_info for r in caplog.records)
    assert drawn(route) == {url(i) for i in (5, 6, 7, 8)}


@pytest.mark.parametrize("seconds", ["0", "soon", "1e9", "nan", "\u0666\u0660"])  # ٦٠: not ASCII
def test_a_bad_refresh_interval_is_a_usage_error(seconds: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["gateway", "serve", "--personal", "--relays", "chain", "--relays-refresh", seconds])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "from 1 to 86400" in err and "Traceback" not in err


def test_a_relays_file_is_never_refreshed(capsys) -> None:
    code = main(["gateway", "serve", "--personal", "--relays", "r.txt", "--relays-refresh", "30"])
    err = capsys.readouterr().err
    assert code == 2 and "a relays file is read once" in err and "Traceback" not in err


def test_a_hosted_gateway_refuses_relays_refresh(capsys) -> None:
    code = main(["gateway", "serve", "--relays-refresh", "30"])
    err = capsys.readouterr().err
    assert code == 2 and "--relays-refresh are a personal client's" in err
