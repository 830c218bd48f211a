"""A gateway killed between its two files loses nothing: the receipt log (written first) numbers
its receipts, the work ledger records the number it reached, and at start the ledger records
every receipt numbered above it, once; a charge without a circuit still reaches the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.gateway.payment_state import QuestionPayment
from node.gateway.settlement import COMPACT_LINES, WorkLedger, ledger_paths
from protocol.payment import parse_payment_key
from tests.unit.test_gateway_keys import PAYER, desk, funded, key_text

pytestmark = pytest.mark.unit

NODES = ["aa" * 32, "bb" * 32]


def ledger(receipts: Path) -> WorkLedger:
    journal, refused = ledger_paths(receipts)
    return WorkLedger(journal=journal, refused_path=refused)


async def charge(payments, text: str, on_charged=None, circuit=None) -> dict:
    """One question paid by the key, charged through the payment state machine."""
    reservation = await payments.reserve(parse_payment_key(text), 100)
    state = QuestionPayment(payments, reservation, 5, on_charged=on_charged)
    state.produce(2)
    state.deliver(2)
    return state.finish(circuit)


class Hops:
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.nodes = [type("Hop", (), {"key": k, "shard": i})() for i, k in enumerate(keys)]


async def test_receipts_are_numbered_in_log_order_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    text = key_text(10_000)
    first = await charge(payments, text, circuit=Hops(NODES))
    second = await charge(payments, text, circuit=Hops(NODES))
    restarted = desk(funded(), path)
    assert [doc["query_id"] for _, doc in restarted.receipts_after(0)] == [
        first["query_id"],
        second["query_id"],
    ]
    assert [n for n, _ in restarted.receipts_after(1)] == [2]
    third = await charge(restarted, text, circuit=Hops(NODES))
    assert restarted.receipts_after(2) == [(3, third)]


async def test_a_receipt_logged_but_not_recorded_is_recorded_once_at_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    books = ledger(path)
    text = key_text(10_000)
    await charge(payments, text, books.record, Hops(NODES))
    # killed after the receipt log's fsync and before the ledger's: the second question's
    # receipt left the gateway, the ledger never saw it
    lost = await charge(payments, text, None, Hops(NODES))
    restarted_desk, restarted = desk(funded(), path), ledger(path)
    assert restarted.recorded_through == 1
    assert restarted.catch_up(restarted_desk.receipts_after(restarted.recorded_through)) == 1
    [(item, _)] = restarted.charges.values()
    assert item.total == int(lost["key"]["total_wei"]) == 140  # the running total reached
    # a second restart finds the caught-up receipt in the ledger file: nothing twice
    again = ledger(path)
    assert again.catch_up(desk(funded(), path).receipts_after(again.recorded_through)) == 0
    assert again.charges == restarted.charges


async def test_the_number_reached_survives_the_ledgers_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    books = ledger(path)
    text = key_text(10_000)
    for _ in range(3):
        await charge(payments, text, books.record, Hops(NODES))
    monkeypatch.setattr("node.gateway.settlement.COMPACT_LINES", 0)
    books._maybe_compact()
    assert COMPACT_LINES > 0
    reloaded = ledger(path)
    assert reloaded.recorded_through == 3
    assert reloaded.catch_up(desk(funded(), path).receipts_after(3)) == 0


async def test_a_charge_without_a_circuit_still_reaches_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(funded(), path)
    books = ledger(path)
    await charge(payments, key_text(10_000), books.record, None)
    [(item, _)] = books.charges.values()
    assert (item.payer, item.total) == (PAYER.lower(), 70)
    assert books.recorded_through == 1
