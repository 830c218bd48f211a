"""Prepaid debits per (payer, gateway): the epoch close hashes them as the escrow does
(`Charges(queryIds, fees, payers, gateways, debits)`) and pays them out like fees; an epoch in
pages cuts the epoch's rows so each page pays exactly its own charges."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest
from eth_abi import encode as abi_encode
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import eip712
from shares.errors import AccountError, DuplicateError, PageError
from shares.keccak import keccak256
from shares.payouts import ComputeWork, EpochWork, PayerDebit, SettledQuery, ShardHealth
from shares.settlement import PageCharges, close_epoch, close_epoch_pages, sorted_queries_hash

pytestmark = pytest.mark.unit

M = "smollm2-135m"
A = "0x" + "a" * 40
B = "0x" + "b" * 40
P1 = "0x" + "1" * 40
P2 = "0x" + "2" * 40
P3 = "0x" + "F" * 40
G1 = "0x" + "6" * 40
G2 = "0x" + "7" * 40
Q1 = "0x" + "01" * 32
Q2 = "0x" + "02" * 32


def normative_queries_hash(
    ids: Sequence[bytes],
    fees: Sequence[int],
    payers: Sequence[str] = (),
    gateways: Sequence[str] = (),
    debits: Sequence[int] = (),
) -> bytes:
    """keccak256(abi.encode(bytes32[], uint256[], address[], address[], uint256[])) by eth-abi."""
    types = ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"]
    values = [list(ids), list(fees), list(payers), list(gateways), list(debits)]
    return keccak256(abi_encode(types, values))


def work(debits: tuple[PayerDebit, ...] = (), queries: tuple[SettledQuery, ...] = ()) -> EpochWork:
    return EpochWork(
        epoch=4,
        queries=queries,
        compute=(ComputeWork(A, M, 0, 2, 10), ComputeWork(B, M, 0, 1, 10)),
        health=(ShardHealth(M, 0, 3),),
        debits=debits,
    )


def test_close_epoch_debits_sorted_by_payer_then_gateway_and_hashed_as_the_escrow_does() -> None:
    debits = (PayerDebit(P3, G1, 9), PayerDebit(P1, G2, 5), PayerDebit(P1, G1, 4))
    settlement = close_epoch(work(debits, (SettledQuery(Q1, 2),)))
    assert settlement.payers == (P1, P1, P3.lower())
    assert settlement.gateways == (G1, G2, G1)
    assert settlement.debits == (4, 5, 9)
    assert settlement.total == 20
    expected = normative_queries_hash(
        [bytes.fromhex(Q1[2:])], [2], [P1, P1, P3], [G1, G2, G1], [4, 5, 9]
    )
    assert settlement.queries_hash == expected
    again = close_epoch(work(tuple(reversed(debits)), (SettledQuery(Q1, 2),)))
    assert again.queries_hash == settlement.queries_hash


def test_close_epoch_without_debits_hashes_empty_payer_and_gateway_arrays() -> None:
    settlement = close_epoch(work((), (SettledQuery(Q1, 2),)))
    assert (settlement.payers, settlement.gateways, settlement.debits) == ((), (), ())
    assert settlement.queries_hash == normative_queries_hash([bytes.fromhex(Q1[2:])], [2])


def test_epoch_work_one_debit_per_payer_and_gateway() -> None:
    work((PayerDebit(P1, G1, 1), PayerDebit(P1, G2, 2)))  # one payer, two gateways: two debits
    with pytest.raises(DuplicateError):
        work((PayerDebit(P1, G1, 1), PayerDebit(P1.upper().replace("0X", "0x"), G1, 2)))


@settings(deadline=None)
@given(
    n=st.integers(0, 5),
    debits=st.lists(st.integers(0, (1 << 128) - 1), min_size=0, max_size=5),
)
def test_sorted_queries_hash_equals_the_normative_encoding(n: int, debits: list[int]) -> None:
    ids = tuple(keccak256(bytes([i])) for i in range(n))
    fees = tuple((1 << 64) - 1 - i for i in range(n))
    payers = tuple(f"0x{i + 1:040x}" for i in range(len(debits)))
    gateways = tuple(f"0x{255 - i:040x}" for i in range(len(debits)))
    expected = normative_queries_hash(ids, fees, payers, gateways, debits)
    assert sorted_queries_hash(ids, fees, payers, gateways, tuple(debits)) == expected


@pytest.mark.skipif(
    "gateways" not in inspect.signature(eip712.queries_hash).parameters,
    reason="protocol.eip712.queries_hash gains `gateways` with the escrow change (issue 24)",
)
def test_sorted_queries_hash_equals_protocol_queries_hash() -> None:
    ids = (keccak256(b"a"), keccak256(b"b"))
    args = {"payers": [P1, P2], "gateways": [G2, G1], "debits": [3, 4]}
    expected = eip712.queries_hash(ids, [5, 6], **args)  # type: ignore[call-arg]
    assert sorted_queries_hash(ids, (5, 6), (P1, P2), (G2, G1), (3, 4)) == expected


def test_pages_cut_the_epochs_rows_so_each_pays_exactly_its_charges() -> None:
    pages = (
        PageCharges(4, (SettledQuery(Q1, 700),)),
        PageCharges(4 + (1 << 32), (SettledQuery(Q2, 250),), (PayerDebit(P1, G1, 51),)),
    )
    settled = close_epoch_pages(work(), pages)
    whole = close_epoch(
        work((PayerDebit(P1, G1, 51),), (SettledQuery(Q1, 700), SettledQuery(Q2, 250)))
    )
    assert [s.epoch for s in settled] == [4, 4 + (1 << 32)]
    assert [s.total for s in settled] == [700, 301]
    for page in settled:
        assert sum(amount for _, amount in page.rows) == page.total
        for account, amount in page.rows:
            assert page.proof(account)[0] == amount
    paid: dict[str, int] = {}
    for page in settled:
        for account, amount in page.rows:
            paid[account] = paid.get(account, 0) + amount
    assert paid == dict(whole.table.payouts)  # A 2/3, B 1/3 of 1,001 in all
    # an account's row is split only where a page ends: at most one account claims twice
    assert sum(len(page.rows) for page in settled) <= len(whole.table.payouts) + len(pages) - 1


@pytest.mark.parametrize(
    "pages",
    [
        (),
        (PageCharges(4, (SettledQuery(Q1, 1),)), PageCharges(5)),
        (PageCharges(4, (SettledQuery(Q1, 1),)), PageCharges(4, (SettledQuery(Q2, 1),))),
        (PageCharges(4, (SettledQuery(Q1, 1),)), PageCharges(5, (SettledQuery(Q1, 1),))),
    ],
    ids=["none", "empty", "same_number", "query_twice"],
)
def test_pages_that_break_a_rule_are_refused(pages: tuple[PageCharges, ...]) -> None:
    with pytest.raises((PageError, DuplicateError)):
        close_epoch_pages(work(), pages)
    with pytest.raises(PageError):
        close_epoch_pages(
            work(queries=(SettledQuery(Q1, 1),)), (PageCharges(4, (SettledQuery(Q2, 1),)),)
        )


def test_a_gateway_page_pays_its_gateway_alone_and_the_pool_pages_split_the_rest() -> None:
    draw = PayerDebit(G2, G2, 900)  # the pool's draw (the escrow's own pair)
    pages = (
        PageCharges(4, debits=(draw,), purchases=(PayerDebit(P1, G2, 900),)),
        PageCharges(4 + (1 << 32), (SettledQuery(Q1, 700),), (PayerDebit(P1, G1, 51),), gateway=G1),
        PageCharges(4 + (2 << 32), debits=(PayerDebit(P2, B, 8),), gateway="0x" + B[2:].upper()),
    )
    pool, first, second = close_epoch_pages(work(), pages)
    whole = close_epoch(work((draw,)))
    assert pool.rows == whole.rows and pool.total == 900  # the shares split the draw only
    assert first.rows == ((G1, 751),) and first.total == 751
    assert second.rows == ((B, 8),)  # an account that also has a share: its page is its own
    assert first.proof(G1)[0] == 751 and first.table is pool.table
    # the same pages without the pool's: no share is needed to pay a gateway
    alone = close_epoch_pages(EpochWork(epoch=4, queries=(), compute=()), pages[1:2])
    assert [s.rows for s in alone] == [((G1, 751),)]


@pytest.mark.parametrize(
    "page",
    [
        lambda: PageCharges(4, debits=(PayerDebit(P1, G2, 5),), gateway=G1),
        lambda: PageCharges(
            4, (SettledQuery(Q1, 1),), purchases=(PayerDebit(P1, G2, 5),), gateway=G1
        ),
        lambda: PageCharges(4, (SettledQuery(Q1, 1),), gateway="0x12"),
    ],
    ids=["another_gateways_debit", "a_purchase", "not_an_address"],
)
def test_a_gateway_page_holds_only_its_own_charges(page: object) -> None:
    with pytest.raises((PageError, AccountError)):
        page()  # type: ignore[operator]
