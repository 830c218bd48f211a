"""A node paid per chunk with bearer credits: it computes a session's positions only while the
credits paid for that session cover them (issue 28; protocol/stream.py `pay`, docs/credits.md).

    payments = Payments(positions=256, check=CreditCheck(link), spool=CreditSpool(dir))
    await payments.accept(account, credit)   checked as the chain will check its redemption,
                                             written to the spool (fsync), then the session's
                                             `account.paid` grows by `positions`
    await payments.cover(account, count)     returns once `paid` covers `count` more positions,
                                             waiting up to `wait_s` for a `pay` on its way;
                                             else PaymentRequiredError (the caller closes the
                                             session: a client that stops paying is stopped)
    payments.refund(account, count)          a frame refused as busy was not computed
    payments.give_back(account)              the session's open failed after credits came:
                                             they are not kept (returned, to be refused
                                             `credit_not_taken` by name; the client puts each
                                             back into its wallet)

**The spool** (`CreditSpool`, `--credits-dir`) is the hand-over to the node agent, which redeems
what is in it on the committee chain (`node.agent.credit_redeemer`) and removes what the chain
took or refused for good: one file `<spent id>.json` per credit, written to a dot-file, fsynced
and renamed, so a node that dies keeps every credit it was paid with, and a credit shown twice to
this node is refused by the file that is already there.

**What is checked before a credit counts** (`CreditCheck`, the chain's `credit_redeem` rules read
ahead, so a credit the node takes is one it can cash): its key period's window holds the
chain's epoch (its issue epoch + genesis `credits.lifetime_epochs`, published with
`/credit_keys`; the chain's time is read again at most every `refresh_s`); σ verifies under the
period's committee key (`/credit_period`, cached per period); the committee has not redeemed
it already (`/credit_spent`; a credit found spent is remembered, so a client replaying it costs
the validators one query, not one per pay), nor did this node take it before.
A bearer credit can still be shown to two nodes at once, so a credit taken is *provisional*
until the node's agent has locked it on the committee (node/server/credit_locks.py): a session
is served at most `unlocked` credits' positions beyond its credits whose lock this node won,
and is stopped `credit_double_spent` when another node locked one first (docs/credits.md, "One
credit pays one node, once").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from node.server.credit_locks import (
    LOCK_HEIGHT_POLL_S,
    LOCK_STALL_S,
    LOCK_WAIT_BLOCKS,
    LOST,
    UNLOCKED_CREDITS,
    WON,
    CreditDoubleSpentError,
    CreditLockTimeoutError,
    LockMarks,
)
from protocol import blind_bls, bls
from protocol.committee.credit_holder import assigned
from protocol.committee.grammar import HEX64, TxDecodeError
from protocol.credits import (
    NODE_MARGIN_BLOCKS,
    ChainClock,
    CreditExpiringError,
    clock_from_query,
    committed_height_from_query,
)
from protocol.errors import ProtocolError, RemoteError, UnavailableError
from protocol.paid_credits import (
    AssignedCredit,
    CreditInvalidError,
    PaidCredit,
    assigned_json,
    paid_redeemable,
    paid_takeable,
    paid_window_end,
    parse_assigned,
    spent_id,
    started,
)
from protocol.stream import CREDIT_NOT_ASSIGNED, PaymentRequiredError, not_assigned_message
from protocol.threshold_mint import PeriodKey

log = logging.getLogger(__name__)

PAY_WAIT_S = 5.0
EPOCH_REFRESH_S = 5.0
# the node's redemption delay in blocks: it takes a credit only while the chain will still
# redeem it this many blocks after its latest committed height (protocol/credits.py `takeable`;
# the agent's pass, the node's commitments landing, the redeem tx's own block, with room)
CREDIT_MARGIN_BLOCKS = NODE_MARGIN_BLOCKS
LOCK_POLL_S = 0.05  # how often a session waiting for a lock reads the agent's marks
MAX_KEY_PERIODS = 64  # key periods whose committee keys stay cached
MAX_SPENT_KNOWN = 1 << 16  # credits found redeemed on chain, refused again without a query
MAX_SEEN = 1 << 20  # spent ids remembered in memory (the spool and the chain remember the rest)


class CreditRefusedError(ProtocolError):
    """A credit this node will not take as pay: out of its redemption window, already redeemed
    on the committee chain, or already paid to this node."""

    code = "credit_refused"
    http_status = 402


class CreditNotAssignedError(CreditRefusedError):
    """A credit whose assignment its holder did not sign for this node (its committee key,
    model and shard): the chain would refuse this node's lock of it (CREDIT_NOT_ASSIGNED).
    Refused before the credit is taken, naming it by its spent id
    (`protocol.stream.not_assigned_message`), so its client can put it back in its wallet."""

    code = CREDIT_NOT_ASSIGNED

    def __init__(self, credit: PaidCredit, reason: str) -> None:
        super().__init__(not_assigned_message(spent_id(credit), reason))


class QueryLink(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...


@dataclass
class Account:
    """What one session on this node has paid for and used, in positions."""

    paid: int = 0
    used: int = 0
    credits: int = 0
    opened: bool = False  # `opened` sent: the credits are kept whatever happens next
    taken: list[PaidCredit] = field(default_factory=list)  # taken before `opened`
    # credits whose lock is not won yet (spent id → the committed height it was taken at):
    # node/server/credit_locks.py
    pending: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    # a span hop's session: one account per shard (node/server/span_payments.py)
    parts: dict[int, Account] = field(default_factory=dict)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class CreditCheck:
    """The chain's redemption rules for one credit, checked before the node takes it."""

    def __init__(
        self,
        link: QueryLink,
        *,
        refresh_s: float = EPOCH_REFRESH_S,
        margin_blocks: int = CREDIT_MARGIN_BLOCKS,
    ) -> None:
        if margin_blocks < 1:  # a redeem lands in the next block at the earliest
            raise ValueError("margin_blocks must be ≥ 1")
        self.link = link
        self.refresh_s = refresh_s
        self.margin_blocks = margin_blocks  # the node's redemption delay, in blocks
        self._period_keys: dict[int, PeriodKey] = {}  # key period → its committee key
        self._spent: dict[str, str] = {}  # spent id → why: redeemed, or locked, on the chain
        self._clock: ChainClock | None = None  # the chain's time at the last /credit_keys read
        self._epoch_at = float("-inf")
        self._height = -1  # the latest committed height any answer showed
        self._advanced_at = time.monotonic()  # when `_height` last grew

    def _note_height(self, height: int) -> None:
        if height > self._height:
            self._height = height
            self._advanced_at = time.monotonic()

    async def _read_clock(self) -> ChainClock:
        self._clock = clock_from_query(await self.link.query("/credit_keys"))
        self._epoch_at = time.monotonic()
        self._note_height(self._clock.height)
        return self._clock

    async def clock(self, at_least: int = 0) -> ChainClock:
        """The chain's time as last read (at most `refresh_s` old, or older than a credit of
        epoch `at_least`): for a quick refusal, never for the window's end."""
        stale = time.monotonic() - self._epoch_at > self.refresh_s
        if stale or self._clock is None or self._clock.epoch < at_least:
            return await self._read_clock()
        return self._clock

    async def chain_height(self, max_age_s: float) -> tuple[int, float]:
        """The latest committed height seen (`/credit_keys` read again when the last read is
        older than `max_age_s`) and the seconds since it last grew. A read that fails leaves
        both as they were: a chain nobody can read looks stopped."""
        if time.monotonic() - self._epoch_at > max_age_s:
            with contextlib.suppress(UnavailableError, RemoteError, ProtocolError):
                await self._read_clock()
        return self._height, time.monotonic() - self._advanced_at

    async def current_epoch(self, at_least: int = 0) -> int:
        return (await self.clock(at_least)).epoch

    async def _period_key(self, period: int) -> PeriodKey:
        if period not in self._period_keys:
            answer = await self.link.query("/credit_period", period=period)
            # NoPeriodKey (ask again later) or PeriodAnswerError: the credit is not taken
            self._period_keys[period] = PeriodKey.from_answer(answer, period=period)
            while len(self._period_keys) > MAX_KEY_PERIODS:
                del self._period_keys[next(iter(self._period_keys))]
        return self._period_keys[period]

    async def check(self, credit: PaidCredit) -> int:
        """The chain's rules for a credit: its period's window, σ under X_p, unspent. Returns
        the chain's latest committed height the credit was checked at."""
        cached = await self.clock()
        if cached.holder_bound and not isinstance(credit, AssignedCredit):
            raise CreditNotAssignedError(
                credit,
                "the committee takes a credit only with its holder's assignment to the node "
                "(a credit bought before holder keys cannot pay here)",
            )
        if not paid_redeemable(credit, cached):
            cached = await self.clock(at_least=cached.epoch + 1)  # the cache may lag: re-read
            if not paid_redeemable(credit, cached):
                raise CreditRefusedError(
                    f"a credit of key period {credit.period} is not redeemable in epoch "
                    f"{cached.epoch}"
                )
        key = await self._period_key(credit.period)
        try:
            blind_bls.verify_credit(key.key, credit)
        except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
            raise CreditInvalidError(f"the credit does not verify: {error.message}") from None
        return await self._check_unspent(credit, cached)

    async def _check_unspent(self, credit: PaidCredit, cached: ChainClock) -> int:
        identifier = spent_id(credit)
        refusal = self._spent.get(identifier)
        if refusal is None:
            answer = await self.link.query("/credit_spent", id=identifier)
            height = answer.get("height")
            locked_by = answer.get("locked_by")
            if locked_by is not None and not (
                isinstance(locked_by, str) and HEX64.match(locked_by)
            ):
                raise ProtocolError(f"/credit_spent: locked_by {locked_by!a} is not a node key")
            if height is not None:
                refusal = f"this credit was redeemed on the committee chain at height {height}"
            elif locked_by is not None:  # another node's, or given back after this one locked it
                refusal = f"this credit is locked on the committee chain by node {locked_by[:16]}…"
            else:  # the answer is the chain's time now: the window is read there
                now = max(committed_height_from_query(answer, "/credit_spent"), cached.height)
                self._note_height(now)
                check_window(credit, replace(cached, height=now), self.margin_blocks)
                return now
        # remembered: a client replaying a spent or locked credit costs one query
        if identifier not in self._spent and len(self._spent) >= MAX_SPENT_KNOWN:
            self._spent.clear()
        self._spent[identifier] = refusal
        raise CreditRefusedError(refusal)


def check_window(credit: PaidCredit, now: ChainClock, margin_blocks: int) -> None:
    """`takeable` at the chain's latest committed height `now.height` (as a validator just
    answered it, never a cache): CreditRefusedError when no later block redeems the credit (its
    window is over, or not begun), CreditExpiringError when its window ends within
    `margin_blocks` (the taker's redemption delay: the compute node's `CreditCheck`, the
    agent's `CreditTill`)."""
    if paid_takeable(credit, now, margin_blocks):
        return
    end = paid_window_end(credit, now)
    what = f"key period {credit.period}"
    if not started(credit, now):
        raise CreditRefusedError(
            f"a credit of {what} is not redeemable yet; the chain is in epoch {now.epoch}"
        )
    if now.height >= end:
        raise CreditRefusedError(
            f"a credit of {what} was redeemable up to height {end}; the chain "
            f"is at height {now.height}"
        )
    raise CreditExpiringError(
        f"a credit of {what} is redeemed up to height {end}; the chain is at "
        f"height {now.height} and this node takes only credits it can still redeem "
        f"{margin_blocks} blocks from now"
    )


class CreditSpool:
    """Credits a node was paid with and has not redeemed yet: one file each, in `dir`."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, credit: PaidCredit) -> Path:
        return self.dir / f"{spent_id(credit)}.json"

    def add(self, credit: PaidCredit) -> None:
        """Keep `credit` durably; CreditRefusedError if this node holds it already."""
        final = self.path(credit)
        if final.exists():
            raise CreditRefusedError("this credit was already paid to this node")
        temporary = self.dir / f".{final.name}.{os.getpid()}.tmp"
        data = json.dumps(assigned_json(credit), separators=(",", ":")).encode()
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, data)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, final)  # fails if it exists: two payments of one credit race
        except FileExistsError:
            raise CreditRefusedError("this credit was already paid to this node") from None
        finally:
            temporary.unlink()
        directory = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def held(self) -> Iterator[tuple[Path, PaidCredit]]:
        """Every credit in the spool (a file that does not parse is logged and skipped)."""
        for path in sorted(self.dir.glob("[0-9a-f]*.json")):
            try:
                credit = parse_assigned(json.loads(path.read_bytes()), path.name)
            except (OSError, ValueError, TxDecodeError) as error:
                log.warning("credit spool file skipped path=%s error=%s", path, error)
                continue
            yield path, credit

    @staticmethod
    def remove(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


_SHARD_DIR = re.compile(r"shard-(\d{1,5})")


def shard_spool(base: Path, shard: int) -> Path:
    """The spool directory of the process serving `shard` (node/agent/credit_spools.py)."""
    return base / f"shard-{shard}"


def spool_base(directory: Path) -> Path:
    """The base of a compute node's `--credits-dir` (itself when it is not a shard's)."""
    return directory.parent if _SHARD_DIR.fullmatch(directory.name) else directory


class Payments:
    """A node's price (positions per credit) and the accounts of its sessions."""

    def __init__(
        self,
        positions: int,
        check: CreditCheck,
        spool: CreditSpool,
        *,
        wait_s: float = PAY_WAIT_S,
        locks: LockMarks | None = None,
        unlocked: int = UNLOCKED_CREDITS,
        lock_wait_blocks: int = LOCK_WAIT_BLOCKS,
        lock_stall_s: float = LOCK_STALL_S,
        height_poll_s: float = LOCK_HEIGHT_POLL_S,
        party: bytes | None = None,
    ) -> None:
        if positions < 1:
            raise ValueError("a credit pays for at least one position")
        if unlocked < 0:
            raise ValueError("unlocked credits must be ≥ 0")
        if lock_wait_blocks < 1:  # a lock lands in the next block at the earliest
            raise ValueError("lock_wait_blocks must be ≥ 1")
        self.positions = positions
        self.check = check
        self.spool = spool
        self.wait_s = wait_s
        # None: every credit counts once spooled (in-process tests without an agent); else a
        # session is served on at most `unlocked` credits whose lock is not won yet
        self.locks = locks
        self.unlocked = unlocked
        # a session whose credit's lock is not committed within `lock_wait_blocks` committee
        # blocks of the height the credit was taken at is stopped; so is one whose chain made
        # no block for `lock_stall_s` (the committee's height read every `height_poll_s`)
        self.lock_wait_blocks = lock_wait_blocks
        self.lock_stall_s = lock_stall_s
        self.height_poll_s = height_poll_s
        # what a credit's assignment must name (`credit_holder.node_party`); None: not checked
        self.party = party
        self.seen: set[str] = set()
        self.accepted = 0  # credits taken as pay since start
        self.refused = 0
        self.double_spent = 0  # sessions stopped: a credit's lock went to another node

    async def accept(self, account: Account, credit: PaidCredit) -> None:
        identifier = spent_id(credit)
        try:
            if identifier in self.seen:
                raise CreditRefusedError("this credit was already paid to this node")
            self._check_assignment(credit)
            height = await self.check.check(credit)
            if identifier in self.seen:  # paid again while the first was being checked
                raise CreditRefusedError("this credit was already paid to this node")
            self.spool.add(credit)
        except ProtocolError:
            self.refused += 1
            raise
        if len(self.seen) >= MAX_SEEN:
            self.seen.clear()
        self.seen.add(identifier)
        self.accepted += 1
        if not account.opened:
            account.taken.append(credit)
        if self.locks is not None:
            account.pending[identifier] = height
        account.credits += 1
        account.paid += self.positions
        account.notify()

    def _check_assignment(self, credit: PaidCredit) -> None:
        """CreditNotAssignedError when the credit's assignment names another party than this
        node (one the chain would refuse this node's lock of; checked before any query)."""
        if self.party is None or not isinstance(credit, AssignedCredit):
            return
        if not assigned(credit.nonce, self.party, credit.assignment):
            raise CreditNotAssignedError(
                credit,
                "the credit's holder did not assign it to this node (its key, model and shard)",
            )

    def servable(self, account: Account) -> int:
        """The positions this session may use: those of its credits whose lock is won, and of
        at most `unlocked` credits whose lock is still in flight."""
        in_flight = max(0, len(account.pending) - self.unlocked)
        return account.paid - in_flight * self.positions

    def _settle(self, account: Account) -> None:
        """Drop the credits whose lock this node won from `pending`; CreditDoubleSpentError
        (the session is closed) when another node locked or redeemed one first."""
        if self.locks is None:
            return
        for identifier in list(account.pending):
            status = self.locks.status(identifier)
            if status == WON:
                del account.pending[identifier]
            elif status == LOST:
                self.double_spent += 1
                raise CreditDoubleSpentError(
                    f"credit {identifier} paid to this session was locked or redeemed by "
                    f"another node first ({self.locks.reason(identifier)[:200]}): a credit "
                    "pays one node once; the session is closed"
                )

    async def _check_lock_wait(self, account: Account) -> None:
        """CreditLockTimeoutError when the oldest credit of the session whose lock is in flight
        was taken more than `lock_wait_blocks` committee blocks ago, or when the chain made no
        block for `lock_stall_s` (it stopped: no lock can land)."""
        height, still_s = await self.check.chain_height(self.height_poll_s)
        taken = min(account.pending.values())
        rule = (
            f"it serves at most {self.unlocked} credits' positions before their locks are committed"
        )
        if height - taken > self.lock_wait_blocks:
            raise CreditLockTimeoutError(
                f"{len(account.pending)} credits of this session were not locked for this node "
                f"within {self.lock_wait_blocks} committee blocks (taken at height {taken}, the "
                f"chain is at {height}); {rule}"
            )
        if still_s > self.lock_stall_s:
            raise CreditLockTimeoutError(
                f"{len(account.pending)} credits of this session wait for their locks and the "
                f"committee made no block in {still_s:.0f} s (height {height}); {rule}"
            )

    async def cover(self, account: Account, count: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            self._settle(account)
            if account.used + count <= self.servable(account):
                break
            if account.used + count > account.paid:
                wait = deadline - loop.time()
                if wait <= 0:
                    raise PaymentRequiredError(
                        f"this node computes paid positions only: {account.credits} credits "
                        f"paid for {account.paid} positions of this session, {account.used} "
                        f"used, this frame needs {count} more; pay a credit ({self.positions} "
                        "positions each) before the positions it covers"
                    )
            else:  # paid, but more of it waits for its locks than this node serves on
                await self._check_lock_wait(account)
                wait = LOCK_POLL_S
            changed = account.changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await changed.wait()
        account.used += count

    @staticmethod
    def refund(account: Account, count: int) -> None:
        account.used -= count

    def give_back(self, account: Account) -> list[PaidCredit]:
        """The session's open failed (no `opened` was sent): un-take its credits."""
        returned = list(account.taken)
        for credit in returned:
            self.spool.remove(self.spool.path(credit))
            self.seen.discard(spent_id(credit))
            self.accepted -= 1
        account.taken.clear()
        account.pending.clear()
        account.paid = account.credits = 0
        return returned
