"""Property tests of the epoch payout table and its root (hypothesis, derandomized).

Each property is a plain `check_*` function run over generated epochs by `run_property`; the
`test_mutant_*` tests swap in a deliberately broken split (monkeypatch, undone after the test)
and require the property to catch it, so none of these properties can pass vacuously.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import shares.payouts as payouts_module
import shares.settlement as settlement_module
import shares.weights as weights_module
from shares.errors import NothingToPayError
from shares.merkle import PayoutTree, hash_pair, verify
from shares.payouts import (
    BPS_DENOMINATOR,
    ComputeWork,
    EpochWork,
    PayoutTable,
    SettledQuery,
    ShardHealth,
    VerificationWork,
    eligible_shares,
    payout_table,
)
from shares.settlement import close_epoch
from shares.weights import SHARES_PER_LAYER_TOKEN

pytestmark = pytest.mark.unit

MODEL = "smollm2-135m"
SHARDS = 4
# Mixed-case spellings on purpose: accounts are compared in lowercase.
ACCOUNTS = tuple(f"0x{'Ab' if i % 2 else 'cd'}{i:038x}" for i in range(1, 11))
SETTINGS = settings(
    derandomize=True,
    database=None,
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
)

Epoch = tuple[EpochWork, EpochWork]  # (work, the same work with every list shuffled)


@st.composite
def epochs(draw: st.DrawFn) -> Epoch:
    """A small epoch and the same epoch with every input list in another order."""
    fee = st.one_of(st.integers(0, 50), st.integers(0, (1 << 64) - 1))
    queries = draw(
        st.lists(
            st.tuples(st.binary(min_size=32, max_size=32), fee),
            min_size=draw(st.integers(0, 6)),
            max_size=6,
            unique_by=lambda q: q[0],
        )
    )
    compute = draw(
        st.lists(
            st.tuples(
                st.sampled_from(ACCOUNTS),
                st.integers(0, SHARDS - 1),
                st.integers(1, 3),
                st.one_of(st.integers(0, 2), st.integers(0, 10**9)),
            ),
            min_size=draw(st.integers(0, 8)),
            max_size=8,
            unique_by=lambda w: (w[0].lower(), w[1]),
        )
    )
    verification = draw(
        st.lists(
            st.tuples(st.sampled_from(ACCOUNTS), st.one_of(st.integers(1, 2), st.integers(0, 99))),
            min_size=draw(st.integers(0, 5)),
            max_size=5,
            unique_by=lambda v: v[0].lower(),
        )
    )
    extra = draw(st.lists(st.integers(0, 3), min_size=SHARDS, max_size=SHARDS))
    served = [sum(1 for w in compute if w[1] == shard) for shard in range(SHARDS)]
    health = [(s, served[s] + extra[s]) for s in range(SHARDS) if served[s] + extra[s] > 0]
    slashed = draw(st.lists(st.sampled_from(ACCOUNTS), max_size=3, unique=True))
    bps = draw(st.one_of(st.sampled_from([0, 1, 1_000, 9_999, 10_000]), st.integers(0, 10_000)))
    epoch = draw(st.integers(0, (1 << 64) - 1))

    def build(order: Callable[[list], list]) -> EpochWork:
        return EpochWork(
            epoch=epoch,
            queries=tuple(order([SettledQuery("0x" + q.hex(), f) for q, f in queries])),
            compute=tuple(order([ComputeWork(a, MODEL, s, la, t) for a, s, la, t in compute])),
            verification=tuple(order([VerificationWork(a, c) for a, c in verification])),
            health=tuple(order([ShardHealth(MODEL, s, n) for s, n in health])),
            slashed=tuple(order(list(slashed))),
            verifier_cut_bps=bps,
        )

    shuffler = random.Random(draw(st.integers(0, (1 << 32) - 1)))  # seeded by hypothesis
    reverse = draw(st.booleans())  # reversing swaps every pair: ties see another arrival order

    def shuffled(items: list) -> list:
        items = list(items)
        if reverse:
            return items[::-1]
        shuffler.shuffle(items)
        return items

    return build(lambda items: items), build(shuffled)


def table_or_none(work: EpochWork) -> PayoutTable | None:
    """The table, or None when the epoch has nothing to pay, which must be exactly when there
    are no fees or no eligible (unslashed, positive) share."""
    compute, verification = eligible_shares(work)
    try:
        table = payout_table(work)
    except NothingToPayError:
        assert work.fees == 0 or not (compute or verification)
        return None
    assert work.fees > 0 and (compute or verification)
    return table


def run_property(check: Callable[[Epoch], None], *, shrink: bool = True) -> None:
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.reuse, Phase.generate)

    @settings(SETTINGS, phases=phases)
    @given(epochs())
    def run(epoch: Epoch) -> None:
        check(epoch)

    run()


# -- properties ---------------------------------------------------------------------------------


def check_sum_exact(epoch: Epoch) -> None:
    work, _ = epoch
    table = table_or_none(work)
    if table is None:
        return
    assert table.fees == sum(q.fee for q in work.queries)
    assert sum(amount for _, amount in table.payouts) == table.fees
    assert table.compute_pool + table.verifier_pool == table.fees
    assert sum(a for _, a in table.compute_payouts) == table.compute_pool
    assert sum(a for _, a in table.verifier_payouts) == table.verifier_pool


def check_never_negative(epoch: Epoch) -> None:
    table = table_or_none(epoch[0])
    if table is None:
        return
    assert all(amount > 0 for _, amount in table.payouts)
    assert all(a >= 0 for _, a in table.compute_payouts + table.verifier_payouts)


def check_order_invariant(epoch: Epoch) -> None:
    work, shuffled = epoch
    assert table_or_none(work) == table_or_none(shuffled)


def check_bonus_only_under_thresholds(epoch: Epoch) -> None:
    work, _ = epoch
    compute, _ = eligible_shares(work)
    routable = {h.shard: h.routable_nodes for h in work.health}
    slashed = set(work.slashed)
    expected: dict[str, int] = {}
    for w in work.compute:
        if w.account in slashed or w.tokens == 0:
            continue
        count = routable[w.shard]
        bonus = 5 if count == 1 else 2 if count == 2 else 1
        expected[w.account] = expected.get(w.account, 0) + (
            w.layers * w.tokens * SHARES_PER_LAYER_TOKEN * bonus
        )
    assert compute == expected


def check_slashed_get_nothing(epoch: Epoch) -> None:
    work, _ = epoch
    table = table_or_none(work)
    if table is None:
        return
    paid = dict(table.payouts)
    for account in work.slashed:
        assert account not in paid
        assert account not in dict(table.compute_shares)
        assert account not in dict(table.verification_shares)


def _within_one_wei(pool: int, shares: Mapping[str, int], amounts: Mapping[str, int]) -> None:
    total = sum(shares.values())
    assert set(amounts) == set(shares)
    bumped = []
    for account, count in shares.items():
        exact, remainder = divmod(pool * count, total)
        assert amounts[account] in (exact, exact + 1)
        bumped.append((-remainder, account, amounts[account] - exact))
    # Largest remainder, ties by account ascending: the +1s are a prefix of that order.
    bumped.sort()
    flags = [extra for _, _, extra in bumped]
    assert flags == sorted(flags, reverse=True)


def check_verifier_cut(epoch: Epoch) -> None:
    work, _ = epoch
    table = table_or_none(work)
    if table is None:
        return
    compute, verification = eligible_shares(work)
    if compute and verification:
        assert table.verifier_pool == table.fees * work.verifier_cut_bps // BPS_DENOMINATOR
    elif compute:
        assert (table.compute_pool, table.verifier_pool) == (table.fees, 0)
    else:
        assert (table.compute_pool, table.verifier_pool) == (0, table.fees)
    if compute:
        _within_one_wei(table.compute_pool, compute, dict(table.compute_payouts))
    if verification:
        _within_one_wei(table.verifier_pool, verification, dict(table.verifier_payouts))


def check_root_deterministic(epoch: Epoch) -> None:
    work, shuffled = epoch
    try:
        settlement = close_epoch(work)
    except NothingToPayError:
        return
    again = close_epoch(shuffled)
    assert (again.root, again.total, again.queries_hash) == (
        settlement.root,
        settlement.total,
        settlement.queries_hash,
    )
    assert settlement.total == work.fees
    tree = PayoutTree.for_epoch(work.epoch, dict(settlement.table.payouts))
    assert tree.root == settlement.root
    for account, amount in settlement.table.payouts:
        claimed, proof = settlement.proof(account)
        payout, _ = tree.proof_for(work.epoch, account)
        assert claimed == amount and verify(settlement.root, payout, proof)


PROPERTIES = {
    "sum_exact": check_sum_exact,
    "never_negative": check_never_negative,
    "order_invariant": check_order_invariant,
    "bonus_only_under_thresholds": check_bonus_only_under_thresholds,
    "slashed_get_nothing": check_slashed_get_nothing,
    "verifier_cut": check_verifier_cut,
    "root_deterministic": check_root_deterministic,
}


def test_payouts_sum_exactly_to_the_distributable_fees() -> None:
    run_property(check_sum_exact)


def test_payouts_are_never_negative_and_rows_never_zero() -> None:
    run_property(check_never_negative)


def test_payout_table_is_invariant_to_input_order() -> None:
    run_property(check_order_invariant)


def test_scarcity_bonus_only_under_the_thresholds() -> None:
    run_property(check_bonus_only_under_thresholds)


def test_slashed_accounts_get_nothing() -> None:
    run_property(check_slashed_get_nothing)


def test_verifier_cut_and_remainder_rule_are_respected() -> None:
    run_property(check_verifier_cut)


def test_root_is_deterministic_and_matches_the_payout_tree() -> None:
    run_property(check_root_deterministic)


# -- mutants: each property must catch a broken split -------------------------------------------


def _split_floor_only(pool: int, shares: Mapping[str, int]) -> dict[str, int]:
    total = sum(shares.values())
    return {a: pool * s // total for a, s in shares.items()}  # the remainder wei are lost


def _split_shifting_one_wei(pool: int, shares: Mapping[str, int]) -> dict[str, int]:
    amounts = _REAL_SPLIT(pool, shares)
    if len(amounts) > 1:  # same sum, but the smallest account may go to -1
        amounts[min(amounts)] -= 1
        amounts[max(amounts)] += 1
    return amounts


def _split_ties_by_arrival(pool: int, shares: Mapping[str, int]) -> dict[str, int]:
    total = sum(shares.values())
    amounts = {a: pool * s // total for a, s in shares.items()}
    ranked = sorted(shares, key=lambda a: pool * shares[a] % total, reverse=True)  # input order
    for account in ranked[: pool - sum(amounts.values())]:
        amounts[account] += 1
    return amounts


def _eligible_ignoring_slashes(work: EpochWork) -> tuple[dict[str, int], dict[str, int]]:
    return _REAL_ELIGIBLE(replace(work, slashed=()))


def _bonus_up_to_three_nodes(routable_nodes: int) -> int:
    return 5 if routable_nodes == 1 else 2 if routable_nodes <= 3 else 1


def _build_tree_unsorted(leaves: list[bytes]) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    size = 2 * len(leaves) - 1  # the leaves in the given order, not sorted
    tree = [b""] * (size - len(leaves)) + list(reversed(leaves))
    for k in range(size - 1 - len(leaves), -1, -1):
        tree[k] = hash_pair(tree[2 * k + 1], tree[2 * k + 2])
    return tuple(tree), tuple(size - 1 - i for i in range(len(leaves)))


_REAL_SPLIT = payouts_module.split_pro_rata
_REAL_ELIGIBLE = payouts_module.eligible_shares

MUTANTS = [
    ("sum_exact", payouts_module, "split_pro_rata", _split_floor_only),
    ("never_negative", payouts_module, "split_pro_rata", _split_shifting_one_wei),
    ("order_invariant", payouts_module, "split_pro_rata", _split_ties_by_arrival),
    (
        "bonus_only_under_thresholds",
        weights_module,
        "scarcity_multiplier",
        _bonus_up_to_three_nodes,
    ),
    ("slashed_get_nothing", payouts_module, "eligible_shares", _eligible_ignoring_slashes),
    ("verifier_cut", payouts_module, "BPS_DENOMINATOR", 10_001),
    ("root_deterministic", settlement_module, "build_tree", _build_tree_unsorted),
]


@pytest.mark.parametrize(("name", "module", "attribute", "mutant"), MUTANTS)
def test_mutant_split_is_caught_by_its_property(
    name: str, module: object, attribute: str, mutant: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, attribute, mutant)
    with pytest.raises(AssertionError):
        run_property(PROPERTIES[name], shrink=False)
