"""`SpoolLocker`: the node agent locks, on the committee, the credits its compute process was
just paid with (`credit_lock`, abci_app/credit_locks.py; issue 42, attack 4), and tells the
compute process which locks it won (node/server/credit_locks.py `LockMarks`).

    locker = SpoolLocker(link, model, shard, CreditSpool(dir))
    await locker.step()     every spooled credit without a mark is locked, up to MAX_LOCKS a
                            tx (holder-bound credits with their assignments, in txs of their
                            own); a credit the chain refuses by name (CREDIT_LOCKED: another
                            node locked it first; CREDIT_SPENT: redeemed; CREDIT_EPOCH: its
                            window is over; CREDIT_NOT_ASSIGNED: its holder did not assign it
                            to this node, or the chain wants an assignment) is marked lost
                            and the rest of its batch sent again at once; a committed tx
                            marks its credits won; while a tx is not in a block its credits'
                            locks are read every LOCK_LOOK_S, and one another node holds is
                            lost at once (CometBFT's recheck drops such a tx silently). Any
                            other failure marks nothing (the next pass tries again). Returns
                            the credits won.

The redeemer (credit_till.py `SpoolRedeemer`) redeems only credits marked won and deletes the
ones marked lost: a node never redeems, and never counts as paid, a credit another node locked.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from node.server.credit_locks import LockMarks
from node.server.payments import CreditSpool
from protocol.committee.credit_locks import MAX_LOCKS, CreditLock
from protocol.credits import clock_from_query
from protocol.errors import UnavailableError
from protocol.paid_credits import AssignedCredit, PaidCredit, spent_id

log = logging.getLogger(__name__)

CREDIT_SPENT, CREDIT_EPOCH, CREDIT_LOCKED = 78, 79, 86  # abci_app/codes.py
CREDIT_NOT_ASSIGNED = 102  # abci_app/codes.py
LOST_CODES = (CREDIT_SPENT, CREDIT_EPOCH, CREDIT_LOCKED, CREDIT_NOT_ASSIGNED)
LOCK_WAIT_S = 15.0  # how long a lock tx not yet in a block is waited for, in all
LOCK_LOOK_S = 2.0  # meanwhile, the locks themselves are read this often
_ITEM = re.compile(r"credit (\d+):")


class Link(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...
    async def submit(self, body: Any) -> Any: ...
    async def committed_code(self, tx_hash: str, *, timeout_s: float = 15.0) -> tuple[int, str]: ...


@dataclass
class SpoolLocker:
    link: Link
    model: str
    shard: int
    spool: CreditSpool
    per_tx: int = MAX_LOCKS
    won: int = 0  # locks won since start
    lost: int = 0  # credits another node locked or redeemed first, since start

    @property
    def marks(self) -> LockMarks:
        return LockMarks(self.spool.dir)

    async def step(self) -> int:
        marks = self.marks
        undecided = [
            credit for _, credit in self.spool.held() if marks.status(spent_id(credit)) is None
        ]
        now = 0
        if undecided:
            # a credit carries its key period, not an epoch: it is locked under the chain's
            # current epoch (the lock lasts that epoch's credit lifetime; the node redeems what
            # it won within a pass or two)
            now = clock_from_query(await self.link.query("/credit_keys")).epoch
        won = 0
        for bound in (True, False):  # the two forms of a lock's rows never share a tx
            group = {spent_id(c): c for c in undecided if isinstance(c, AssignedCredit) == bound}
            waiting = sorted(group.items())
            decided, stopped = await self._lock(waiting, now, marks)
            won += decided
            if stopped:
                break
        marks.prune()
        if won:
            bound = sum(isinstance(c, AssignedCredit) for c in undecided)
            log.info("credits locked count=%d assigned=%d total=%d", won, bound, self.won)
        return won

    async def _lock(
        self, waiting: list[tuple[str, PaidCredit]], epoch: int, marks: LockMarks
    ) -> tuple[int, bool]:
        """Lock `waiting` (one form), MAX_LOCKS a tx: the locks won, and whether a refusal not
        by name stopped this pass (the rest is tried again next pass)."""
        won = 0
        while waiting:
            batch = waiting[: self.per_tx]
            code, text = await self._send(batch, epoch)
            if code == 0:
                for identifier, _ in batch:
                    marks.mark(identifier, won=True)
                del waiting[: len(batch)]
                won += len(batch)
                continue
            match = _ITEM.search(text)
            if code in LOST_CODES and match and int(match.group(1)) < len(batch):
                identifier, _ = batch[int(match.group(1))]
                marks.mark(identifier, won=False, reason=f"{code} {text}")
                waiting.remove(batch[int(match.group(1))])
                self.lost += 1
                log.warning("credit lock lost code=%d %s", code, text)
                continue
            log.warning("credit lock refused code=%d %s (tried again next pass)", code, text)
            self.won += won
            return won, True
        self.won += won
        return won, False

    async def _send(self, batch: list[tuple[str, PaidCredit]], epoch: int) -> tuple[int, str]:
        locks = tuple((identifier, epoch) for identifier, _ in batch)
        assignments = tuple(
            (credit.nonce, credit.assignment)
            for _, credit in batch
            if isinstance(credit, AssignedCredit)
        )
        try:
            sent = await self.link.submit(CreditLock(self.model, self.shard, locks, assignments))
        except TxRejectedError as error:
            return error.tx_code, error.log_text
        return await self._committed(sent.hash, batch)

    async def _committed(
        self, tx_hash: str, batch: list[tuple[str, PaidCredit]]
    ) -> tuple[int, str]:
        """The lock tx's block result. CometBFT's recheck drops a lock tx from the mempool,
        silently, when a block before it locked one of its credits for another node (a client
        showed the credit to two nodes): it never lands, and waiting for it would outlast the
        compute process's bound (`LOCK_WAIT_BLOCKS`), which then stops the session as a lock
        timeout, not as the double spend it is. So while the tx is not in a block, the locks
        themselves are read every LOCK_LOOK_S, and a credit another node holds answers for the
        tx as its refusal would (CREDIT_LOCKED, naming the item)."""
        waited = 0.0
        while True:
            try:
                return await self.link.committed_code(tx_hash, timeout_s=LOCK_LOOK_S)
            except UnavailableError:
                waited += LOCK_LOOK_S
                taken = await self._held_elsewhere(batch)
                if taken is not None:
                    return taken
                if waited >= LOCK_WAIT_S:
                    raise

    async def _held_elsewhere(self, batch: list[tuple[str, PaidCredit]]) -> tuple[int, str] | None:
        mine = getattr(self.link, "signer", "")
        for index, (identifier, _) in enumerate(batch):
            lock = await self.link.query("/credit_lock", id=identifier)
            holder = lock.get("node") if isinstance(lock, dict) else None
            if isinstance(holder, str) and holder and holder != mine:
                return CREDIT_LOCKED, (
                    f"credit {index}: locked by node {holder[:16]}… first (this lock tx was "
                    "dropped from the mempool)"
                )
        return None
