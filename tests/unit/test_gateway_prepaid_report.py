"""A gateway's prepaid receipts reach the committee as cumulative charges (no circuit), the chain
accepts them, and once a posted root covers them the gateway marks them debited: voucher
charges by query id, key charges by the total the root debited."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from node.gateway.settlement import DebitTracker, WorkLedger
from tests.unit.test_abci_prepaid import GATEWAY_EVM, NOW, charge, payer
from tests.unit.test_abci_settlement import GATEWAY, next_epoch_end, settled_chain
from tests.unit.test_gateway_work_ledger import (
    ReportingLink,
    prepaid_receipt,
    reporter,
)

pytestmark = pytest.mark.unit


def key_receipt(n: int, total: int, fee: int) -> dict[str, Any]:
    """A key-paid receipt: question `n` under payer-1's key 77, `total` charged under it now."""
    item = charge("payer-1", 77, total, kind="key")
    doc = prepaid_receipt(item)
    del doc["voucher"]
    doc.update(
        query_id="0x" + f"{1000 + n:064x}",
        fee_wei=str(fee),
        key={
            "key_id": item.id,
            "cap_wei": str(item.cap),
            "expiry": item.expiry,
            "signature": item.signature,
            "total_wei": str(total),
        },
    )
    return doc


@dataclass
class Desk:
    gateway: str = GATEWAY_EVM.upper().replace("0X", "0x")  # as a wallet spells it
    charged: dict[bytes, tuple[str, int]] = field(default_factory=dict)
    keys: dict[tuple[str, bytes], tuple[int, int]] = field(default_factory=dict)
    marked: list[bytes] = field(default_factory=list)

    def undebited(self) -> dict[bytes, tuple[str, int]]:
        return dict(self.charged)

    def undebited_keys(self) -> dict[tuple[str, bytes], tuple[int, int]]:
        return {k: v for k, v in self.keys.items() if v[0] > v[1]}

    def mark_debited(self, query_ids: Any) -> int:
        ids = [q for q in query_ids if q in self.charged]
        for q in ids:
            del self.charged[q]
        self.marked.extend(ids)
        return len(ids)

    def mark_key_debited(self, payer: str, key_id: bytes, total: int) -> int:
        charged, debited = self.keys[(payer, key_id)]
        newly = max(0, min(total, charged) - debited)
        self.keys[(payer, key_id)] = (charged, debited + newly)
        return newly


@dataclass
class Escrow:
    posted: set[int] = field(default_factory=set)

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        return {"status": 1 if epoch in self.posted else 0}


async def test_prepaid_receipts_are_reported_as_charges_and_marked_once_posted() -> None:
    chain = settled_chain()
    chain.time_s = NOW
    ledger = WorkLedger(min_questions=1)
    vouchers = [charge("payer-1", n, fee) for n, fee in ((1, 70), (2, 30))]
    for item in vouchers:
        ledger.record(prepaid_receipt(item))
    ledger.record(key_receipt(1, 40, 40))
    ledger.record(key_receipt(2, 65, 25))  # the same key: only the new total travels
    report = ledger.take()
    assert report is not None and report.queries == ()  # prepaid questions are no deposits
    assert [(c.kind, c.total) for c in report.charges] == [
        ("key", 65),
        ("voucher", 70),
        ("voucher", 30),
    ]
    assert set(report.to_json()) == {"queries", "charges"}  # no node named anywhere
    link = ReportingLink(chain, GATEWAY)
    assert await reporter(ledger, link).flush() == 1 and ledger.refused == []
    epoch = next_epoch_end(chain)  # the gateway's revenue page: no node needed to be paid
    desk = Desk(
        charged={bytes.fromhex(f"{n:064x}"): (payer("payer-1"), 1) for n in (1, 2, 3)},
        keys={(payer("payer-1"), bytes.fromhex(f"{77:064x}")): (65, 0)},
    )
    escrow = Escrow()
    tracker = DebitTracker(link, escrow, desk)
    assert await tracker.step() == 0 and desk.marked == []  # root not posted yet
    escrow.posted.add(epoch)
    assert await tracker.step() == 3
    assert sorted(desk.marked) == [bytes.fromhex(f"{n:064x}") for n in (1, 2)]
    assert list(desk.charged) == [bytes.fromhex(f"{3:064x}")]  # in no root: still outstanding
    assert desk.keys[(payer("payer-1"), bytes.fromhex(f"{77:064x}"))] == (65, 65)
    assert await tracker.step() == 0


def test_a_charge_near_its_authorizations_expiry_is_reported_without_waiting() -> None:
    now = [float(NOW)]
    ledger = WorkLedger(min_questions=4, max_wait_s=60, wall=lambda: now[0])
    ledger.clock = lambda: 0.0
    ledger.record(prepaid_receipt(charge("payer-1", 1, 5, expiry=NOW + 600)))
    assert not ledger.ready()  # 1 question of 4, nothing waited
    now[0] = NOW + 600 - 61
    assert not ledger.ready()
    now[0] = NOW + 600 - 60  # within the margin: report before the chain would refuse it
    assert ledger.ready()


@dataclass
class Statements:
    """A committee's `/payouts` as abci_app/payout_queries.py pages it (newest first, at most
    `page` a page, `next` the `after` of the next page): statement n debits voucher n of this
    gateway."""

    numbers: list[int]
    page: int = 2  # the committee's most a page (1,000 in production)
    reads: int = 0

    async def query(self, path: str, **params: Any) -> Any:
        assert path == "/payouts"
        if "epoch" in params:
            n = int(params["epoch"])
            return {"charges": [[payer("payer-1"), GATEWAY_EVM, "voucher", voucher(n), "1"]]}
        self.reads += 1
        order = sorted(self.numbers, reverse=True)
        if "after" in params:
            order = order[order.index(int(params["after"])) + 1 :]
        size = min(int(params.get("limit", self.page)), self.page)
        rows = order[:size]
        more = len(order) > size
        return {
            "epochs": [{"epoch": n, "pages": 1} for n in rows],
            "next": str(rows[-1]) if more else None,
        }


def voucher(n: int) -> str:
    return "0x" + f"{n:064x}"


async def test_debit_tracker_reads_every_page_and_a_capped_read_drops_no_debit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 42: the tracker follows `/payouts` to its last page: 5 posted statements listed 2 a
    page all mark their charges debited (with `limit=200` it saw the 2 newest and the others'
    charges stayed held for good). Past `max_pages` it marks only what it read, says so, and
    the rest stay outstanding (held against their payers) until a pass reads them; nothing is
    marked twice."""
    ids = {n: bytes.fromhex(voucher(n)[2:]) for n in range(1, 6)}
    committee, escrow = Statements(list(ids)), Escrow(posted=set(ids))

    def owed() -> Desk:
        return Desk(charged={q: (payer("payer-1"), 1) for q in ids.values()})

    desk = owed()
    tracker = DebitTracker(committee, escrow, desk)
    assert await tracker.step() == 5
    assert committee.reads == 3 and desk.charged == {}
    assert await tracker.step() == 0
    desk = owed()
    capped = DebitTracker(committee, escrow, desk, max_pages=1)
    with caplog.at_level("WARNING", logger="node.gateway.settlement"):
        assert await capped.step() == 2
    assert any("stay outstanding" in r.getMessage() for r in caplog.records)
    assert sorted(desk.charged) == [ids[1], ids[2], ids[3]]  # held, not dropped
    assert await DebitTracker(committee, escrow, desk).step() == 3
    assert await capped.step() == 0 and desk.charged == {}
    assert sorted(desk.marked) == sorted(ids.values())  # each once
