"""`MintFunder`: a validator vouches for a credit mint only when the payer's balance covers it.

The committee blind-signs a mint's credits only once validators with ≥ 2/3 of the power sent
`fund_mint` for it (abci_app/credits.py): the chain cannot read the EVM, so each validator's
watcher reads it and vouches on its own. A mint is paid from the payer's prepaid balance at the
escrow's own address (`prepaidOf(payer, escrow)`), debited when the payout statement of the
epoch that funded it is posted. So, per payer with mints waiting (`/mints?pending=true`):

    covered = balance − Σ amount of the payer's mints still in flight ≥ this mint's amount

where a mint is in flight when it is funded (or vouched for here) and its funding epoch's
statements are not all posted on the escrow yet: the EVM balance does not reflect it. A payer
with a withdrawal requested gets no vouching at all (the balance may leave before the debit).
Each payer's waiting mints are weighed oldest first, each counted in flight once vouched for:
two mints that each need the whole balance get one vouch from an honest watcher, and with
< 1/3 of the power faulty no two such mints both reach 2/3.

Both lists are read whole, page by page (`node.chain.committee_pages`): a payer's mints to the
last page, or none of its mints is vouched for this pass (its in-flight sum would be short); the
waiting list up to `PENDING_PAGES` pages, which lists returning buyers' mints (`buyer`: the
payer had a mint funded before) ahead of new payers'. Mint txs cost nothing to send and a chain
holds each payer to genesis `credits.max_pending_mints` unfunded mints, but payer addresses are
free. So the funder weighs only payers that ever deposited at the escrow's address (`deposits`:
the escrow's `BalanceDeposited` log, node/watcher/depositors.py; anyone else's balance is 0),
and a pass weighs at most `payers_per_pass` of them, returning buyers first, then those weighed
longest ago: a flood of mints from fresh addresses costs no EVM read and delays no honest
purchase; a flood from addresses that each paid a deposit's gas delays a new payer by its turn
among them, and never a returning buyer (a hosted gateway's top-up) (issue 42).

Failures (an EVM read, a tx not sent) end the pass; the mint is weighed again next pass.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.committee_pages import (
    STATEMENT_PAGES,
    TooManyPages,
    all_pages,
    read_pages,
    read_statements,
)
from node.watcher.payouts import Committee
from protocol.committee.credits import FundMint
from protocol.committee.settlement import statement_page
from protocol.credits import FUND_EPOCHS
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

POSTED = 1  # QueryEscrow.epochOf status: the root is posted (2 Disputed: charges returned)
PENDING_PAGES = 64  # pages of the waiting list read per pass (1,000 mints a page): returning
# buyers' mints come first, so only new payers' beyond 64,000 wait for a later pass
PAYER_PAGES = 64  # pages of one payer's mints: a longer list is not weighed (never partly)
# pages of `/payouts` read a pass: STATEMENT_PAGES (node/chain/committee_pages.py, 1,000
# statements a page); an epoch beyond them keeps its mints in flight


class Escrow(Protocol):
    """The EVM side (`node.chain.evm.escrow.QueryEscrow`, or a fake in unit tests)."""

    address: str

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]: ...
    def epoch_of(self, epoch: int) -> dict[str, Any]: ...


class DepositLog(Protocol):
    """Who ever deposited at the escrow's address (`node.watcher.depositors.EscrowDepositors`)."""

    def depositors(self) -> set[str]: ...


def funding_epoch(funded_height: int, epoch_length: int) -> int:
    """The epoch of the block that funded a mint (its charge is in that epoch's statement)."""
    return (funded_height - 1) // epoch_length + 1


@dataclass
class MintFunder:
    committee: Committee
    escrow: Escrow
    deposits: DepositLog | None = None  # None: every payer's balance is read (tests)
    payers_per_pass: int = 16  # EVM reads a pass may cost: mints are free to send, so many
    # payers without balance must not stall the watcher's pass (its stake attestations)
    vouched: dict[str, int] = field(default_factory=dict)  # mint id → amount, vouched here
    settled: set[int] = field(default_factory=set)  # epochs whose statements are all posted
    weighed: dict[str, int] = field(default_factory=dict)  # payer → the pass it was last weighed
    said: dict[str, tuple[int, int]] = field(default_factory=dict)  # mint → (balance, in flight)
    passes: int = 0

    async def step(self) -> list[str]:
        """One pass; returns the ids of the mints vouched for."""
        waiting, whole = await read_pages(
            self.committee.query, "/mints", "mints", max_pages=PENDING_PAGES, pending="true"
        )
        if not whole:
            log.warning("over %d mints wait for funding: the rest waits a pass", len(waiting))
        if not waiting:
            return []  # the usual pass: nothing to weigh, no epoch to read
        current = int((await self.committee.query("/epochs"))["current"])
        todo: dict[str, list[dict[str, Any]]] = {}
        buyers: set[str] = set()
        for mint in waiting:
            if mint["id"] not in self.vouched and current <= int(mint["epoch"]) + FUND_EPOCHS:
                payer = str(mint["payer"]).lower()
                todo.setdefault(payer, []).append(mint)
                if mint.get("buyer") is True:
                    buyers.add(payer)
        if todo and self.deposits is not None:
            deposited = await asyncio.to_thread(self.deposits.depositors)
            for payer in [p for p in todo if p not in buyers and p not in deposited]:
                del todo[payer]  # never deposited: its balance is 0, no read needed
        if not todo:
            return []
        length = int((await self.committee.query("/params"))["genesis"]["epoch_length"])
        statements = await self._statements()
        self.passes += 1
        # returning buyers first (a purchase funded before: it cost them a credit at least),
        # then the payers weighed longest ago (never weighed: first), then by their oldest
        # waiting mint: every payer gets its turn however many others wait
        order = sorted(
            todo,
            key=lambda p: (
                p not in buyers,
                self.weighed.get(p, 0),
                min(int(m["height"]) for m in todo[p]),
                p,
            ),
        )
        done = []
        for payer in order[: self.payers_per_pass]:
            self.weighed[payer] = self.passes
            done += await self._weigh(payer, todo[payer], current, length, statements)
        for payer in [p for p in self.weighed if p not in todo]:
            del self.weighed[payer]  # nothing waiting: forgotten
        waiting_ids = {m["id"] for m in waiting}
        for ident in [i for i in self.said if i not in waiting_ids]:
            del self.said[ident]
        return done

    async def _weigh(
        self,
        payer: str,
        mints: list[dict[str, Any]],
        current: int,
        length: int,
        statements: dict[int, list[int]],
    ) -> list[str]:
        prepaid = await asyncio.to_thread(self.escrow.prepaid_of, payer, self.escrow.address)
        if prepaid["withdrawable_at"] != 0:
            log.info("mints of %s not vouched for: a withdrawal of its balance is open", payer)
            return []
        try:
            every = await all_pages(
                self.committee.query, "/mints", "mints", max_pages=PAYER_PAGES, payer=payer
            )
        except TooManyPages as error:
            log.warning("mints of %s not vouched for: %s", payer, error.message)
            return []
        in_flight = 0
        for mint in every:
            funded = mint.get("funded_height")
            if funded is None:
                if mint["id"] in self.vouched and current > int(mint["epoch"]) + FUND_EPOCHS:
                    del self.vouched[mint["id"]]  # never funded, and never will be: no charge
                if mint["id"] not in self.vouched:
                    continue
            elif await self._debited(funding_epoch(int(funded), length), statements):
                self.vouched.pop(mint["id"], None)
                continue
            in_flight += int(mint["amount"])
        done = []
        for mint in sorted(mints, key=lambda m: (int(m["height"]), str(m["id"]))):
            amount = int(mint["amount"])
            if prepaid["balance"] - in_flight < amount:
                if self.said.get(mint["id"]) == (prepaid["balance"], in_flight):
                    break  # logged already for this balance (a waiting mint is weighed often)
                self.said[mint["id"]] = (prepaid["balance"], in_flight)
                log.info(
                    "mint %s of %s not vouched for: balance %d, in flight %d, needs %d",
                    mint["id"][:18],
                    payer,
                    prepaid["balance"],
                    in_flight,
                    amount,
                )
                break  # oldest first: a later mint never overtakes one the balance cannot cover
            try:
                code, text = await self.committee.send(FundMint(mint["id"]))
            except PlanetError as error:
                log.warning("fund_mint not sent mint=%s: %s", mint["id"][:18], error.message)
                break
            if code != 0:
                log.warning("fund_mint refused mint=%s code=%d %s", mint["id"][:18], code, text)
                continue
            self.vouched[mint["id"]] = amount
            in_flight += amount
            done.append(mint["id"])
            log.info("vouched for mint %s of %s amount=%d", mint["id"][:18], payer, amount)
        return done

    async def _statements(self) -> dict[int, list[int]]:
        """Epoch → the numbers of its stored payout statements (one per page), every page of
        `/payouts` followed to its end (newest first), at most `STATEMENT_PAGES`: beyond them
        an epoch is not listed, and its mints stay in flight (counted, conservative)."""
        listed, whole = await read_statements(self.committee.query, max_pages=STATEMENT_PAGES)
        if not whole:
            log.warning("over %d payout statements stored: older ones not read", len(listed))
        out: dict[int, list[int]] = {}
        pages: dict[int, int] = {}
        for statement in listed:
            epoch = statement_page(statement.number)[0]
            out.setdefault(epoch, []).append(statement.number)
            pages[epoch] = statement.pages
        # an epoch whose pages were not all listed (the read ended among them) is left out
        return {e: numbers for e, numbers in out.items() if len(set(numbers)) == pages[e]}

    async def _debited(self, epoch: int, statements: dict[int, list[int]]) -> bool:
        """Whether every statement of `epoch` is posted (its debits are in the EVM balance)."""
        if epoch in self.settled:
            return True
        numbers = statements.get(epoch)
        if not numbers:
            return False  # not closed yet (or not read to its last page: counted, conservative)
        for number in numbers:
            view = await asyncio.to_thread(self.escrow.epoch_of, number)
            if int(view["status"]) != POSTED:
                return False
        self.settled.add(epoch)
        return True
