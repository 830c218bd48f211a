"""Per-node decode speeds from whole circuits' times (node/verifier/speeds.py, issue 44): each
clean timed answer says that its circuit's seconds per token are the sum of its nodes' own; the
verifier solves every node's own time from all the circuits it timed, so a fast node seen beside
a slow one is not credited the slow one's pace, and no input gives anything but an integer
tokens/s within the chain's bounds."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from node.verifier.speeds import (
    MAX_SKEW,
    MIN_TIMED_TOKENS,
    WINDOW_EPOCHS,
    EpochSpeeds,
    Timed,
    circuit_speeds,
    node_speeds,
    stage_times,
)
from protocol.speeds import MAX_SPEED, MIN_SPEED, is_speed

pytestmark = pytest.mark.unit

TOKENS = 32


def timed(truth: dict[str, float], circuit: tuple[str, ...], noise: float = 1.0) -> Timed:
    """`circuit` decoding TOKENS tokens at the sum of its nodes' true seconds per token."""
    return Timed(circuit, TOKENS, TOKENS * sum(truth[n] for n in circuit) * noise)


def every_circuit(shards: list[list[str]]) -> list[tuple[str, ...]]:
    return list(itertools.product(*shards))


# three shards; each shard's fastest node takes 10 ms a token (the shards cost alike), the
# others 15 to 40 ms: what the estimator assumes and what a pool of like machines looks like
TRUTH = {"a0": 0.010, "b0": 0.030, "c0": 0.020, "a1": 0.010, "b1": 0.040, "a2": 0.010, "b2": 0.015}
SHARDS = [["a0", "b0", "c0"], ["a1", "b1"], ["a2", "b2"]]


def test_stage_times_recover_every_nodes_own_time_from_noise_free_circuits() -> None:
    observations = [timed(TRUTH, c) for c in every_circuit(SHARDS)]
    times = stage_times(observations)
    assert times == pytest.approx(TRUTH, rel=1e-9)
    assert node_speeds(observations) == {n: math.floor(1 / t + 1e-9) for n, t in TRUTH.items()}


def test_stage_times_fit_every_circuit_and_every_in_shard_difference_whatever_the_split() -> None:
    # shard 1's fastest node is 3× shard 0's: the circuits cannot tell (the gauge), but every
    # circuit's sum and every difference within a shard are still exact
    truth = {**TRUTH, "a1": 0.030, "b1": 0.060}
    observations = [timed(truth, c) for c in every_circuit(SHARDS)]
    times = stage_times(observations)
    for circuit in every_circuit(SHARDS):
        assert sum(times[n] for n in circuit) == pytest.approx(sum(truth[n] for n in circuit))
    for shard in SHARDS:
        for x, y in itertools.combinations(shard, 2):
            assert times[x] - times[y] == pytest.approx(truth[x] - truth[y])
    fastest = [min(times[n] for n in shard) for shard in SHARDS]
    assert fastest == pytest.approx([sum(fastest) / 3] * 3)  # split evenly between shards


def test_stage_times_stay_close_with_noisy_repeated_answers() -> None:
    rng = random.Random(44)
    observations = [
        timed(TRUTH, c, noise=1 + rng.uniform(-0.03, 0.03))
        for c in every_circuit(SHARDS)
        for _ in range(3)
    ]
    rng.shuffle(observations)
    times = stage_times(observations)
    for node, true in TRUTH.items():
        assert times[node] == pytest.approx(true, rel=0.15), node
    speeds = node_speeds(observations)
    ranked = sorted(TRUTH, key=TRUTH.__getitem__)
    assert sorted(speeds, key=lambda n: -speeds[n])[-2:] == ranked[-2:]  # the two slowest


def test_a_fast_node_beside_a_slow_one_is_not_reported_slow_when_seen_elsewhere() -> None:
    # F (fast) was timed only beside S (slow); P beside S and beside Q. The old rule credited
    # F its only circuit, 6 ms + 30 ms a token, and P its best one (P, Q): P read faster than F
    truth = {"F": 0.006, "P": 0.018, "S": 0.030, "Q": 0.006}
    speeds = EpochSpeeds()
    for circuit in (("F", "S"), ("P", "S"), ("P", "Q")):
        assert speeds.note(circuit, TOKENS, TOKENS * sum(truth[n] for n in circuit), True)
    reported = speeds.of(dict.fromkeys(truth, 1_000_000))
    assert reported == {"F": 166, "P": 55, "Q": 166, "S": 33}  # each node's own 1 / t
    assert reported["F"] > reported["P"] > reported["S"]


def test_a_node_seen_at_two_shard_positions_ties_their_split() -> None:
    # shard 1's nodes are slower than shard 0's: a moved node (a, seen at both) measures it
    truth = {"a": 0.010, "b": 0.020, "c": 0.020, "d": 0.030}
    circuits = [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("b", "a")]
    times = stage_times(timed(truth, c) for c in circuits)
    assert times == pytest.approx(truth, rel=1e-9)


def test_a_node_seen_in_one_circuit_gets_an_even_share_within_the_circuits_bound() -> None:
    alone = [Timed(("x", "y", "z"), TOKENS, TOKENS * 0.030)]  # 30 ms a token, three stages
    assert node_speeds(alone) == {"x": 100, "y": 100, "z": 100}
    assert circuit_speeds(alone) == {"x": 33, "y": 33, "z": 33}  # the old rule: the circuit's


@pytest.mark.parametrize(
    "tokens, seconds",
    [
        (TOKENS, 0.0),  # an instant answer
        (TOKENS, -3.0),  # a clock gone backwards
        (10**30, 1.0),  # a huge count
        (10**400, 1e-300),  # past any float
        (MIN_TIMED_TOKENS, 1e300),  # a near-endless answer
        (MIN_TIMED_TOKENS, 1e-320),  # a denormal time
    ],
)
def test_degenerate_answers_give_integers_within_the_chains_bounds(
    tokens: int, seconds: float
) -> None:
    one = [Timed(("x", "y", "z"), tokens, seconds)]
    both = [*one, Timed(("x", "w", "z"), TOKENS, TOKENS * 0.03)]
    for observations in (one, both):
        speeds = node_speeds(observations)
        assert speeds and all(is_speed(v) for v in speeds.values()), speeds


def test_epoch_speeds_bound_a_huge_count_through_the_report() -> None:
    speeds = EpochSpeeds()
    assert speeds.note(("x", "y"), 10**400, 1.0, clean=True) == MAX_SPEED
    assert speeds.note(("x", "z"), 10**400, 0.0, clean=True) == MAX_SPEED
    assert speeds.of({"x": 1, "y": 1}) == {"x": MAX_SPEED, "y": MAX_SPEED}


def test_a_time_that_is_not_a_number_is_not_kept() -> None:
    speeds = EpochSpeeds()
    assert speeds.note(("x", "y"), TOKENS, math.nan, clean=True) is None
    assert speeds.note(("x", "y"), TOKENS, math.inf, clean=True) is None
    assert speeds.timed == [] and speeds.of({"x": 1}) == {}
    assert node_speeds([Timed(("x",), TOKENS, math.nan)]) == {}


def test_random_circuits_never_read_a_node_below_its_best_circuit_nor_out_of_bounds() -> None:
    rng = random.Random(7)
    for _ in range(200):
        shards = [[f"n{s}{i}" for i in range(rng.randint(1, 3))] for s in range(rng.randint(1, 4))]
        pool = every_circuit(shards)
        observations = [
            Timed(rng.choice(pool), rng.choice([MIN_TIMED_TOKENS, 32, 10**9]), seconds)
            for seconds in (rng.choice([0.0, 1e-7, rng.uniform(0.01, 5), 1e9]) for _ in range(6))
        ]
        speeds, floor = node_speeds(observations), circuit_speeds(observations)
        assert set(speeds) == set(floor)
        assert all(is_speed(v) for v in speeds.values())
        assert all(speeds[n] >= floor[n] for n in speeds), (speeds, floor)
        fastest = max(floor.values())  # no node above 8 × an even share of the fastest circuit
        bound = min(MAX_SPEED, MAX_SKEW * len(shards) * (fastest + 1))
        assert all(v <= bound for v in speeds.values()), (speeds, bound)
        assert all(v >= MIN_SPEED for v in speeds.values())


def test_epoch_speeds_carry_the_answers_of_the_last_epochs_only() -> None:
    speeds = EpochSpeeds(epoch=1)
    speeds.note(("x", "y"), TOKENS, 1.0, clean=True)
    for epoch in range(2, 2 + WINDOW_EPOCHS):
        speeds = speeds.carry(epoch)
        speeds.note(("x", f"y{epoch}"), TOKENS, 1.0, clean=True)
    kept = {t.nodes for _, t in speeds.timed}
    assert ("x", "y") not in kept and len(kept) == WINDOW_EPOCHS
    latest = f"y{1 + WINDOW_EPOCHS}"
    assert set(speeds.of(dict.fromkeys(["x", "y", "y2", latest], 1))) == {"x", "y2", latest}


def test_an_answer_a_failover_moved_is_not_timed() -> None:
    """The receipt of a failed-over answer names the node it left (which may have served none
    of the timed positions: a CI run timed a convicted substitute this way) and its time holds
    the move's: it is no circuit's speed."""
    speeds = EpochSpeeds(epoch=3)
    assert speeds.note(("x", "y", "z"), TOKENS, TOKENS * 0.1, True, moved=True) is None
    assert speeds.note(("x", "z"), TOKENS, TOKENS * 0.1, True) is not None
    assert [t.nodes for _, t in speeds.timed] == [("x", "z")]
