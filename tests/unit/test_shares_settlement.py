"""Epoch close: root, total and queries hash agree with the contracts' encodings."""

from __future__ import annotations

import pytest
from eth_utils import keccak as eth_keccak

from protocol.eip712 import PayoutRoot
from protocol.errors import ProtocolError
from shares.errors import AccountError, NothingToPayError
from shares.keccak import bulk_keccak256, keccak256
from shares.merkle import PayoutTree, leaf_hash, payout_leaf_hashes, verify
from shares.payouts import (
    ComputeWork,
    EpochWork,
    SettledQuery,
    ShardHealth,
    VerificationWork,
)
from shares.settlement import close_epoch, sorted_queries_hash
from tests.unit.test_shares_debits import normative_queries_hash

pytestmark = pytest.mark.unit

M = "smollm2-135m"
A = "0x" + "a" * 40
B = "0x" + "b" * 40
C = "0x" + "c" * 40
V1 = "0x" + "1" * 40
V2 = "0x" + "2" * 40
Q1 = "0x" + "01" * 32
Q2 = "0x" + "02" * 32
Q3 = "0x" + "ff" * 32


def work(queries: tuple[SettledQuery, ...] | None = None) -> EpochWork:
    """docs/shares.md's worked example (tests/unit/test_payouts.py has the split)."""
    return EpochWork(
        epoch=9,
        queries=queries or (SettledQuery(Q1, 1_000), SettledQuery(Q2, 1)),
        compute=(
            ComputeWork(A, M, 0, 2, 10),
            ComputeWork(B, M, 0, 2, 5),
            ComputeWork(C, M, 1, 1, 1),
        ),
        verification=(VerificationWork(V1, 2), VerificationWork(V2, 1)),
        health=(ShardHealth(M, 0, 3), ShardHealth(M, 1, 1)),
        verifier_cut_bps=1_000,
    )


def test_close_epoch_root_is_the_payout_tree_root_and_every_proof_verifies() -> None:
    settlement = close_epoch(work())
    expected = {V1: 67, V2: 33, A: 515, B: 257, C: 129}
    tree = PayoutTree.for_epoch(9, expected)  # the path the contracts' vectors are checked on
    assert settlement.root == tree.root
    assert settlement.total == tree.total == 1_001
    for account, amount in expected.items():
        claimed, proof = settlement.proof(account)
        assert claimed == amount == settlement.amount_of(account.upper().replace("0X", "0x"))
        payout, tree_proof = tree.proof_for(9, account)
        assert verify(settlement.root, payout, proof)
        assert sorted(proof) == sorted(tree_proof)


def test_close_epoch_statement_is_the_signed_payout_root_struct() -> None:
    settlement = close_epoch(work())
    escrow = "0x" + "ab" * 20
    statement = settlement.statement(escrow)
    assert isinstance(statement, PayoutRoot)
    assert statement.consumer.lower() == escrow
    assert (statement.epoch, statement.root, statement.total) == (9, settlement.root, 1_001)
    assert statement.queries_hash == settlement.queries_hash


def test_close_epoch_queries_are_sorted_and_hashed_as_the_escrow_does() -> None:
    queries = (SettledQuery(Q3, 7), SettledQuery(Q1, 1_000), SettledQuery(Q2, 1))
    settlement = close_epoch(work(queries))
    assert settlement.query_ids == (
        bytes.fromhex(Q1[2:]),
        bytes.fromhex(Q2[2:]),
        bytes.fromhex(Q3[2:]),
    )
    assert settlement.fees == (1_000, 1, 7)
    ids = [bytes.fromhex(q[2:]) for q in (Q1, Q2, Q3)]
    assert settlement.queries_hash == normative_queries_hash(ids, [1_000, 1, 7])
    assert settlement.total == sum(settlement.fees)
    reordered = close_epoch(work(tuple(reversed(queries))))
    assert reordered.queries_hash == settlement.queries_hash
    assert reordered.root == settlement.root


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_sorted_queries_hash_equals_the_normative_encoding(n: int) -> None:
    ids = tuple(keccak256(bytes([i])) for i in range(n))
    fees = tuple((1 << 64) - 1 - 3 * i for i in range(n))
    assert sorted_queries_hash(ids, fees) == normative_queries_hash(ids, fees)


def test_close_epoch_nothing_to_pay_raises_named_error() -> None:
    with pytest.raises(NothingToPayError):
        close_epoch(work((SettledQuery(Q1, 0),)))


def test_settlement_proof_of_an_account_without_payout_is_refused() -> None:
    settlement = close_epoch(work())
    assert settlement.amount_of("0x" + "d" * 40) == 0
    with pytest.raises(AccountError):
        settlement.proof("0x" + "d" * 40)


def test_payout_leaf_hashes_equal_leaf_hash() -> None:
    rows = [(A, 1), ("0x" + "AbCd" * 10, 10**18), (V1, (1 << 256) - 1), (B, 0)]
    expected = [leaf_hash(2**64 - 1, account, amount) for account, amount in rows]
    assert payout_leaf_hashes(2**64 - 1, rows) == expected


@pytest.mark.parametrize(
    "row",
    [
        ("0x" + " " * 40, 1),
        ("0x" + "g" * 40, 1),
        ("0x" + "a" * 38, 1),
        (b"\x00" * 20, 1),
        (A, -1),
        (A, 1 << 256),
        (A, True),
    ],
)
def test_payout_leaf_hashes_refuse_bad_rows(row: tuple[object, object]) -> None:
    with pytest.raises(ProtocolError):
        payout_leaf_hashes(1, [row])  # type: ignore[list-item]


def test_payout_leaf_hashes_refuse_bad_epoch() -> None:
    with pytest.raises(ProtocolError):
        payout_leaf_hashes(1 << 64, [(A, 1)])


def test_bulk_keccak_equals_eth_keccak() -> None:
    hasher = bulk_keccak256()
    for data in (b"", b"abc", bytes(range(256)) * 5, bytes(135), bytes(136), bytes(137)):
        assert hasher(data) == eth_keccak(data) == keccak256(data)


def test_bulk_keccak_falls_back_to_eth_hash_when_the_fast_binding_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shares.keccak as keccak_module

    def missing() -> object:
        raise ImportError("no cffi binding")

    monkeypatch.setattr(keccak_module, "_fast_ok", None)
    monkeypatch.setattr(keccak_module, "_fast_hasher", missing)
    assert keccak_module.bulk_keccak256() is keccak_module.keccak256
    assert keccak_module._fast_ok is False
    rows = [(A, 5), (B, 7)]
    assert payout_leaf_hashes(3, rows) == [leaf_hash(3, a, amount) for a, amount in rows]
