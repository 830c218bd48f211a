"""`CreditTill`: a compute node's side of being paid with bearer credits — accept, hold, redeem.

    till = CreditTill(link, model, shard)
    await till.accept(credit)     checked at once as the chain will check it (σ under its key
                                  period's committee key, a window the chain still redeems in
                                  `margin_blocks` after its latest committed height, read then:
                                  CreditExpiringError within that margin)
                                  and against the credits this till already holds or
                                  redeemed; raises `CreditInvalidError` / `CreditRefused`
    await till.redeem()           `credit_redeem` txs of up to `per_tx` held credits; a credit
                                  the chain refuses by name (spent elsewhere, invalid) is
                                  dropped and the rest of its batch sent again; a batch its
                                  commitments pay for only in part at its price
                                  (REDEMPTION_OVER_PRICE, "at most K") is cut to K, the rest
                                  kept for later; returns the credits redeemed

    redeemer = SpoolRedeemer(till, CreditSpool(dir), locker=SpoolLocker(...))
    await redeemer.step()         the credits the compute node spooled as pay (its
                                  `--credits-dir`, node/server/payments.py) locked for this
                                  node (credit_locker.py), then those whose lock it won
                                  redeemed; a file goes once the chain took its credit or
                                  refused it for good, or another node locked it first

What a client pays with is a bearer credit: whoever shows it first gets it. So a node redeems
what it was paid before the credit's window closes (its key period's issue epoch e + genesis
`credits.lifetime_epochs`), and a client
that spends one credit at two nodes pays only the first to redeem it (`CREDIT_SPENT`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from node.agent.credit_locker import SpoolLocker
from node.chain.committee_rpc import TxRejectedError
from node.server.credit_locks import LOST, LockMarks
from node.server.payments import CreditRefusedError, CreditSpool, check_window
from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import MAX_REDEEM, CreditRedeem
from protocol.credits import NODE_MARGIN_BLOCKS, clock_from_query, lifetime_from_query
from protocol.paid_credits import AssignedCredit, CreditInvalidError, PaidCredit, spent_id
from protocol.threshold_mint import PeriodKey

log = logging.getLogger(__name__)

CREDIT_INVALID, CREDIT_SPENT, CREDIT_EPOCH, CREDIT_LOCKED = 77, 78, 79, 86  # abci_app/codes.py
CREDIT_NOT_ASSIGNED = 102  # abci_app/codes.py: its holder did not assign it to this node
DROPPED = (CREDIT_INVALID, CREDIT_SPENT, CREDIT_EPOCH, CREDIT_LOCKED, CREDIT_NOT_ASSIGNED)
REDEMPTION_OVER_PRICE = 91  # abci_app/codes.py: what is committed pays for fewer credits
_ITEM = re.compile(r"credit (\d+):")
_AT_MOST = re.compile(r"at most (\d+) credits")


# a credit this node will not take: already held or redeemed here, or out of its window
CreditRefused = CreditRefusedError


class Link(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...
    async def submit(self, body: Any) -> Any: ...
    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]: ...


@dataclass
class CreditTill:
    link: Link
    model: str
    shard: int
    per_tx: int = MAX_REDEEM  # 88 bytes a credit: 64 fit well under the 64 KiB tx limit
    # its redemption delay in blocks: a credit whose window ends within it is not taken
    margin_blocks: int = NODE_MARGIN_BLOCKS
    held: list[PaidCredit] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # spent ids held or redeemed by this till
    _period_keys: dict[int, PeriodKey] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.margin_blocks < 1:  # a redemption lands in the next block at the earliest
            raise ValueError("margin_blocks must be ≥ 1")

    async def current_epoch(self) -> tuple[int, int]:
        """The current epoch and the credits' lifetime in epochs."""
        answer = await self.link.query("/credit_keys")
        return int(answer["epoch"]), lifetime_from_query(answer)

    async def accept(self, credit: PaidCredit) -> None:
        await self._check(credit)
        identifier = spent_id(credit)
        if identifier in self.seen:
            raise CreditRefused("this credit was already paid to this node")
        self.seen.add(identifier)
        self.held.append(credit)

    async def _check(self, credit: ThresholdCredit) -> None:
        # the chain's time as the validator answers it now (no cache): the window's end is read
        # there, less the till's redemption delay (CreditExpiringError within it)
        clock = clock_from_query(await self.link.query("/credit_keys"))
        check_window(credit, clock, self.margin_blocks)
        if credit.period not in self._period_keys:
            answer = await self.link.query("/credit_period", period=credit.period)
            self._period_keys[credit.period] = PeriodKey.from_answer(answer, period=credit.period)
        try:
            blind_bls.verify_credit(self._period_keys[credit.period].key, credit)
        except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
            raise CreditInvalidError(f"the credit does not verify: {error.message}") from None

    async def redeem(self) -> int:
        """Send the held credits in batches; returns how many the chain accepted."""
        redeemed = 0
        size = self.per_tx
        while self.held:
            batch = _one_form(self.held[: min(size, MAX_REDEEM)])
            code, text = await self._send(batch)
            if code == 0:
                gone = {id(c) for c in batch}
                self.held = [c for c in self.held if id(c) not in gone]
                redeemed += len(batch)
                size = self.per_tx
                continue
            match = _ITEM.search(text)
            if code in DROPPED and match:
                bad = batch[int(match.group(1))]
                log.warning("credit dropped code=%d %s", code, text)
                self.held.remove(bad)
                continue
            fits = _AT_MOST.search(text) if code == REDEMPTION_OVER_PRICE else None
            if fits is not None and 0 < int(fits.group(1)) < len(batch):
                size = int(fits.group(1))  # what the commitments pay for now; the rest waits
                continue
            log.warning("redeem refused code=%d %s (credits kept)", code, text)
            break
        return redeemed

    async def _send(self, batch: list[PaidCredit]) -> tuple[int, str]:
        assignments = tuple(c.assignment for c in batch if isinstance(c, AssignedCredit))
        body = CreditRedeem(self.model, self.shard, tuple(batch), assignments)
        try:
            sent = await self.link.submit(body)
        except TxRejectedError as error:
            return error.tx_code, error.log_text
        return await self.link.committed_code(sent.hash)


def _one_form(batch: list[PaidCredit]) -> list[PaidCredit]:
    """The longest prefix of `batch` whose credits all carry assignments, or all do not: a
    redemption carries one for every credit or none."""
    bound = isinstance(batch[0], AssignedCredit)
    for index, credit in enumerate(batch):
        if isinstance(credit, AssignedCredit) != bound:
            return batch[:index]
    return batch


@dataclass
class SpoolRedeemer:
    """The node agent's side of paid work: redeem what the compute node spooled, each pass."""

    till: CreditTill
    spool: CreditSpool
    redeemed: int = 0  # credits the chain took since start
    # locks each credit first (credit_locker.py): only credits whose lock this node won are
    # redeemed, and one another node locked is dropped (None: redeem whatever was spooled)
    locker: SpoolLocker | None = None

    async def step(self) -> int:
        files: dict[str, Path] = {}
        self.till.held = []
        if self.locker is not None:
            await self.locker.step()
        marks = LockMarks(self.spool.dir)
        for path, credit in self.spool.held():
            if self.locker is not None:
                status = marks.status(spent_id(credit))
                if status == LOST:  # another node's: never redeemed here
                    self.spool.remove(path)
                    continue
                if status is None:  # its lock is not decided yet
                    continue
            files[spent_id(credit)] = path
            self.till.held.append(credit)
            self.till.seen.add(spent_id(credit))
        if not files:
            return 0
        redeemed = await self.till.redeem()
        kept = {spent_id(credit) for credit in self.till.held}
        for identifier, path in files.items():
            if identifier not in kept:  # redeemed, or refused for good by name
                self.spool.remove(path)
        self.redeemed += redeemed
        if redeemed:
            log.info(
                "credits redeemed count=%d total=%d left=%d", redeemed, self.redeemed, len(kept)
            )
        return redeemed
