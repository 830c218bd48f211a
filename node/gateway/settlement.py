"""What the gateway tells the committee about the questions it was paid for (`work_report`).

`WorkLedger.record(receipt, circuit)` runs after each signed receipt: every node of the circuit
ran its shard's layers over the question's tokens (prompt + completion, the receipt's counts),
so `(node, model, shard)` gains `layers × tokens` of backing; the query id and its fee join the
settled list. `WorkReporter.flush()` (checked every `every_s`) sends both as `work_report` txs
signed with the gateway's committee key, at most 1024 items of each kind per tx, once
`min_questions` questions are pending or the oldest has waited `max_wait_s`.

A prepaid receipt (`payer` + `voucher`) is not an escrow deposit: its query joins `prepaid`
(gateway, payer, query id, model id, fee, voucher cap, expiry, voucher signature; no circuit)
instead of the settled list, and the committee debits the payer. Charges are sent in reports
of their own (right after the work), so a refused charge never drops the nodes' backing.
`DebitTracker.step()` (each reporter pass) reads the committee's stored statements and, for
each epoch whose root the escrow has posted, calls `PaymentDesk.mark_debited` with this
gateway's charges it covered.
The chain refuses a bad charge (`VOUCHER_*` codes) in FinalizeBlock, which the reporter does
not wait for (CheckTx checks format, signature and nonce only): the charges-only report is
lost, the work report is not. Refusals at CheckTx are logged with their code's name.

The report keeps the two lists apart: per-node aggregates and a set of query ids with fees,
never a session or a per-question node list. A report of a single question would still tie
its (public) query id to its circuit, so questions are batched: with k questions in a report
an observer learns only that each of them ran on some of the reported nodes. The chain stores
per-node totals only.
Pending aggregates live in memory: a gateway restart loses what it had not reported yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol.committee.settlement import MAX_REPORT_ITEMS, NodeWork, PrepaidItem, WorkReport

log = logging.getLogger(__name__)

DUPLICATE_QUERY = 32  # abci_app/codes.py
# abci_app/codes.py names of the refusals a report can meet (the node layer cannot import it)
REFUSALS = {
    30: "UNKNOWN_GATEWAY",
    32: "DUPLICATE_QUERY",
    35: "SETTLEMENT_DISABLED",
    36: "VOUCHER_INVALID",
    37: "VOUCHER_EXPIRED",
    38: "VOUCHER_REPLAYED",
    39: "VOUCHER_EXPIRY_TOO_FAR",
}


class Submitter(Protocol):
    async def submit(self, body: Any) -> Any: ...


@dataclass
class WorkLedger:
    model: str  # the committee's model string (manifest model_hash)
    shard_layers: Sequence[tuple[int, int]]  # [start, end) decoder layers per shard
    min_questions: int = 4  # batch at least this many questions per report …
    max_wait_s: float = 60.0  # … unless the oldest pending one waited this long
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # unix seconds, for the vouchers' expiry
    expiry_margin_s: float = 60.0  # report a charge at the latest this long before it expires
    work: dict[tuple[str, int], int] = field(default_factory=dict)  # (node, shard) → tokens
    queries: dict[str, int] = field(default_factory=dict)  # query id → fee wei
    prepaid: dict[tuple[str, str], PrepaidItem] = field(default_factory=dict)  # (payer, id)
    questions: int = 0  # recorded since the last report
    first_at: float | None = None  # when the oldest of them was recorded

    def ready(self) -> bool:
        if not self.questions:
            return bool(self.work or self.queries or self.prepaid)  # put back after a failure
        waited = self.clock() - (self.first_at if self.first_at is not None else self.clock())
        if self.prepaid and min(p.expiry for p in self.prepaid.values()) <= (
            self.wall() + self.expiry_margin_s
        ):
            return True  # the chain refuses a charge after its voucher expired: report it now
        return self.questions >= self.min_questions or waited >= self.max_wait_s

    def record(self, receipt: dict[str, Any], circuit: Any) -> None:
        if not self.questions:
            self.first_at = self.clock()
        self.questions += 1
        tokens = int(receipt["prompt_tokens"]) + int(receipt["completion_tokens"])
        fee = int(receipt["fee_wei"])
        if "payer" in receipt:  # prepaid: the committee debits the payer's balance
            item = prepaid_item(receipt)
            self.prepaid[(item.payer, item.query_id)] = item
        elif fee > 0:
            self.queries[str(receipt["query_id"]).lower()] = fee
        for node, served in circuit.shares(tokens):  # after a failover: what each computed
            place = (node.key, node.shard)
            self.work[place] = self.work.get(place, 0) + served

    def take(self) -> WorkReport | None:
        """The next report (removed from the ledger), or None when nothing is pending."""
        if not self.work and not self.queries and not self.prepaid:
            return None
        self.questions, self.first_at = 0, None
        if not self.work and not self.queries:
            # prepaid charges travel in reports of their own: the chain refuses a report whole,
            # and one bad charge must not cost the nodes the backing of the batch's work
            charged = sorted(self.prepaid)[:MAX_REPORT_ITEMS]
            return WorkReport((), (), tuple(self.prepaid.pop(key) for key in charged))
        places = sorted(self.work)[:MAX_REPORT_ITEMS]
        query_ids = sorted(self.queries)[:MAX_REPORT_ITEMS]
        work = []
        for key, shard in places:
            start, end = self.shard_layers[shard]
            work.append(NodeWork(key, self.model, shard, end - start, self.work.pop((key, shard))))
        queries = tuple((q, self.queries.pop(q)) for q in query_ids)
        return WorkReport(tuple(work), queries)

    def put_back(self, report: WorkReport) -> None:
        """A report that did not reach the chain goes back into the ledger."""
        for item in report.work:
            place = (item.node, item.shard)
            self.work[place] = self.work.get(place, 0) + item.tokens
        for query_id, fee in report.queries:
            self.queries.setdefault(query_id, fee)
        for item in report.prepaid:
            self.prepaid.setdefault((item.payer, item.query_id), item)


def prepaid_item(receipt: dict[str, Any]) -> PrepaidItem:
    """The chain's view of one prepaid receipt: the voucher and the fee, no circuit."""
    voucher = receipt["voucher"]
    return PrepaidItem(
        gateway=str(receipt["gateway"]).lower(),
        payer=str(receipt["payer"]).lower(),
        query_id=str(receipt["query_id"]).lower(),
        model_id=str(receipt["model_id"]).lower(),
        fee=int(receipt["fee_wei"]),
        fee_cap=int(voucher["fee_cap_wei"]),
        expiry=int(voucher["expiry"]),
        signature=str(voucher["signature"]).lower(),
    )


class Committee(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...


class EscrowView(Protocol):
    def epoch_of(self, epoch: int) -> dict[str, Any]: ...


class Desk(Protocol):
    def undebited(self) -> dict[bytes, tuple[str, int]]: ...

    def mark_debited(self, query_ids: Any) -> int: ...


@dataclass
class DebitTracker:
    """Marks this gateway's prepaid charges debited once a posted root covers them."""

    committee: Committee
    escrow: EscrowView
    desk: Desk
    done: set[int] = field(default_factory=set)  # epochs already handled

    async def step(self) -> int:
        """One pass; returns how many charges were marked debited."""
        if not self.desk.undebited():
            return 0
        listing = await self.committee.query("/payouts", limit=20)
        marked = 0
        for summary in sorted(listing.get("epochs", []), key=lambda e: int(e["epoch"])):
            epoch = int(summary["epoch"])
            if epoch in self.done:
                continue
            posted = await asyncio.to_thread(self.escrow.epoch_of, epoch)
            if posted["status"] == 0:  # not posted yet: look again next pass
                continue
            view = await self.committee.query("/payouts", epoch=epoch)
            ids = [bytes.fromhex(str(q)[2:]) for _, q in view.get("charges", [])]
            count = self.desk.mark_debited(ids)
            if count:
                log.info("prepaid charges debited epoch=%d count=%d", epoch, count)
            marked += count
            self.done.add(epoch)
        return marked


@dataclass
class WorkReporter:
    ledger: WorkLedger
    link: Submitter
    every_s: float = 5.0
    debits: DebitTracker | None = None  # marks prepaid charges debited once posted

    async def flush(self, *, force: bool = False) -> int:
        """Send the pending reports once the batch is ready (or `force`); returns how many were
        accepted by CheckTx."""
        sent = 0
        if not force and not self.ledger.ready():
            return 0
        while (report := self.ledger.take()) is not None:
            try:
                await self.link.submit(report)
            except TxRejectedError as error:
                # a refused report is dropped (resending it would be refused the same way)
                log.warning(
                    "work_report refused code=%d (%s) log=%s",
                    error.tx_code,
                    REFUSALS.get(error.tx_code, "other"),
                    error.log_text,
                )
                continue
            except Exception:
                self.ledger.put_back(report)
                raise
            sent += 1
            log.info(
                "work_report sent nodes=%d queries=%d prepaid=%d",
                len(report.work),
                len(report.queries),
                len(report.prepaid),
            )
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.every_s)
            try:
                await self.flush()
            except Exception as error:  # the committee is a peer: log and try again later
                log.warning("work_report not sent: %r", error)
            if self.debits is not None:
                try:
                    await self.debits.step()
                except Exception as error:  # the chains are peers: try again next pass
                    log.warning("debited charges not checked: %r", error)
