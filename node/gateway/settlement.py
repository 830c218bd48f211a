"""What the gateway tells the committee about the questions it was paid for (`work_report`), so
that no report is ever lost, sent twice, or dropped in silence.

**The ledger** (`WorkLedger`). `record(receipt, number)` runs for each charged question before
its receipt leaves the gateway: a per-query deposit's id and fee join the query list; a prepaid
question (`payer` and its `voucher` or payment `key` in the receipt) becomes a cumulative
`ChargeItem` (kind, gateway, payer, id, model, total, cap, expiry, payer signature: no circuit),
and only the highest total per authorization is kept (the chain debits `total − previous`).
With a `journal` path the ledger is an append-only JSON-lines file (`Journal`, each line
fsync'd before `record` returns), next to the receipt log:

    {"q": {"seq", "query": [id, fee] | null, "charge": ChargeItem | null,
           "n": receipt number}}                           a charged question
    {"tx": {"hash", "nonce", "raw": base64}}               a report signed, about to be sent
    {"done": {"hash", "height", "code", "refused": [...]}} its committed result
    {"dead": {"hash"}}                                     it can never reach a block
    {"snapshot": {...}}                                    what the file said before compaction

A restart replays the file: what was recorded minus what a sent report carries is pending; a
report still in flight is resolved against the chain first. The receipt log is written first
(its receipts are numbered); a gateway killed between the two writes leaves receipts the ledger
never saw, and `catch_up` records them at start (every receipt numbered above the highest the
ledger recorded). So a gateway killed at any point reports every question exactly once.

**The reporter** (`WorkReporter.flush`, every `every_s`; once `min_questions` are pending, the
oldest waited `max_wait_s`, or a charge's authorization nears its expiry). One report at a time:
it takes the oldest pending items that fit the committee's tx limit (`MAX_TX_BYTES`, measured on
the encoded bytes; `MAX_REPORT_ITEMS` per list), signs them with the gateway's committee key and
the next nonce, writes the tx to the journal, then broadcasts it and waits for its committed
result (`CommitteeLink.find_tx` by hash):

- committed with code 0: the chain applied it item by item; every `planet.item_refused` event
  (kind, id, code name, reason) is logged as a warning and appended to the refused file
  (`<ledger>.refused.jsonl`): refused items are never retried (the chain would refuse them
  again) and never dropped in silence;
- committed with a whole-tx refusal (`UNKNOWN_GATEWAY`, …) or refused by CheckTx for its bytes:
  every item is refused by that code's name, the same way;
- never in a block (RPC down, mempool full, a timeout): it stays in flight and is sent again,
  byte for byte, on the next pass, with exponential backoff (`every_s · 2^failures`, at most
  `max_backoff_s`); its nonce makes a second copy harmless. Only when the committed nonce has
  passed it and no block holds it (looked up again until `settle_s` is over: the index trails
  the block a little) is it dead: its items go back to pending and travel in a new report with
  a new nonce.

`DebitTracker.step()` (each reporter pass) reads the committee's stored statements (every page
of `/payouts`, at most `STATEMENT_PAGES`) and, for each one the escrow has posted, tells the
payment desk which of this gateway's authorizations it debited and up to which total. A listing
longer than the bound is logged: the statements it did not reach mark nothing, so their charges
stay counted against their payers (held, never dropped) until a pass reads them.

The report names no node: query ids with fees and payers' charges, nothing else. Nodes are
paid through the credits they redeem, and the chain's coverage rule reads only their own txs,
so the per-node served counts reports once carried decided nothing (issue 45) and are gone
from the wire; they also tied a report's query ids to the nodes that computed them. A journal
written before keeps its `work` fields: they are ignored on replay, and a report signed with
them that was still in flight no longer decodes, so its items are pending again and travel in a
new report (a query id reported again with its fee, or a charge's total again, changes nothing
on the chain).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from node.chain.committee_pages import STATEMENT_PAGE_SIZE, STATEMENT_PAGES, read_statements
from node.chain.committee_rpc import TxRejectedError, TxResult, tx_hash
from protocol.canonical import canonical_json
from protocol.committee.envelope import MAX_TX_BYTES, decode, sign
from protocol.committee.settlement import (
    MAX_REPORT_ITEMS,
    ChargeItem,
    WorkReport,
)
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

BAD_NONCE = 3  # abci_app/codes.py (the node layer cannot import it)
# abci_app/codes.py names of whole-tx refusals a report can meet
TX_REFUSALS = {
    1: "MALFORMED_TX",
    2: "BAD_SIGNATURE",
    30: "UNKNOWN_GATEWAY",
    99: "INTERNAL",
}
COMPACT_LINES = 20_000  # journal lines before it is rewritten as one snapshot
ChargeKey = tuple[str, str, str, str]  # (payer, gateway, kind, id)


def ledger_paths(receipts: Path) -> tuple[Path, Path]:
    """(journal, refused file) next to the gateway's receipt log."""
    stem = receipts.with_suffix("")
    return stem.with_name(stem.name + ".ledger.jsonl"), stem.with_name(stem.name + ".refused.jsonl")


class Journal:
    """An append-only JSON-lines file; every line is fsync'd before `append` returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.lines += 1

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every readable line, oldest first; a torn last line (a crash mid-write) is skipped."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                self.lines = number
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = None
                if not isinstance(entry, dict):
                    log.warning("skipping a damaged ledger line=%d file=%s", number, self.path)
                    continue
                yield entry

    def rewrite(self, entry: dict[str, Any]) -> None:
        """Replace the whole file by one line, atomically (write, fsync, rename, fsync dir)."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.lines = 1


def charge_item(receipt: dict[str, Any]) -> ChargeItem | None:
    """The chain's view of a prepaid receipt: the payer's authorization and the total charged
    under it (a voucher: its one question's fee; a key: the running total). None for a
    per-query deposit."""
    if "payer" not in receipt:
        return None
    common = {
        "gateway": str(receipt["gateway"]).lower(),
        "payer": str(receipt["payer"]).lower(),
        "model_id": str(receipt["model_id"]).lower(),
    }
    if "key" in receipt:
        key = receipt["key"]
        return ChargeItem(
            kind="key",
            id=str(key["key_id"]).lower(),
            total=int(key["total_wei"]),
            cap=int(key["cap_wei"]),
            expiry=int(key["expiry"]),
            signature=str(key["signature"]).lower(),
            **common,
        )
    voucher = receipt["voucher"]
    return ChargeItem(
        kind="voucher",
        id=str(receipt["query_id"]).lower(),
        total=int(receipt["fee_wei"]),
        cap=int(voucher["fee_cap_wei"]),
        expiry=int(voucher["expiry"]),
        signature=str(voucher["signature"]).lower(),
        **common,
    )


@dataclass
class Sent:
    """A signed report on its way: its items, bytes, hash and nonce."""

    report: WorkReport
    raw: bytes
    hash: str
    nonce: int


def _report_of(raw: bytes) -> WorkReport:
    body = decode(raw).body
    if not isinstance(body, WorkReport):
        raise ValueError("a journal tx that is not a work_report")
    return body


@dataclass
class WorkLedger:
    min_questions: int = 4  # batch at least this many questions per report …
    max_wait_s: float = 60.0  # … unless the oldest pending one waited this long
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time  # unix seconds, for the authorizations' expiry
    expiry_margin_s: float = 60.0  # report a charge at the latest this long before it expires
    journal: Path | None = None  # the append-only ledger file (None: memory only)
    refused_path: Path | None = None  # where refused items are appended (None: log only)
    queries: dict[str, tuple[int, int]] = field(default_factory=dict)  # id → (fee, seq)
    charges: dict[ChargeKey, tuple[ChargeItem, int]] = field(default_factory=dict)
    in_flight: Sent | None = None
    refused: list[dict[str, str]] = field(default_factory=list)  # this process's, by name
    nonce: int = 0  # the last nonce a report was signed with
    questions: int = 0  # recorded since the last report
    first_at: float | None = None  # when the oldest of them was recorded
    seq: int = 0  # record counter: the order "oldest first" follows
    recorded_through: int = 0  # the highest receipt number recorded (receipt log order)
    _file: Journal | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.journal is not None:
            self._file = Journal(self.journal)
            self._replay()

    # --- what is pending -------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self.queries or self.charges)

    def ready(self) -> bool:
        if not self.questions:
            return self.pending  # left from before a restart or a failure: no batch to wait for
        if self.charges and min(item.expiry for item, _ in self.charges.values()) <= (
            self.wall() + self.expiry_margin_s
        ):
            return True  # the chain refuses an expired authorization: report it now
        waited = self.clock() - (self.first_at if self.first_at is not None else self.clock())
        return self.questions >= self.min_questions or waited >= self.max_wait_s

    def record(self, receipt: dict[str, Any], number: int | None = None) -> None:
        """A charged question (before its receipt leaves the gateway): on disk, then pending.
        `number`: the receipt's number in the receipt log (`catch_up` starts after the highest
        one recorded)."""
        fee = int(receipt["fee_wei"])
        item = charge_item(receipt)
        query = None
        if item is None and fee > 0:
            query = [str(receipt["query_id"]).lower(), fee]
        self.seq += 1
        entry = {
            "seq": self.seq,
            "query": query,
            "charge": item.to_json() if item is not None and item.total > 0 else None,
            "n": number,
        }
        if self._file is not None:
            self._file.append({"q": entry})
        self._apply_question(entry)
        if not self.questions:
            self.first_at = self.clock()
        self.questions += 1

    def catch_up(self, receipts: Iterable[tuple[int, dict[str, Any]]]) -> int:
        """Record the receipts the receipt log holds after the last one this ledger recorded
        (a gateway killed between the receipt's fsync and the ledger's). Returns how many were
        recorded."""
        recorded = 0
        for number, receipt in receipts:
            if number <= self.recorded_through:
                continue
            self.record(receipt, number)
            recorded += 1
        if recorded:
            log.warning("ledger caught up on %d receipts the receipt log held alone", recorded)
        return recorded

    def _apply_question(self, entry: dict[str, Any]) -> None:
        seq = int(entry["seq"])
        self.seq = max(self.seq, seq)
        if entry.get("n") is not None:
            self.recorded_through = max(self.recorded_through, int(entry["n"]))
        # a "work" field, written before reports left it (module docstring): ignored
        if entry["query"] is not None:
            query_id, fee = entry["query"]
            self.queries.setdefault(str(query_id), (int(fee), seq))
        if entry["charge"] is not None:
            self._add_charge(ChargeItem.from_json(entry["charge"]), seq)

    def _add_charge(self, item: ChargeItem, seq: int) -> None:
        held = self.charges.get(item.key)
        if held is None or held[0].total < item.total:
            self.charges[item.key] = (item, held[1] if held else seq)

    # --- reports: take, sent, done, dead ---------------------------------------------------

    def take(self, max_bytes: int = MAX_TX_BYTES, signer: str = "0" * 64) -> WorkReport | None:
        """The next report (not yet removed from the ledger: `sending` does that): the oldest
        queries and charges, as many as fit `max_bytes` once signed and encoded
        (`MAX_REPORT_ITEMS` per list)."""
        if not self.pending:
            return None
        budget = max_bytes - _envelope_bytes(signer)
        queries: list[tuple[str, int]] = []
        charges: list[ChargeItem] = []
        oldest_first = sorted(
            [(seq, (query_id, fee), None) for query_id, (fee, seq) in self.queries.items()]
            + [(seq, None, charge) for charge, seq in self.charges.values()],
            key=lambda entry: entry[0],
        )
        for _, query, charge in oldest_first:
            if query is not None:
                cost = _item_bytes([query[0], str(query[1])])
                if len(queries) == MAX_REPORT_ITEMS or cost > budget:
                    break
                queries.append(query)
            elif charge is not None:
                cost = _item_bytes(charge.to_json()) + (0 if charges else len(',"charges":[]'))
                if len(charges) == MAX_REPORT_ITEMS or cost > budget:
                    break
                charges.append(charge)
            budget -= cost
        if not queries and not charges:
            raise ValueError(f"one item does not fit a {max_bytes}-byte report")
        return WorkReport(tuple(sorted(queries)), tuple(sorted(charges, key=lambda c: c.key)))

    def sending(self, report: WorkReport, raw: bytes, nonce: int) -> Sent:
        """`report` is signed as `raw`: on disk, then its items leave the pending lists."""
        sent = Sent(report, raw, tx_hash(raw), nonce)
        if self._file is not None:
            self._file.append(
                {"tx": {"hash": sent.hash, "nonce": nonce, "raw": base64.b64encode(raw).decode()}}
            )
        self._take_out(report)
        self.in_flight = sent
        self.nonce = max(self.nonce, nonce)
        self.questions, self.first_at = 0, None
        return sent

    def _take_out(self, report: WorkReport) -> None:
        for query_id, _ in report.queries:
            self.queries.pop(query_id, None)
        for charge in report.charges:
            held = self.charges.get(charge.key)
            if held is not None and held[0].total <= charge.total:
                del self.charges[charge.key]

    def done(self, sent: Sent, height: int, code: int, refused: list[dict[str, str]]) -> None:
        """A block holds `sent`: it is off the books; its refused items are kept by name."""
        if self._file is not None:
            self._file.append(
                {"done": {"hash": sent.hash, "height": height, "code": code, "refused": refused}}
            )
        self.in_flight = None
        self._keep_refused(refused, sent.hash)
        self._maybe_compact()

    def dead(self, sent: Sent) -> None:
        """`sent` can never reach a block: its items are pending again (oldest first)."""
        if self._file is not None:
            self._file.append({"dead": {"hash": sent.hash}})
        self._put_back(sent.report)
        self.in_flight = None

    def _put_back(self, report: WorkReport) -> None:
        for query_id, fee in report.queries:
            self.queries.setdefault(query_id, (fee, 0))
        for charge in report.charges:
            self._add_charge(charge, 0)

    def _keep_refused(self, refused: list[dict[str, str]], hash_hex: str) -> None:
        for item in refused:
            log.warning(
                "work_report item refused tx=%s kind=%s id=%s code=%s reason=%s",
                hash_hex[:16],
                item.get("kind"),
                item.get("id"),
                item.get("code"),
                item.get("reason"),
            )
            self.refused.append(item)
        if refused and self.refused_path is not None:
            Journal(self.refused_path).append({"tx": hash_hex, "refused": refused})

    # --- the journal: replay and compaction -----------------------------------------------

    def _replay(self) -> None:
        assert self._file is not None
        sent: dict[str, Sent] = {}
        for entry in self._file.entries():
            try:
                if "q" in entry:
                    self._apply_question(entry["q"])
                elif "tx" in entry:
                    raw = base64.b64decode(entry["tx"]["raw"])
                    report = _report_of(raw)
                    sent[entry["tx"]["hash"]] = Sent(
                        report, raw, tx_hash(raw), entry["tx"]["nonce"]
                    )
                    self.nonce = max(self.nonce, int(entry["tx"]["nonce"]))
                    self._take_out(report)
                elif "done" in entry:
                    sent.pop(entry["done"]["hash"], None)
                elif "dead" in entry:
                    gone = sent.pop(entry["dead"]["hash"], None)
                    if gone is not None:
                        self._put_back(gone.report)
                elif "snapshot" in entry:
                    self._load_snapshot(entry["snapshot"])
            except (KeyError, TypeError, ValueError, PlanetError) as error:
                log.warning("skipping a ledger line that does not parse: %r", error)
        if len(sent) > 1:  # one report in flight at a time: only a bug leaves more
            log.error("ledger has %d reports in flight; resolving the last", len(sent))
        self.in_flight = list(sent.values())[-1] if sent else None
        log.info(
            "work ledger loaded file=%s pending queries=%d charges=%d in_flight=%s",
            self._file.path,
            len(self.queries),
            len(self.charges),
            self.in_flight.hash[:16] if self.in_flight else None,
        )

    def _snapshot(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "recorded_through": self.recorded_through,
            "nonce": self.nonce,
            "queries": [[q, fee, seq] for q, (fee, seq) in self.queries.items()],
            "charges": [[item.to_json(), seq] for item, seq in self.charges.values()],
        }

    def _load_snapshot(self, doc: dict[str, Any]) -> None:
        self.seq, self.nonce = int(doc["seq"]), int(doc["nonce"])
        self.recorded_through = int(doc.get("recorded_through", 0))
        self.queries = {str(q): (int(fee), int(seq)) for q, fee, seq in doc["queries"]}
        self.charges = {}
        for item_json, seq in doc["charges"]:
            self._add_charge(ChargeItem.from_json(item_json), int(seq))

    def _maybe_compact(self) -> None:
        if self._file is not None and self.in_flight is None and self._file.lines > COMPACT_LINES:
            self._file.rewrite({"snapshot": self._snapshot()})


def _envelope_bytes(signer: str) -> int:
    """Encoded bytes of a signed work_report with empty lists and the widest nonce."""
    doc = {
        "body": {"queries": []},
        "nonce": (1 << 63) - 1,
        "sig": "0" * 128,
        "signer": signer,
        "type": WorkReport.TYPE,
    }
    return len(canonical_json(doc))


def _item_bytes(wire: Any) -> int:
    return len(canonical_json(wire)) + 1  # and its comma


# --- the reporter ---------------------------------------------------------------------------


class ReportLink(Protocol):
    """What the reporter needs of `node.chain.committee_link.CommitteeLink`."""

    key: Any
    signer: str

    async def broadcast(self, raw: bytes) -> str: ...
    async def find_tx(self, hash_hex: str) -> TxResult | None: ...
    async def committed_nonce(self) -> int: ...
    async def committed(self, tx_hash: str, *, timeout_s: float = 15.0) -> TxResult: ...
    async def query(self, path: str, **params: Any) -> Any: ...


def refused_items(result: TxResult) -> list[dict[str, str]]:
    """The `planet.item_refused` events of a committed tx result (kind, id, code, reason)."""
    out = []
    for event in result.events:
        if not isinstance(event, dict) or event.get("type") != "planet.item_refused":
            continue
        attrs = {
            str(a.get("key")): str(a.get("value"))
            for a in event.get("attributes") or []
            if isinstance(a, dict)
        }
        out.append({k: attrs.get(k, "") for k in ("kind", "id", "code", "reason")})
    return out


def whole_refusal(report: WorkReport, code: int, why: str) -> list[dict[str, str]]:
    """Every item of a report refused whole, named like the chain names refused items."""
    name = TX_REFUSALS.get(code, f"CODE_{code}")
    items = [("query", q) for q, _ in report.queries]
    items += [("charge", c.name) for c in report.charges]
    return [{"kind": k, "id": i, "code": name, "reason": why[:300]} for k, i in items]


SETTLE_POLL_S = 0.2  # how often a tx whose nonce a block took is looked up again (settle_s)


@dataclass
class WorkReporter:
    ledger: WorkLedger
    link: ReportLink
    every_s: float = 5.0
    debits: DebitTracker | None = None  # marks prepaid charges debited once posted
    commit_timeout_s: float = 30.0  # wait this long for a block to hold a sent report
    settle_s: float = 2.0  # how long the tx index may lag a committed block
    max_backoff_s: float = 60.0  # within the timeline's commit margin (gateway timeline.py)
    max_bytes: int = MAX_TX_BYTES
    failures: int = 0  # consecutive passes that could not reach the committee
    reported: int = 0  # reports a block holds (or that were refused whole), since start

    async def flush(self, *, force: bool = False) -> int:
        """Resolve the report in flight, then send what is pending (once the batch is ready, or
        `force`) one report at a time; returns how many reports reached a block in this pass
        (or were refused whole). Raises the committee's `PlanetError` when it cannot be reached
        (the report stays in flight)."""
        before = self.reported
        if self.ledger.in_flight is not None and not await self._resolve(self.ledger.in_flight):
            return 0
        while self.ledger.pending and (force or self.ledger.ready()):
            report = self.ledger.take(self.max_bytes, self.link.signer)
            if report is None:
                break
            nonce = max(self.ledger.nonce, await self.link.committed_nonce()) + 1
            raw = sign(report, self.link.key, nonce).encode()
            if len(raw) > self.max_bytes:  # the estimate is an upper bound: never happens
                raise AssertionError(f"report of {len(raw)} bytes over {self.max_bytes}")
            sent = self.ledger.sending(report, raw, nonce)
            log.info(
                "work_report sending tx=%s nonce=%d bytes=%d queries=%d charges=%d",
                sent.hash[:16],
                nonce,
                len(raw),
                len(report.queries),
                len(report.charges),
            )
            if not await self._resolve(sent):
                break
        return self.reported - before

    async def _indexed_within_settle(self, tx_hash: str) -> TxResult | None:
        """`find_tx` again until the tx shows in the index or `settle_s` is over (the index
        trails the block a little): the answer, or None when it never showed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_s
        while True:
            await asyncio.sleep(min(SETTLE_POLL_S, max(0.0, deadline - loop.time())))
            found = await self.link.find_tx(tx_hash)
            if found is not None or loop.time() >= deadline:
                return found

    async def _resolve(self, sent: Sent, *, resend: bool = True) -> bool:
        """Bring `sent` to a block (or find it dead); True once it is off the ledger. False:
        still in flight (tried again on the next pass)."""
        found = await self.link.find_tx(sent.hash)
        if found is None:
            if not resend or await self.link.committed_nonce() >= sent.nonce:
                found = await self._indexed_within_settle(sent.hash)
                if found is None:
                    log.warning(
                        "work_report tx=%s never reached a block: resending its items",
                        sent.hash[:16],
                    )
                    self.ledger.dead(sent)
                    return True
            else:
                try:
                    await self.link.broadcast(sent.raw)
                except TxRejectedError as error:
                    if error.tx_code == BAD_NONCE:  # a block took this nonce meanwhile
                        return await self._resolve(sent, resend=False)
                    log.warning(
                        "work_report tx=%s refused by CheckTx code=%d: %s",
                        sent.hash[:16],
                        error.tx_code,
                        error.log_text,
                    )
                    self.ledger.done(
                        sent,
                        0,
                        error.tx_code,
                        whole_refusal(sent.report, error.tx_code, error.log_text),
                    )
                    return True
                try:
                    found = await self.link.committed(sent.hash, timeout_s=self.commit_timeout_s)
                except PlanetError as error:
                    log.warning("work_report tx=%s not committed yet: %s", sent.hash[:16], error)
                    return False
        return self._finish(sent, found)

    def _finish(self, sent: Sent, result: TxResult) -> bool:
        if result.code == BAD_NONCE:  # in a block but not applied: its nonce was taken
            self.ledger.dead(sent)
            return True
        if result.code != 0:
            refused = whole_refusal(sent.report, result.code, result.log)
        else:
            refused = refused_items(result)
        self.ledger.done(sent, result.height, result.code, refused)
        self.reported += 1
        log.info(
            "work_report committed tx=%s height=%d code=%d refused=%d",
            sent.hash[:16],
            result.height,
            result.code,
            len(refused),
        )
        return True

    def backoff_s(self) -> float:
        return min(self.every_s * (2**self.failures), self.max_backoff_s)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.backoff_s())
            try:
                await self.flush()
                self.failures = 0
            except PlanetError as error:  # the committee is a peer: back off, try again
                self.failures += 1
                log.warning("work_report not sent (retry in %.0f s): %s", self.backoff_s(), error)
            except Exception:  # a bug: keep reporting what can be reported
                self.failures += 1
                log.exception("work_report pass failed (retry in %.0f s)", self.backoff_s())
            if self.debits is not None:
                try:
                    await self.debits.step()
                except Exception as error:  # the chains are peers: try again next pass
                    log.warning("debited charges not checked: %r", error)


# --- which charges a posted root debited -----------------------------------------------------


class Committee(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...


class EscrowView(Protocol):
    def epoch_of(self, epoch: int) -> dict[str, Any]: ...


class Desk(Protocol):
    gateway: str

    def undebited(self) -> dict[bytes, tuple[str, int]]: ...

    def undebited_keys(self) -> dict[tuple[str, bytes], tuple[int, int]]: ...

    def mark_debited(self, query_ids: Any) -> int: ...

    def mark_key_debited(self, payer: str, key_id: bytes, total: int) -> int: ...


@dataclass
class DebitTracker:
    """Tells the payment desk which of this gateway's charges a posted root debited: voucher
    charges by query id (`mark_debited`), key charges by their total (`mark_key_debited`).
    Only a statement it read and the escrow posted marks anything: a charge of a statement
    beyond `max_pages` stays outstanding (the desk keeps holding it), never marked unseen."""

    committee: Committee
    escrow: EscrowView
    desk: Desk
    done: set[int] = field(default_factory=set)  # statement numbers already handled
    max_pages: int = STATEMENT_PAGES  # pages of `/payouts` read a pass
    page_size: int = STATEMENT_PAGE_SIZE  # statements a page (an epoch may close into several)

    def _owed(self) -> bool:
        return bool(self.desk.undebited() or self.desk.undebited_keys())

    async def step(self) -> int:
        """One pass; returns how many charges were marked debited."""
        if not self._owed():
            return 0
        listed, whole = await read_statements(
            self.committee.query, max_pages=self.max_pages, page_size=self.page_size
        )
        if not whole:
            log.warning(
                "debit tracker: over %d payout statements stored (%d pages read); the charges "
                "of older ones stay outstanding this pass",
                len(listed),
                self.max_pages,
            )
        mine = str(self.desk.gateway).lower()
        marked = 0
        for number in sorted({statement.number for statement in listed}):
            if number in self.done:
                continue
            posted = await asyncio.to_thread(self.escrow.epoch_of, number)
            if posted["status"] == 0:  # not posted yet: look again next pass
                continue
            view = await self.committee.query("/payouts", epoch=number)
            vouchers = []
            for payer, gateway, kind, ident, total in view.get("charges", []):
                if str(gateway).lower() != mine:
                    continue
                if kind == "voucher":
                    vouchers.append(bytes.fromhex(str(ident)[2:]))
                elif kind == "key" and self.desk.mark_key_debited(
                    str(payer), bytes.fromhex(str(ident)[2:]), int(total)
                ):
                    marked += 1
            count = self.desk.mark_debited(vouchers) if vouchers else 0
            if count:
                log.info("prepaid charges debited statement=%d count=%d", number, count)
            marked += count
            self.done.add(number)
        return marked
