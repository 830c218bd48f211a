"""`PayoutRelay`: a validator signs each closed epoch's payout statement once and, when the
committee has gathered ≥ 2/3 of the power, relays it to the escrow.

A statement is named by its number (`epoch` in the escrow's words): an epoch the committee
settled in several pages has one statement per page (page p of epoch e is e + p·2^32), each
signed, confirmed and posted on its own.

One `step()`:
1. `/payouts` (the stored statements, newest first, every page followed by its cursor, at most
   `STATEMENT_PAGES` pages: node/chain/committee_pages.py): for each one not settled locally
   yet, oldest first, read it (`/payouts?epoch=N`). A listing longer than the bound is logged
   and only its newest part is handled this pass: the older statements are neither signed nor
   posted until a pass reaches them (nothing is ever posted twice: step 3 asks the escrow
   first, and `EpochAlreadyPosted` counts as done);
2. not signed by this validator's operator yet → check the statement is bound to this
   deployment's QueryEscrow, sign `PayoutRoot` (committee EIP-712 domain), send `payout_vote`.
   The chain rebuilds the statement from its own record and checks the signature; the same
   statement signed twice is the same signature (RFC 6979) and the chain answers
   DUPLICATE_VOTE, never a second statement;
3. `confirmed` (≥ 2/3) and the escrow has no root for the number → `postPayoutRoot(statement,
   Charges(query ids, fees, payers, gateways, debits), signatures sorted by signer)`.
   `EpochAlreadyPosted` (another validator was first) counts as done.

The listing of step 1 changes only when an epoch closes (its statements are stored at the end of
block e·L, L the genesis `epoch_length`): given the committee's committed height this pass
(`height`, the DKG driver's `/credit_period` answer), the relay reuses the listing it read
while no epoch closed since (same `height // L`); a listing that was not whole, or a pass that
failed, reads it again. Each unposted statement's own view (`/payouts?epoch=N`) is read every
pass as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.committee_pages import (
    STATEMENT_PAGE_SIZE,
    STATEMENT_PAGES,
    ListedStatement,
    read_statements,
)
from node.chain.committee_rpc import TxRejectedError
from node.chain.evm.errors import ContractRevert
from protocol.committee.settlement import PayoutVote
from protocol.eip712 import Domain, PayoutRoot

log = logging.getLogger(__name__)

# the escrow's page rule (docs/contracts.md): a page listing a deposit of another gateway than
# the one it pays reverts so at every try
NEVER_POSTABLE = frozenset({"WrongGatewayQuery", "WrongGatewayDebit", "RootNotPayee"})

DUPLICATE_VOTE = 21
ESCROW_NONE = 0  # QueryEscrow.epochOf status: nothing posted


def statement_of(view: dict[str, Any]) -> PayoutRoot:
    """The `PayoutRoot` of a `/payouts?epoch=N` answer (typed and range-checked here)."""
    s = view["statement"]
    return PayoutRoot(
        epoch=int(s["epoch"]),
        root=bytes.fromhex(str(s["root"])[2:]),
        total=int(s["total"]),
        queries_hash=bytes.fromhex(str(s["queries_hash"])[2:]),
        consumer=str(s["consumer"]),
    )


class Committee(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...
    async def send(self, body: Any, *, timeout_s: float = ...) -> tuple[int, str]: ...


class Escrow(Protocol):
    """The EVM side (`node.chain.evm.escrow.QueryEscrow`, or a fake in unit tests)."""

    address: str

    def epoch_of(self, epoch: int) -> dict[str, Any]: ...
    def post_payout_root(
        self,
        statement: PayoutRoot,
        query_ids: Any,
        fees: Any,
        signatures: Any,
        *,
        payers: Any = (),
        gateways: Any = (),
        debits: Any = (),
    ) -> Any: ...


@dataclass
class PayoutRelay:
    committee: Committee
    escrow: Escrow
    escrow_address: str
    operator_key: bytes
    domain: Domain
    signed: set[int] = field(default_factory=set)
    posted: set[int] = field(default_factory=set)
    max_pages: int = STATEMENT_PAGES  # pages of `/payouts` read a pass
    page_size: int = STATEMENT_PAGE_SIZE  # statements a page (an epoch may close into several)
    height: Callable[[], int | None] | None = None  # the committed height this pass, if known
    epoch_length: int | None = None  # genesis epoch_length (read once, when `height` is given)
    _listed: tuple[int, list[ListedStatement]] | None = None  # (height // L, the listing)

    @property
    def operator(self) -> str:
        from protocol.eip712 import address_of

        return address_of(self.operator_key)

    async def step(self) -> list[tuple[str, int]]:
        """One pass; returns what was done as ("signed" | "posted", epoch) pairs."""
        try:
            return await self._step()
        except BaseException:
            self._listed = None  # a failed pass reads the listing again
            raise

    async def _listing(self) -> tuple[list[ListedStatement], bool]:
        """The stored statements (and whether all were listed): the last whole listing while no
        epoch closed since it was read, else read now."""
        height = None if self.height is None else self.height()
        window = None
        if height is not None:
            if self.epoch_length is None:
                params = await self.committee.query("/params")
                self.epoch_length = int(params["genesis"]["epoch_length"])
            window = height // self.epoch_length
            if self._listed is not None and self._listed[0] == window:
                return self._listed[1], True
        listed, whole = await read_statements(
            self.committee.query, max_pages=self.max_pages, page_size=self.page_size
        )
        self._listed = (window, listed) if window is not None and whole else None
        return listed, whole

    async def _step(self) -> list[tuple[str, int]]:
        listed, whole = await self._listing()
        if not whole:
            log.warning(
                "payout relay: over %d statements stored (%d pages read); older ones are not "
                "signed or posted this pass",
                len(listed),
                self.max_pages,
            )
        done: list[tuple[str, int]] = []
        for epoch in sorted({statement.number for statement in listed}):
            if epoch in self.posted:
                continue
            view = await self.committee.query("/payouts", epoch=epoch)
            statement = statement_of(view)
            if statement.consumer.lower() != self.escrow_address.lower():
                log.warning("epoch %d statement names escrow %s", epoch, statement.consumer)
                self.posted.add(epoch)
                continue
            signers = [str(s).lower() for s in view.get("signers", [])]
            mine = epoch in self.signed or self.operator.lower() in signers
            if not mine:
                voted = await self._vote(statement)
                if voted is None:
                    continue  # not on chain: signed again next pass
                if voted:
                    done.append(("signed", epoch))
                    view = await self.committee.query("/payouts", epoch=epoch)  # with our vote
            self.signed.add(epoch)
            if view.get("confirmed") and await self._post(view, statement):
                done.append(("posted", epoch))
        return done

    async def _vote(self, statement: PayoutRoot) -> bool | None:
        """True: this vote is in a block now; False: it was there before (DUPLICATE_VOTE);
        None: refused or lost (sent and waited for: the verifier signs with the same key)."""
        signature = statement.sign(self.operator_key, self.domain)
        try:
            code, text = await self.committee.send(
                PayoutVote(statement.epoch, "0x" + signature.hex())
            )
        except TxRejectedError as error:
            code, text = error.tx_code, error.log_text
        if code == DUPLICATE_VOTE:
            return False
        if code != 0:
            log.warning("payout_vote refused epoch=%d code=%d %s", statement.epoch, code, text)
            return None
        log.info("signed payout root epoch=%d root=%s", statement.epoch, statement.root.hex())
        return True

    async def _post(self, view: dict[str, Any], statement: PayoutRoot) -> bool:
        epoch = statement.epoch
        on_chain = await asyncio.to_thread(self.escrow.epoch_of, epoch)
        if on_chain["status"] != ESCROW_NONE:
            self.posted.add(epoch)
            return False
        query_ids = [bytes.fromhex(str(q)[2:]) for q in view["query_ids"]]
        fees = [int(f) for f in view["fees"]]
        signatures = [bytes.fromhex(str(s)[2:]) for s in view["signatures"]]
        # prepaid debits per (payer, gateway), pairs ascending
        payers = [str(p) for p in view.get("payers", [])]
        gateways = [str(g) for g in view.get("gateways", [])]
        debits = [int(d) for d in view.get("debits", [])]
        try:
            await asyncio.to_thread(
                functools.partial(
                    self.escrow.post_payout_root,
                    statement,
                    query_ids,
                    fees,
                    signatures,
                    payers=payers,
                    gateways=gateways,
                    debits=debits,
                )
            )
        except ContractRevert as error:
            if error.error_name == "EpochAlreadyPosted":
                self.posted.add(epoch)
            elif error.error_name in NEVER_POSTABLE:  # a gateway reported another's deposit
                self.posted.add(epoch)  # its page can never pay it: not tried again
                log.error("payout root epoch=%d can never be posted: %s", epoch, error.message)
            else:  # tried again next pass (the revert is found by gas estimation: no tx sent)
                log.warning("postPayoutRoot epoch=%d reverted: %s", epoch, error.message)
            return False
        self.posted.add(epoch)
        log.info(
            "posted payout root epoch=%d queries=%d payers=%d", epoch, len(query_ids), len(payers)
        )
        return True
