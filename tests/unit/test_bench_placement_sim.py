"""The pool model bench/placement.py measures the placement rules in (bench/_placement_sim.py):
the exhaustive best, the committee's speeds (the verifiers' per-node estimate and the old
circuit rule), and the rules run to their fixed point."""

from __future__ import annotations

import itertools

import pytest

from bench._placement_sim import (
    Machine,
    Timing,
    best_tok_s,
    committee_speeds,
    machine_key,
    place,
    pool_tok_s,
)
from node.agent.rebalance import RebalancePolicy

STAGE = 0.01
TIMING = Timing(shard_s=(STAGE, STAGE, STAGE), head_s=0.0, hop_s=0.0)


def machines(*slowdowns: float) -> list[Machine]:
    return [Machine(machine_key(i), slow) for i, slow in enumerate(slowdowns)]


def test_the_exhaustive_best_puts_the_two_slow_machines_together() -> None:
    fleet = machines(1, 1, 2, 4)
    best, where = best_tok_s(TIMING, fleet)
    assert best == pytest.approx(0.75 / STAGE)  # [4x] [4x] [2x + 1x]
    assert where[fleet[2].key] == where[fleet[3].key]
    assert pool_tok_s(TIMING, fleet, where) == pytest.approx(best)


def test_the_best_that_keeps_a_floor_gives_every_shard_that_many_nodes() -> None:
    fleet = machines(1, 1, 4, 4, 4, 4)
    free, _ = best_tok_s(TIMING, fleet)
    floored, where = best_tok_s(TIMING, fleet, need=2)
    assert free == pytest.approx(1 / STAGE)  # [4x] [4x] [1x × 4]
    assert sorted(list(where.values()).count(s) for s in range(3)) == [2, 2, 2]
    assert floored == pytest.approx(0.5 / STAGE)  # [4x + 1x] [4x + 1x] [1x + 1x]


def test_the_old_rule_credits_the_lone_slow_node_s_pace_to_every_node() -> None:
    fleet = machines(1, 4, 1)
    assign = {m.key: shard for shard, m in enumerate(fleet)}
    speeds = committee_speeds(TIMING, fleet, assign, rule="circuits")
    assert set(speeds.values()) == {int(1 / (6 * STAGE))}  # 1 + 4 + 1 stages in every circuit
    # one node a shard: one circuit, which cannot say which stage is slow (split evenly)
    fit = committee_speeds(TIMING, fleet, assign, rule="fit")
    assert set(fit.values()) == {int(3 / (6 * STAGE))}
    # the diagnostic that is told the split between shards reads each node's own stage, and
    # so do the verifiers that probed each node alone (the product's rule)
    known = committee_speeds(TIMING, fleet, assign, rule="split")
    assert [known[m.key] for m in fleet] == [100, 25, 100]
    probed = committee_speeds(TIMING, fleet, assign)
    assert [probed[m.key] for m in fleet] == [100, 25, 100]
    del assign[fleet[1].key]
    assert committee_speeds(TIMING, fleet, assign) == {}  # no circuit: nobody measured


def test_the_per_node_estimate_tells_two_nodes_of_one_shard_apart() -> None:
    fleet = machines(1, 4, 1, 1)  # the 1 and the 4 on shard 0
    assign = {fleet[0].key: 0, fleet[1].key: 0, fleet[2].key: 1, fleet[3].key: 2}
    old = committee_speeds(TIMING, fleet, assign, rule="circuits")
    assert [old[m.key] for m in fleet] == [33, 16, 33, 33]  # circuits of 3 and 6 stages
    for rule in ("fit", "probed_one_circuit", "nodes"):
        new = committee_speeds(TIMING, fleet, assign, rule=rule)
        assert [new[m.key] for m in fleet] == [100, 25, 100, 100], rule  # each node's own


def test_probes_read_a_lone_slow_shard_that_circuits_alone_split_evenly() -> None:
    # shard 1 holds only a 2x; the circuit-only fit reads it as fast as the 4x nodes
    fleet = machines(1, 4, 2, 1)
    assign = {fleet[0].key: 0, fleet[1].key: 0, fleet[2].key: 1, fleet[3].key: 2}
    fit = committee_speeds(TIMING, fleet, assign, rule="fit")
    assert fit[fleet[2].key] == fit[fleet[3].key]
    for rule in ("probed_one_circuit", "nodes"):
        probed = committee_speeds(TIMING, fleet, assign, rule=rule)
        assert [probed[m.key] for m in fleet] == [100, 25, 50, 100], rule


def test_rebalancing_on_the_per_node_estimate_reaches_the_best_where_the_old_rule_stops() -> None:
    fleet = machines(1, 1, 1, 1, 2, 2, 1)
    best, _ = best_tok_s(TIMING, fleet)
    strict = RebalancePolicy(gain_percent=25)  # at the default 10 % the old rule's +33 % moves too
    old = place(TIMING, fleet, rule="circuits", policy=strict)
    new = place(TIMING, fleet, policy=strict)
    assert old.final_tok_s == pytest.approx(0.75 * best) and old.moves == 0
    assert new.final_tok_s == pytest.approx(best) and new.moves >= 1


def test_equal_machines_spread_evenly_and_reach_the_best() -> None:
    fleet = machines(1, 1, 1, 1, 1, 1)
    outcome = place(TIMING, fleet)
    assert sorted(list(outcome.final.values()).count(s) for s in range(3)) == [2, 2, 2]
    assert outcome.final_tok_s == pytest.approx(best_tok_s(TIMING, fleet)[0])
    assert outcome.converged and outcome.moves == 0


def test_rebalancing_on_own_speeds_moves_the_slow_node_to_the_weakest_shard() -> None:
    # 4x, 2x, 1x take a shard each, the last 4x joins the weakest (the 1x's): [4x] [2x] [1x + 4x];
    # one move of the 1x to the 2x's shard raises the weakest by half: the fixed point is the best
    fleet = machines(1, 2, 4, 1)
    outcome = place(TIMING, fleet, rule="own")
    best, _ = best_tok_s(TIMING, fleet)
    assert outcome.joined_tok_s < 0.9 * best
    assert outcome.moves == 1 and outcome.converged
    assert outcome.final_tok_s == pytest.approx(best)


def test_a_swap_lifts_a_pool_one_node_moves_leave_at_two_thirds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # joins end at [2x 2x] [4x 4x] [4x 4x]: every shard at the floor of 2, no one-node move
    # lifts the weakest; a 4x leads a swap, a 2x's own rule follows: [2x 4x] [4x 2x] [4x 4x]
    import bench._placement_sim as sim

    moves: list[tuple[str, float]] = []
    real = sim.decide

    def recorded(key: str, *args: object, **kw: object) -> object:
        decision = real(key, *args, **kw)  # type: ignore[arg-type]
        if decision.move:
            moves.append((key, kw["now_s"]))  # type: ignore[arg-type]
        return decision

    monkeypatch.setattr(sim, "decide", recorded)
    fleet = machines(2, 1, 1, 2, 1, 1)
    best, _ = best_tok_s(TIMING, fleet)
    outcome = place(TIMING, fleet)
    assert outcome.joined_tok_s == pytest.approx(2 / 3 * best)
    assert outcome.final_tok_s == pytest.approx(best) and outcome.moves == 2
    assert outcome.converged
    # the churn bound as the agent keeps it: no node moves twice within its cooldown
    cooldown = RebalancePolicy().cooldown_s
    for key in {k for k, _ in moves}:
        times = sorted(t for k, t in moves if k == key)
        assert all(b - a >= cooldown for a, b in itertools.pairwise(times))
