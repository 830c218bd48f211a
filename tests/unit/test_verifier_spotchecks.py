"""The verifier's live spot checks (node/verifier/spotchecks.py): which checks it owes from
the chain's epoch record and commitments, and what it does with a node that sends no ticket
(TIMEOUT → the vote callback with offence 4, counts written)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest
from nacl.signing import SigningKey

from node.chain.committee_pages import BadPage
from node.verifier.epoch_feed import STALE_POLLS, EpochFeed
from node.verifier.spotchecks import COUNTS_FILE, SpotChecker, assignments
from protocol.committee.verification import SpotCheckReport
from protocol.fingerprint import Tolerance
from protocol.spotcheck import Outcome, Triple, assign_verifier, evidence_hash
from protocol.tickets import TicketRequest

pytestmark = pytest.mark.unit

ME = SigningKey(b"\x21" * 32)
OTHER = SigningKey(b"\x22" * 32)
NODE = "ab" * 32
SEED = "cd" * 32


def _hex(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def _outranking_me() -> SigningKey:
    """A verifier key that `assign_verifier` prefers to ME for both blocks `_Link` serves:
    with it, ME is in the epoch's verifier set but assigned nothing (it only re-judges)."""
    triples = [Triple(NODE, "0x" + f"{i:064x}", 0, 1) for i in range(2)]
    for seed in range(0x22, 0x80):
        key = SigningKey(bytes([seed]) * 32)
        both = [_hex(key), _hex(ME)]
        if all(assign_verifier(SEED, t, both) == _hex(key) for t in triples):
            return key
    raise AssertionError("no key outranks ME on both blocks")


PEER = _outranking_me()


def _commitments(n: int, height: int = 7) -> list[dict]:
    return [
        {"node": NODE, "session": "0x" + f"{i:064x}", "step": 0, "shard": 1,
         "height": height, "commitment": "0x" + "11" * 32}
        for i in range(n)
    ]  # fmt: skip


def test_assignments_split_the_epochs_commitments_between_the_fixed_verifiers() -> None:
    record = {"epoch": 3, "seed": SEED, "verifiers": [_hex(ME), _hex(OTHER)]}
    records = _commitments(40) + _commitments(5, height=3) + ["junk", {"height": 7}]
    mine = assignments(record, records, epoch=2, epoch_length=5, me=_hex(ME), rate_ppm=10**6)
    theirs = assignments(record, records, epoch=2, epoch_length=5, me=_hex(OTHER), rate_ppm=10**6)
    assert len(mine) + len(theirs) == 40 and mine and theirs  # epoch 1's five are not checked
    assert not {a.triple for a in mine} & {a.triple for a in theirs}
    assert all(a.seed == "0x" + SEED and a.commitment == b"\x11" * 32 for a in mine)
    none_rate = assignments(record, records, epoch=2, epoch_length=5, me=_hex(ME), rate_ppm=0)
    assert none_rate == []
    outsider = assignments(
        {**record, "verifiers": [_hex(OTHER)]}, records, epoch=2, epoch_length=5, me=_hex(ME),
        rate_ppm=10**6,
    )  # fmt: skip
    assert outsider == []
    no_set = assignments({"seed": SEED}, records, epoch=2, epoch_length=5, me=_hex(ME))
    assert no_set == []


class _Link:
    """The committee queries SpotChecker makes, answered from fixed data."""

    def __init__(self, endpoint: str, verifiers: tuple[SigningKey, ...] = (ME,)) -> None:
        self.key = ME
        self.endpoint = endpoint
        self.sent: list[object] = []
        self.verifiers = [_hex(k) for k in verifiers]
        self.verdicts: list[dict] = []  # unconfirmed verdict votes on chain

    async def send(self, body: object, *, timeout_s: float = 15) -> tuple[int, str]:
        self.sent.append(body)
        return 0, ""

    async def query(self, path: str, **params: object) -> dict:
        if path == "/params":
            return {"genesis": {"epoch_length": 5}}
        if path == "/epochs":
            if params.get("epoch") == 3:
                return {"epochs": [{"epoch": 3, "seed": SEED, "verifiers": self.verifiers}]}
            return {"current": 3, "epochs": []}
        if path == "/commitments":
            return {"commitments": _commitments(2)}
        if path == "/coverage":
            return {"node": NODE, "shards": [{"shard": 1, "blocks": {"2": 2}}]}
        if path == "/verdicts":
            return {"verdicts": self.verdicts}
        raise AssertionError(path)

    async def nodes(self) -> list[dict]:
        return [{"key": NODE}]

    async def node(self, key: str) -> dict:
        return {"key": key, "endpoint": self.endpoint, "evm_address": "0x" + "00" * 20}


def _checker(link: _Link, http: aiohttp.ClientSession, vote: object, home: Path) -> SpotChecker:
    """A checker of every selected block (rate 10^6) with the strictest tolerance."""
    return SpotChecker(
        link, [object(), object()], Tolerance(1, 1000, 0), http, vote, home=home, rate_ppm=10**6
    )  # type: ignore[arg-type]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_node_that_sends_no_ticket_is_voted_for_a_timeout(tmp_path: Path) -> None:
    votes = []

    async def vote(result, node_key, epoch) -> None:
        votes.append((result, node_key, epoch))

    link = _Link(f"http://127.0.0.1:{_closed_port()}")
    async with aiohttp.ClientSession() as http:
        checker = SpotChecker(
            link, [object(), object()],
            Tolerance(max_ulp=1, min_match_per_mille=1000, max_mean_ulp_milli=0), http, vote,
            home=tmp_path, rate_ppm=10**6, deadline_s=0.3, retry_s=0.1,
        )  # fmt: skip
        results = await checker.check_epoch(2)
    assert [r.outcome for r in results] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    assert [(n, e) for _, n, e in votes] == [(NODE, 2)]  # one verdict per node and epoch
    triple = Triple(NODE, "0x" + f"{0:064x}", 0, 1)
    assert votes[0][0].evidence_hash == evidence_hash(SEED, triple, Outcome.TIMEOUT)
    assert json.loads((tmp_path / COUNTS_FILE).read_text()) == {"2": {"timeout": 2}}
    [sent] = link.sent  # the epoch's report lists both checks (a timeout is a check done)
    assert isinstance(sent, SpotCheckReport) and sent.epoch == 2
    assert [c[1] for c in sent.checks] == ["0x" + f"{i:064x}" for i in range(2)]


async def test_a_failed_check_is_voted_over_an_earlier_timeout(tmp_path: Path) -> None:
    """Per node and epoch one vote: the first FAILED check (50 %) beats a TIMEOUT (5 %) that
    came earlier in triple order; a second run of the epoch votes nothing more."""
    from node.verifier.tickets import _result

    votes = []

    async def vote(result, node_key, epoch) -> None:
        votes.append(result.outcome)

    link = _Link("http://127.0.0.1:1")
    async with aiohttp.ClientSession() as http:
        checker = _checker(link, http, vote, tmp_path)
        outcomes = iter([Outcome.TIMEOUT, Outcome.FAILED, Outcome.TIMEOUT, Outcome.FAILED])

        async def check(item):
            request = TicketRequest(item.triple, item.seed, _hex(ME))
            return _result(request, next(outcomes), "scripted")

        checker.check = check  # type: ignore[method-assign]
        await checker.check_epoch(2)
        assert votes == [Outcome.FAILED]
        await checker.check_epoch(2)  # judged tickets are not fetched again
    assert votes == [Outcome.FAILED]
    assert json.loads((tmp_path / COUNTS_FILE).read_text()) == {"2": {"failed": 1, "timeout": 1}}


async def test_peer_findings_are_rejudged_with_an_own_ticket_and_voted_when_confirmed(
    tmp_path: Path,
) -> None:
    """Both blocks are assigned to PEER; its FAILED vote on block 0 and TIMEOUT vote on block 1
    appear on chain. This verifier fetches its own tickets: block 0 fails here too → it votes the
    same verdict (same evidence, so the same id); block 1's ticket comes → no vote."""
    from node.verifier.tickets import _result

    votes = []

    async def vote(result, node_key, epoch) -> None:
        votes.append((result.outcome, result.evidence_hash, node_key, epoch))

    triples = [Triple(NODE, "0x" + f"{i:064x}", 0, 1) for i in range(2)]
    link = _Link("http://127.0.0.1:1", verifiers=(PEER, ME))
    async with aiohttp.ClientSession() as http:
        checker = _checker(link, http, vote, tmp_path)
        asked = []
        scripted = {triples[0]: Outcome.FAILED, triples[1]: Outcome.PASSED}

        async def check(item):
            asked.append(item.triple)
            request = TicketRequest(item.triple, item.seed, _hex(ME))
            return _result(request, scripted[item.triple], "scripted")

        checker.check = check  # type: ignore[method-assign]
        assert await checker.check_epoch(2) == []  # nothing assigned here
        assert await checker.rejudge() == []  # no peer finding yet
        failed = evidence_hash(SEED, triples[0], Outcome.FAILED)
        timed_out = evidence_hash(SEED, triples[1], Outcome.TIMEOUT)
        link.verdicts = [
            {"evidence_hash": "0x" + failed.hex()},
            {"evidence_hash": "0x" + timed_out.hex()},
            {"evidence_hash": "0x" + "00" * 32},  # not a selected check of these epochs
            "junk",
        ]
        results = await checker.rejudge()
        assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.PASSED]
        assert await checker.rejudge() == []  # each finding is re-judged once
    assert asked == triples
    assert votes == [(Outcome.FAILED, failed, NODE, 2)]


async def test_a_withheld_ticket_turns_the_rejudgement_into_a_timeout_vote(tmp_path: Path) -> None:
    """PEER found block 0 FAILED; the node withholds this verifier's ticket (TIMEOUT here): it
    votes its own finding, the timeout verdict on that block, once — so the committee's
    accusation of the node is on chain although the failed verdict cannot reach 2/3."""
    from node.verifier.tickets import _result

    votes = []

    async def vote(result, node_key, epoch) -> None:
        votes.append((result.outcome, result.evidence_hash, node_key, epoch))

    triple = Triple(NODE, "0x" + f"{0:064x}", 0, 1)
    link = _Link("http://127.0.0.1:1", verifiers=(PEER, ME))
    async with aiohttp.ClientSession() as http:
        checker = _checker(link, http, vote, tmp_path)

        async def check(item):
            request = TicketRequest(item.triple, item.seed, _hex(ME))
            return _result(request, Outcome.TIMEOUT, "scripted")

        checker.check = check  # type: ignore[method-assign]
        await checker.check_epoch(2)
        failed = evidence_hash(SEED, triple, Outcome.FAILED)
        timed_out = evidence_hash(SEED, triple, Outcome.TIMEOUT)
        link.verdicts = [{"evidence_hash": "0x" + failed.hex()}]
        await checker.rejudge()
        link.verdicts.append({"evidence_hash": "0x" + timed_out.hex()})  # its own, and peers'
        await checker.rejudge()
    assert votes == [(Outcome.TIMEOUT, timed_out, NODE, 2)]


async def test_a_verifier_running_late_leaves_old_findings_alone(tmp_path: Path) -> None:
    """A finding whose seed epoch the nodes may no longer ticket (CHECK_LOOKBACK_EPOCHS behind
    the committee) is not re-judged: a refused ticket would be a timeout accusation of a node
    that did nothing wrong. The same finding at an epoch still in reach is re-judged."""
    from node.verifier.spotchecks import too_late
    from node.verifier.tickets import _result
    from protocol.spotcheck import CHECK_LOOKBACK_EPOCHS, TICKET_LOOKBACK_EPOCHS

    assert CHECK_LOOKBACK_EPOCHS < TICKET_LOOKBACK_EPOCHS  # slack for the ticket's deadline
    late = 2 + 1 + CHECK_LOOKBACK_EPOCHS + 1  # epoch 2's checks use epoch 3's seed
    assert too_late(2, late) and not too_late(2, late - 1)

    votes = []

    async def vote(result, node_key, epoch) -> None:
        votes.append((result.outcome, node_key, epoch))

    triple = Triple(NODE, "0x" + f"{0:064x}", 0, 1)
    failed = evidence_hash(SEED, triple, Outcome.FAILED)
    asked = []

    async def check(item):
        asked.append(item.triple)
        return _result(TicketRequest(item.triple, item.seed, _hex(ME)), Outcome.TIMEOUT, "x")

    async def rejudged_at(current: int) -> list:
        link = _Link("http://127.0.0.1:1", verifiers=(PEER, ME))
        async with aiohttp.ClientSession() as http:
            checker = _checker(link, http, vote, tmp_path)
            checker.check = check  # type: ignore[method-assign]
            await checker.check_epoch(2)  # indexes the epoch's checks (none assigned here)
            link.verdicts = [{"evidence_hash": "0x" + failed.hex()}]
            return await checker.rejudge(current)

    assert await rejudged_at(late) == [] and asked == [] and votes == []
    results = await rejudged_at(late - 1)
    assert [r.outcome for r in results] == [Outcome.TIMEOUT] and asked == [triple]
    assert votes == [(Outcome.TIMEOUT, NODE, 2)]


async def test_a_verifier_outside_the_epochs_set_rejudges_nothing(tmp_path: Path) -> None:
    """A verifier whose seed commit missed the epoch is not in its set: the node refuses its
    tickets by rule, so it asks none and votes no timeout on a peer's finding."""
    votes: list[object] = []
    asked: list[object] = []

    async def vote(result, node_key, epoch) -> None:
        votes.append(result)

    async def check(item):
        asked.append(item.triple)
        raise AssertionError("a ticket asked outside the verifier set")

    triple = Triple(NODE, "0x" + f"{0:064x}", 0, 1)
    link = _Link("http://127.0.0.1:1", verifiers=(PEER,))
    async with aiohttp.ClientSession() as http:
        checker = _checker(link, http, vote, tmp_path)
        checker.check = check  # type: ignore[method-assign]
        assert await checker.check_epoch(2) == []
        failed = evidence_hash(SEED, triple, Outcome.FAILED)
        link.verdicts = [{"evidence_hash": "0x" + failed.hex()}]
        assert await checker.rejudge(3) == []
    assert asked == [] and votes == []


class _PagedLink(_Link):
    """`/commitments` in pages of 2 as the chain answers them (`next`: the last key of a full
    page); `repeat` answers the same page forever (a broken or hostile committee)."""

    def __init__(self, count: int, repeat: bool = False) -> None:
        super().__init__("http://127.0.0.1:1")
        self.records = _commitments(count)
        self.repeat = repeat
        self.asked: list[object] = []

    async def query(self, path: str, **params: object) -> dict:
        if path != "/commitments":
            return await super().query(path, **params)
        self.asked.append(params.get("after"))
        start = 0 if self.repeat or params.get("after") is None else int(str(params["after"]))
        page = self.records[start : start + 2]
        more = start + 2 < len(self.records)
        return {"commitments": page, "next": str(start + 2) if more or self.repeat else None}


async def test_the_checker_reads_every_page_of_a_nodes_commitments(tmp_path: Path) -> None:
    async def vote(*_args: object) -> None:
        raise AssertionError("no vote")

    async with aiohttp.ClientSession() as http:
        link = _PagedLink(count=5)
        checker = _checker(link, http, vote, tmp_path)  # type: ignore[arg-type]
        assert await checker._commitments_of(NODE) == link.records
        assert link.asked == [None, "2", "4"]
        # the same cursor twice (a broken or hostile committee): refused by name after two
        # pages, not a list silently cut short
        stuck = _PagedLink(count=5, repeat=True)
        with pytest.raises(BadPage, match="next"):
            await _checker(stuck, http, vote, tmp_path)._commitments_of(NODE)  # type: ignore[arg-type]
        assert len(stuck.asked) == 2


@pytest.mark.parametrize(
    "page",
    [
        {"next": None},  # no list
        {"commitments": "[]", "next": None},
        {"commitments": [1, 2], "next": None},  # rows that are not records
        {"commitments": [], "next": 7},  # a cursor that is not a key
        [],
    ],
)
async def test_a_malformed_commitments_page_is_refused_by_name(
    tmp_path: Path, page: object
) -> None:
    """A `/commitments` page that does not parse stops the epoch's checks by name (the pass is
    tried again), where it was read as an empty or last page before."""

    async def vote(*_args: object) -> None:
        raise AssertionError("no vote")

    class _Odd(_Link):
        async def query(self, path: str, **params: object) -> object:
            if path == "/commitments":
                return page
            return await super().query(path, **params)

    async with aiohttp.ClientSession() as http:
        checker = _checker(_Odd("http://127.0.0.1:1"), http, vote, tmp_path)  # type: ignore[arg-type]
        with pytest.raises(BadPage):
            await checker._commitments_of(NODE)


async def test_a_stop_cancels_an_epochs_checks_waiting_for_tickets(tmp_path: Path) -> None:
    """SIGTERM (`stop`) while the checks of epoch 2 wait for a node's tickets (deadline 30 s):
    `run` returns within a second, and the epoch is not counted as checked."""

    async def vote(result, node_key, epoch) -> None:
        raise AssertionError("no verdict from a cancelled check")

    link = _Link(f"http://127.0.0.1:{_closed_port()}")
    async with aiohttp.ClientSession() as http:
        checker = SpotChecker(
            link, [object(), object()],
            Tolerance(max_ulp=1, min_match_per_mille=1000, max_mean_ulp_milli=0), http, vote,
            home=tmp_path, rate_ppm=10**6, deadline_s=30, retry_s=0.1,
        )  # fmt: skip
        stop = asyncio.Event()
        running = asyncio.create_task(checker.run(stop))
        await asyncio.sleep(0.5)  # epoch 2's tickets are being fetched, in vain
        stop.set()
        await asyncio.wait_for(running, 1)
    assert checker.last_epoch == 1  # epoch 2 was not finished: not counted as checked
    assert link.sent == [] and not (tmp_path / COUNTS_FILE).exists()


class _CountingLink(_Link):
    """`_Link` at a committee epoch the test moves, counting the plain `/epochs` reads."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.current = 3
        self.epoch_reads = 0

    async def query(self, path: str, **params: object) -> dict:
        if path == "/epochs" and not params:
            self.epoch_reads += 1
            return {"current": self.current, "epochs": []}
        return await super().query(path, **params)


async def test_an_idle_spot_checker_waits_for_the_followers_next_epoch(tmp_path: Path) -> None:
    """Between epochs the spot checker reads no `/epochs` of its own (it read them every poll:
    with the worker's follower, 2 queries a poll per verifier), still checks an epoch that
    closes within a poll of the follower seeing it, and a stop ends it at once."""

    async def vote(result, node_key, epoch) -> None:
        raise AssertionError("nothing to vote on")

    poll_s = 0.05
    link = _CountingLink(f"http://127.0.0.1:{_closed_port()}")
    feed = EpochFeed(poll_s)
    stop = asyncio.Event()

    async def follow() -> None:  # the worker's `follow`, its own reads not counted here
        while True:
            feed.publish(link.current)
            await asyncio.sleep(poll_s)

    async with aiohttp.ClientSession() as http:
        checker = SpotChecker(
            link, [object(), object()], Tolerance(1, 1000, 0), http, vote, home=tmp_path,
            rate_ppm=10**6, poll_s=poll_s, epochs=feed,
        )  # type: ignore[arg-type]  # fmt: skip
        checker.last_epoch = 2  # epoch 2 already checked: nothing owed at epoch 3
        follower = asyncio.create_task(follow())
        running = asyncio.create_task(checker.run(stop))
        await asyncio.sleep(30 * poll_s)
        assert link.epoch_reads <= 1  # the old loop: ~30
        link.current = 4  # epoch 3 closes (its record has no verifier set here: nothing to do)
        for _ in range(40):
            if checker.last_epoch == 3:
                break
            await asyncio.sleep(poll_s / 5)
        assert checker.last_epoch == 3 and checker.seen == 4
        stop.set()
        await asyncio.wait_for(running, 0.5)
        follower.cancel()
    assert link.epoch_reads <= 1


async def test_an_epoch_feed_wakes_a_waiter_for_a_later_epoch_only(tmp_path: Path) -> None:
    """`wait_past`: at once for an epoch published before the wait (nothing lost), on the next
    epoch, not on a repeated one; `recent` forgets a reading the follower did not renew."""
    feed = EpochFeed(poll_s=0.01)
    stop = asyncio.Event()
    feed.publish(5)
    await asyncio.wait_for(feed.wait_past(4, stop, 10), 0.5)  # already past: at once
    waiting = asyncio.create_task(feed.wait_past(5, stop, 10))
    await asyncio.sleep(0.02)
    feed.publish(5)
    await asyncio.sleep(0.02)
    assert not waiting.done()  # the same epoch read again
    feed.publish(6)
    await asyncio.wait_for(waiting, 0.5)
    assert feed.recent() == 6
    await asyncio.sleep(0.01 * (STALE_POLLS + 2))
    assert feed.recent() is None  # the follower stopped reading: the caller reads itself
    stop.set()
    await asyncio.wait_for(feed.wait_past(6, stop, 10), 0.5)
