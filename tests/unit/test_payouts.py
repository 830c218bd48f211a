"""The epoch payout table: hand-computed splits (remainder rule included) and every rejection."""

from __future__ import annotations

import pytest

from protocol.errors import ProtocolError
from shares.errors import (
    AccountError,
    BasisPointsError,
    CountError,
    DuplicateError,
    NothingToPayError,
    PoolHealthError,
    QueryIdError,
    ShareInputError,
)
from shares.payouts import (
    ComputeWork,
    EpochWork,
    SettledQuery,
    ShardHealth,
    VerificationWork,
    payout_table,
    rows_out_of,
    split_pro_rata,
)

pytestmark = pytest.mark.unit

M = "smollm2-135m"
A = "0x" + "a" * 40
B = "0x" + "b" * 40
C = "0x" + "c" * 40
V1 = "0x" + "1" * 40
V2 = "0x" + "2" * 40
Q1 = "0x" + "01" * 32
Q2 = "0x" + "02" * 32


def example(**changes: object) -> EpochWork:
    """The worked example of docs/shares.md.

    Fees 1,000 + 1 = 1,001 wei; verifier cut 1,000 bps → verifier pool ⌊1,001 · 0.1⌋ = 100,
    compute pool 901. Shard 0 has 3 routable nodes (1×), shard 1 has 1 (5×):
      A: 2 layers × 10 tokens × 40 = 800 shares;  B: 2 × 5 × 40 = 400;  C: 1 × 1 × 40 × 5 = 200.
    """
    fields: dict[str, object] = {
        "epoch": 9,
        "queries": (SettledQuery(Q1, 1_000), SettledQuery(Q2, 1)),
        "compute": (
            ComputeWork(A, M, 0, 2, 10),
            ComputeWork(B, M, 0, 2, 5),
            ComputeWork(C, M, 1, 1, 1),
        ),
        "verification": (VerificationWork(V1, 2), VerificationWork(V2, 1)),
        "health": (ShardHealth(M, 0, 3), ShardHealth(M, 1, 1)),
        "slashed": (),
        "verifier_cut_bps": 1_000,
    }
    fields.update(changes)
    return EpochWork(**fields)  # type: ignore[arg-type]


def test_payout_table_worked_example_exact_amounts() -> None:
    table = payout_table(example())
    assert (table.fees, table.compute_pool, table.verifier_pool) == (1_001, 901, 100)
    assert table.compute_shares == {A: 800, B: 400, C: 200}
    assert table.verification_shares == {V1: 2, V2: 1}
    # 901·800/1400 = 514 r 1200; 901·400/1400 = 257 r 600; 901·200/1400 = 128 r 1000:
    # 899 handed out, 2 wei left → A (1200) and C (1000), the two largest remainders.
    assert table.compute_payouts == {A: 515, B: 257, C: 129}
    # 100·2/3 = 66 r 2; 100·1/3 = 33 r 1: 1 wei left → V1.
    assert table.verifier_payouts == {V1: 67, V2: 33}
    assert table.payouts == ((V1, 67), (V2, 33), (A, 515), (B, 257), (C, 129))
    assert table.total == 1_001


def test_payout_table_slashed_account_earns_nothing_and_others_share_its_part() -> None:
    table = payout_table(example(slashed=("0x" + "B" * 40,)))
    # S = 1000: A 901·800/1000 = 720 r 800, C 901·200/1000 = 180 r 200: 1 wei left → A.
    assert table.compute_payouts == {A: 721, C: 180}
    assert B not in dict(table.payouts)
    assert table.total == 1_001


def test_payout_table_slashed_verifier_leaves_the_whole_verifier_pool_to_the_other() -> None:
    table = payout_table(example(slashed=(V1,)))
    assert table.verifier_payouts == {V2: 100}


def test_split_ties_go_to_the_smaller_account_whatever_the_input_order() -> None:
    low, mid, high = "0x" + "0" * 39 + "1", "0x" + "0" * 39 + "2", "0x" + "0" * 39 + "3"
    amounts = split_pro_rata(10, {high: 1, low: 1, mid: 1})
    assert amounts == {low: 4, mid: 3, high: 3}
    amounts = split_pro_rata(11, {high: 1, mid: 1, low: 1})
    assert amounts == {low: 4, mid: 4, high: 3}


def test_split_larger_remainder_beats_smaller_account() -> None:
    low, high = "0x" + "0" * 39 + "1", "0x" + "0" * 39 + "2"
    # pool 4 over shares 1 (low) and 2 (high): low 4/3 = 1 r 1, high 8/3 = 2 r 2 → the 1 wei
    # left goes to high, the larger remainder, although low is the smaller account.
    assert split_pro_rata(4, {low: 1, high: 2}) == {low: 1, high: 3}


def test_payout_table_no_verifier_gives_the_compute_pool_everything() -> None:
    table = payout_table(example(verification=()))
    assert (table.compute_pool, table.verifier_pool) == (1_001, 0)
    assert table.verifier_payouts == {}
    assert sum(table.compute_payouts.values()) == 1_001


def test_payout_table_all_compute_slashed_gives_the_verifiers_everything() -> None:
    table = payout_table(example(slashed=(A, B, C)))
    assert (table.compute_pool, table.verifier_pool) == (0, 1_001)
    # 1001·2/3 = 667 r 1, 1001/3 = 333 r 2: 1 wei left → V2 (larger remainder).
    assert table.payouts == ((V1, 667), (V2, 334))


def test_payout_table_account_that_computes_and_verifies_gets_one_merged_row() -> None:
    table = payout_table(example(verification=(VerificationWork(A, 2), VerificationWork(V2, 1))))
    assert table.compute_payouts[A] == 515
    assert table.verifier_payouts[A] == 67
    assert dict(table.payouts)[A] == 582
    assert [account for account, _ in table.payouts] == sorted({A, B, C, V2})


def test_payout_table_zero_amount_gets_no_row() -> None:
    work = example(
        queries=(SettledQuery(Q1, 1),),
        compute=(ComputeWork(A, M, 0, 1, 1), ComputeWork(B, M, 0, 1, 1)),
        verification=(),
    )
    table = payout_table(work)
    assert table.compute_payouts == {A: 1, B: 0}
    assert table.payouts == ((A, 1),)


def test_payout_table_scarcity_bonus_doubles_under_three_nodes() -> None:
    work = example(
        compute=(ComputeWork(A, M, 0, 1, 10), ComputeWork(B, M, 1, 1, 10)),
        health=(ShardHealth(M, 0, 3), ShardHealth(M, 1, 2)),
        verification=(),
        queries=(SettledQuery(Q1, 300),),
    )
    table = payout_table(work)
    assert table.compute_shares == {A: 400, B: 800}
    assert table.payouts == ((A, 100), (B, 200))


def test_payout_table_zero_fees_is_nothing_to_pay() -> None:
    with pytest.raises(NothingToPayError):
        payout_table(example(queries=(SettledQuery(Q1, 0),)))


def test_payout_table_everyone_slashed_is_nothing_to_pay() -> None:
    with pytest.raises(NothingToPayError) as caught:
        payout_table(example(slashed=(A, B, C, V1, V2)))
    assert isinstance(caught.value, ProtocolError)


def test_payout_table_only_zero_token_work_is_nothing_to_pay() -> None:
    work = example(compute=(ComputeWork(A, M, 0, 4, 0),), verification=(VerificationWork(V1, 0),))
    with pytest.raises(NothingToPayError):
        payout_table(work)


# -- rejections at construction -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: ComputeWork(A, M, 0, 1, -1), CountError),
        (lambda: ComputeWork(A, M, 0, 0, 1), CountError),
        (lambda: ComputeWork(A, M, -1, 1, 1), CountError),
        (lambda: ComputeWork(A, M, 1 << 32, 1, 1), CountError),
        (lambda: ComputeWork(A, M, 0, 1, True), CountError),
        (lambda: ComputeWork("0x" + "g" * 40, M, 0, 1, 1), AccountError),
        (lambda: ComputeWork("a" * 42, M, 0, 1, 1), AccountError),
        (lambda: ComputeWork(A + "\n", M, 0, 1, 1), AccountError),
        (lambda: ComputeWork(A, "", 0, 1, 1), ShareInputError),
        (lambda: ComputeWork(A, "m" * 65, 0, 1, 1), ShareInputError),
        (lambda: VerificationWork(A, -1), CountError),
        (lambda: SettledQuery(Q1, -1), CountError),
        (lambda: SettledQuery(Q1, 1 << 64), CountError),
        (lambda: SettledQuery("0x" + "01" * 31, 1), QueryIdError),
        (lambda: SettledQuery(bytes(32), 1), QueryIdError),
        (lambda: ShardHealth(M, 0, -1), CountError),
        (lambda: example(verifier_cut_bps=10_001), BasisPointsError),
        (lambda: example(verifier_cut_bps=-1), BasisPointsError),
        (lambda: example(verifier_cut_bps=True), BasisPointsError),
        (lambda: example(epoch=-1), CountError),
        (lambda: example(epoch=1 << 64), CountError),
        (lambda: example(queries=(SettledQuery(Q1, 1), SettledQuery(Q1, 2))), DuplicateError),
        (
            lambda: example(
                compute=(ComputeWork(A, M, 0, 1, 1), ComputeWork("0x" + "A" * 40, M, 0, 2, 2))
            ),
            DuplicateError,
        ),
        (
            lambda: example(verification=(VerificationWork(V1, 1), VerificationWork(V1, 2))),
            DuplicateError,
        ),
        (
            lambda: example(
                health=(ShardHealth(M, 0, 3), ShardHealth(M, 0, 4), ShardHealth(M, 1, 1))
            ),
            DuplicateError,
        ),
        (lambda: example(slashed=(A, A)), DuplicateError),
        (lambda: example(slashed=("nope",)), AccountError),
        (lambda: example(health=(ShardHealth(M, 0, 3),)), PoolHealthError),
        (lambda: example(health=(ShardHealth(M, 0, 1), ShardHealth(M, 1, 1))), PoolHealthError),
        (lambda: example(health=(ShardHealth(M, 0, 3), ShardHealth(M, 1, 0))), PoolHealthError),
        (lambda: example(compute=[ComputeWork(A, M, 0, 1, 1)]), ShareInputError),
        (lambda: example(queries=((Q1, 5),)), ShareInputError),
    ],
)
def test_bad_input_is_refused_with_a_named_protocol_error(
    build: object, error: type[ProtocolError]
) -> None:
    with pytest.raises(error) as caught:
        build()  # type: ignore[operator]
    assert isinstance(caught.value, ShareInputError)
    assert isinstance(caught.value, ProtocolError)


def test_inputs_are_frozen_and_accounts_lowercased() -> None:
    work = ComputeWork("0x" + "AbC" * 13 + "d", M, 0, 1, 1)
    assert work.account == "0x" + "abc" * 13 + "d"
    with pytest.raises(AttributeError):
        work.tokens = 5  # type: ignore[misc]
    assert SettledQuery("0x" + "AB" * 32, 1).query_id == "0x" + "ab" * 32


def test_split_pro_rata_rejects_non_positive_shares() -> None:
    with pytest.raises(CountError):
        split_pro_rata(10, {A: 0})
    with pytest.raises(ShareInputError):
        split_pro_rata(10, {})


def test_direct_rows_pay_in_full_or_split_what_was_drawn() -> None:
    full = {B: 30, A: 10, C: 0}
    assert rows_out_of(40, full) == ((A, 10), (B, 30))  # covered: in full, no zero row
    assert rows_out_of(100, full) == ((A, 10), (B, 30))  # never more than due
    assert rows_out_of(20, full) == ((A, 5), (B, 15))  # short: split by what is due
    short = rows_out_of(7, full)
    assert sum(a for _, a in short) == 7 and [a for a, _ in short] == [A, B]
    assert rows_out_of(0, full) == () and rows_out_of(5, {}) == ()
