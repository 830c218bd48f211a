"""Prepaid debits: the epoch close hashes them as the escrow does, pays them out like fees, and
`prepaid_debits` aggregates voucher charges per payer (no replay, no charge above the cap)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.eip712 import queries_hash
from shares.errors import DuplicateError, VoucherChargeError
from shares.keccak import keccak256
from shares.payouts import ComputeWork, EpochWork, PayerDebit, SettledQuery, ShardHealth
from shares.settlement import VoucherCharge, close_epoch, prepaid_debits, sorted_queries_hash

pytestmark = pytest.mark.unit

M = "smollm2-135m"
A = "0x" + "a" * 40
P1 = "0x" + "1" * 40
P2 = "0x" + "2" * 40
P3 = "0x" + "F" * 40
Q1 = "0x" + "01" * 32
Q2 = "0x" + "02" * 32


def work(debits: tuple[PayerDebit, ...], queries: tuple[SettledQuery, ...] = ()) -> EpochWork:
    return EpochWork(
        epoch=4,
        queries=queries,
        compute=(ComputeWork(A, M, 0, 2, 10),),
        health=(ShardHealth(M, 0, 3),),
        debits=debits,
    )


def test_close_epoch_debits_sorted_by_payer_and_hashed_as_the_escrow_does() -> None:
    settlement = close_epoch(work((PayerDebit(P3, 9), PayerDebit(P1, 5)), (SettledQuery(Q1, 2),)))
    assert settlement.payers == (P1, P3.lower())
    assert settlement.debits == (5, 9)
    assert settlement.total == 16
    assert settlement.amount_of(A) == 16
    assert settlement.queries_hash == queries_hash([Q1], [2], [P1, P3], [5, 9])
    again = close_epoch(work((PayerDebit(P1, 5), PayerDebit(P3, 9)), (SettledQuery(Q1, 2),)))
    assert again.queries_hash == settlement.queries_hash


def test_close_epoch_without_debits_hashes_empty_payer_arrays() -> None:
    settlement = close_epoch(work((), (SettledQuery(Q1, 2),)))
    assert (settlement.payers, settlement.debits) == ((), ())
    assert settlement.queries_hash == queries_hash([Q1], [2], [], [])


def test_epoch_work_duplicate_payer_refused() -> None:
    with pytest.raises(DuplicateError):
        work((PayerDebit(P1, 1), PayerDebit(P1.upper().replace("0X", "0x"), 2)))


@settings(deadline=None)
@given(
    n=st.integers(0, 5),
    debits=st.lists(st.integers(0, (1 << 128) - 1), min_size=0, max_size=5),
)
def test_sorted_queries_hash_with_debits_equals_the_normative_encoding(
    n: int, debits: list[int]
) -> None:
    ids = tuple(keccak256(bytes([i])) for i in range(n))
    fees = tuple((1 << 64) - 1 - i for i in range(n))
    payers = tuple(f"0x{i + 1:040x}" for i in range(len(debits)))
    expected = queries_hash(ids, fees, payers, debits)
    assert sorted_queries_hash(ids, fees, payers, tuple(debits)) == expected


def test_prepaid_debits_sums_per_payer_sorted() -> None:
    charges = [
        VoucherCharge(P2, Q1, 3, 10),
        VoucherCharge(P1, Q1, 4, 4),
        VoucherCharge(P2, Q2, 5, 5),
    ]
    assert prepaid_debits(charges) == (PayerDebit(P1, 4), PayerDebit(P2, 8))
    assert prepaid_debits(reversed(charges)) == prepaid_debits(charges)
    assert prepaid_debits([]) == ()


def test_prepaid_debits_replayed_voucher_refused() -> None:
    with pytest.raises(DuplicateError):
        prepaid_debits(
            [VoucherCharge(P1, "0x" + "ab" * 32, 1, 2), VoucherCharge(P1, "0x" + "AB" * 32, 1, 2)]
        )


def test_voucher_charge_above_cap_refused() -> None:
    with pytest.raises(VoucherChargeError, match="cap"):
        VoucherCharge(P1, Q1, 11, 10)


@pytest.mark.parametrize(
    "field,value",
    [("payer", "0x12"), ("query_id", "0x" + "1" * 63), ("query_id", 7), ("fee", -1), ("fee", True)],
)
def test_voucher_charge_malformed_refused(field: str, value: object) -> None:
    good = {"payer": P1, "query_id": Q1, "fee": 1, "fee_cap": 2}
    with pytest.raises(Exception) as caught:
        VoucherCharge(**{**good, field: value})
    assert type(caught.value).__name__ in {"AccountError", "VoucherChargeError", "CountError"}


def test_prepaid_debits_rejects_foreign_items() -> None:
    with pytest.raises(VoucherChargeError):
        prepaid_debits([dataclasses.asdict(VoucherCharge(P1, Q1, 1, 2))])  # type: ignore[list-item]
