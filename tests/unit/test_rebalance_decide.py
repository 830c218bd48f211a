"""The rebalancing rule (node/agent/rebalance.py `decide`): a pure function over the committee's
view of a pool — floor, gain threshold, churn bound, and tie-breaking deterministic per node
key."""

from __future__ import annotations

import hashlib

import pytest

from node.agent.placement import PoolNode
from node.agent.rebalance import RebalancePolicy, decide, jitter_s, pool_fingerprint

pytestmark = pytest.mark.unit

POLICY = RebalancePolicy(cooldown_s=600.0, gain_percent=25)


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def pool(*shards: int, down: tuple[int, ...] = (), joining: tuple[int, ...] = ()) -> list[PoolNode]:
    """One routable node per entry of `shards` (named n0, n1, … in order), a DOWN node on each
    shard of `down` and a joining one on each of `joining`."""
    nodes = [PoolNode(key(f"n{i}"), (s,), "SERVING", True) for i, s in enumerate(shards)]
    nodes += [PoolNode(key(f"down{i}"), (s,), "DOWN", False) for i, s in enumerate(down)]
    nodes += [PoolNode(key(f"join{i}"), (s,), "JOIN", False) for i, s in enumerate(joining)]
    return nodes


def run(
    me: str, nodes: list[PoolNode], shards: int = 3, floor: int = 2, **kw: object
) -> tuple[bool, int, str]:
    d = decide(
        key(me),
        nodes,
        shards,
        floor,
        now_s=kw.pop("now_s", 10_000.0),  # type: ignore[arg-type]
        last_move_s=kw.pop("last_move_s", None),  # type: ignore[arg-type]
        policy=kw.pop("policy", POLICY),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    return d.move, d.target, d.line()


def test_an_empty_shard_is_filled_from_a_shard_with_two() -> None:
    # n0, n1 on shard 0; n2 on shard 1; shard 2's node went DOWN: nobody serves it
    nodes = pool(0, 0, 1, down=(2,))
    move, target, line = run("n0", nodes)
    assert (move, target) == (True, 2)
    assert "moving shard 0 -> 2" in line and "no routable node and none joining" in line
    # the node alone on shard 1 never empties its own shard to fill another
    assert run("n2", nodes)[:2] == (False, 1)
    assert "only routable node" in run("n2", nodes)[2]


def test_below_the_floor_only_from_a_shard_that_keeps_the_floor() -> None:
    # shard 0 has 3, shard 1 has 1 (below floor 2), shard 2 has 2
    nodes = pool(0, 0, 0, 1, 2, 2)
    move, target, line = run("n0", nodes)
    assert (move, target) == (True, 1) and "below the replica floor of 2" in line
    # from shard 2 (2 → 1) it would only swap which shard is short: no gain
    assert run("n4", nodes)[:2] == (False, 2)
    # with floor 3, shard 0 (3 → 2) would fall below it: not a floor move; it still raises
    # the weakest shard (1 → 2, +100%), so only a threshold above that keeps it
    assert "is the weakest" in run("n0", nodes, floor=3)[2]
    assert run("n0", nodes, floor=3, policy=RebalancePolicy(gain_percent=150))[0] is False


def test_a_swap_of_the_short_shard_is_no_gain() -> None:
    # the default devnet after an extra node joined and another died: 2, 1, 1 with floor 2
    nodes = pool(0, 0, 1, 2)
    move, _, line = run("n0", nodes)
    assert move is False and "no shard gains enough" in line


def test_weakest_needs_the_gain_threshold_and_raises_the_minimum() -> None:
    # floor 1: 4, 2, 3 → moving from shard 0 raises the weakest (2 → 3): +50% ≥ 25%
    nodes = pool(0, 0, 0, 0, 1, 1, 2, 2, 2)
    move, target, line = run("n0", nodes, floor=1)
    assert (move, target) == (True, 1) and "is the weakest" in line
    # a threshold of 60% is not met by +50%
    strict = RebalancePolicy(gain_percent=60)
    assert run("n0", nodes, floor=1, policy=strict)[0] is False
    # 3, 2, 3: moving from shard 0 leaves 2, 3, 3: the minimum stays 2: no gain
    assert run("n0", pool(0, 0, 0, 1, 1, 2, 2, 2), floor=1)[0] is False


def test_a_joining_node_fills_the_shard_first() -> None:
    nodes = pool(0, 0, 1, down=(2,), joining=(2,))  # someone is on the way to shard 2
    move, _, line = run("n0", nodes)
    assert move is False and "no shard gains enough" in line


def test_a_serving_node_that_is_not_routable_does_not_hold_its_shard() -> None:
    # shard 2's node is SERVING on chain but not routable (e.g. dropped for uncommitted work):
    # nobody answers through shard 2 now
    nodes = [*pool(0, 0, 1), PoolNode(key("dropped"), (2,), "SERVING", False)]
    move, target, line = run("n0", nodes)
    assert (move, target) == (True, 2) and "no routable node and none joining" in line


def test_the_churn_bound_keeps_a_node_that_moved_lately() -> None:
    nodes = pool(0, 0, 1, down=(2,))
    move, _, line = run("n0", nodes, now_s=1_000.0, last_move_s=700.0)
    assert move is False
    assert "moved 300 s ago: at most one move per 600 s (next in 300 s)" in line
    assert run("n0", nodes, now_s=1_000.0, last_move_s=400.0)[:2] == (True, 2)


def test_equal_targets_are_broken_per_node_key_deterministically() -> None:
    # 5 shards: shards 0 has 6 nodes, shards 1-4 are empty; every node of shard 0 may fill one
    nodes = pool(0, 0, 0, 0, 0, 0)
    picks = {run(f"n{i}", nodes, shards=5)[1] for i in range(6)}
    assert len(picks) > 1  # not every node picks the lowest index: no stampede to one shard
    for i in range(6):  # the same node, the same pool: the same pick
        assert run(f"n{i}", nodes, shards=5) == run(f"n{i}", nodes, shards=5)


def test_not_listed_not_routable_span_and_unavailable_shards_stay() -> None:
    nodes = pool(0, 0, 1, down=(2,))
    assert "does not list" in run("stranger", nodes)[2]
    down = [PoolNode(key("me"), (0,), "DOWN", False), *nodes]
    assert "not routable (DOWN)" in run("me", down)[2]
    span = [PoolNode(key("me"), (0, 1), "SERVING", True), *nodes]
    assert "span of shards [0, 1]" in run("me", span)[2]
    assert run("n0", nodes, available=lambda shard: shard != 2)[0] is False


def test_measured_speeds_weigh_the_shards() -> None:
    nodes = pool(0, 0, 1, 2)  # n0, n1 on 0; n2 on 1; n3 on 2
    speeds = {key("n0"): 10, key("n1"): 100, key("n2"): 40, key("n3"): 100}
    # shard 0: 110, shard 1: 40 (weakest), shard 2: 100; floor 1: n0 (10) 110→100, 40→50: +25%
    move, target, line = run("n0", nodes, floor=1, speeds=speeds)
    assert (move, target) == (True, 1) and "tokens/s" in line
    # n1 (100) moving would leave shard 0 with 10: the weakest falls
    assert run("n1", nodes, floor=1, speeds=speeds)[0] is False


def test_jitter_is_bounded_and_seeded_from_the_key() -> None:
    delays = [jitter_s(key(f"n{i}"), 10.0) for i in range(20)]
    assert all(0 <= d < 10.0 for d in delays) and len(set(delays)) > 10
    assert jitter_s(key("n1"), 10.0) == jitter_s(key("n1"), 10.0)
    assert jitter_s(key("n1"), 0.0) == 0.0


def test_the_fingerprint_sees_a_node_going_down_only() -> None:
    before = pool(0, 1, 2)
    after = [*before[:2], PoolNode(before[2].key, (2,), "DOWN", False)]
    assert pool_fingerprint(before) != pool_fingerprint(after)
    assert pool_fingerprint(before) == pool_fingerprint(list(reversed(before)))


# -- a target whose file is not on disk (fetched by the move, issue 44) -------------------------


def test_a_missing_file_served_by_another_node_is_a_move_that_fetches() -> None:
    # shard 1 is below the floor of 2; its file is not on n0's disk but n3 serves it
    nodes = pool(0, 0, 0, 1, 2, 2)
    d = decide(key("n0"), nodes, 3, 2, now_s=0.0, last_move_s=None, policy=POLICY,
               available=lambda shard: shard != 1)  # fmt: skip
    assert (d.move, d.target, d.fetch) == (True, 1, True)
    assert "(its file fetched first)" in d.line()


def test_a_serving_node_that_is_not_routable_is_a_source_for_an_empty_shard() -> None:
    # shard 2 has no routable node (rule 1) but a SERVING node whose stake is not agreed yet
    nodes = [*pool(0, 0, 1), PoolNode(key("staking"), (2,), "SERVING", False)]
    d = decide(key("n0"), nodes, 3, 1, now_s=0.0, last_move_s=None, policy=POLICY,
               available=lambda shard: shard != 2)  # fmt: skip
    assert (d.move, d.target, d.fetch) == (True, 2, True)


def test_an_empty_shard_with_no_source_is_not_moved_to_unless_an_origin_is_known() -> None:
    nodes = pool(0, 0, 1, down=(2,))  # shard 2's only node is DOWN: it serves no chunks
    on_disk = {"available": lambda shard: shard != 2}
    moved, _, line = run("n0", nodes, floor=1, **on_disk)
    assert moved is False
    assert "shard 2 would gain" in line and "no node serves it and no origin is known" in line
    d = decide(key("n0"), nodes, 3, 1, now_s=0.0, last_move_s=None, policy=POLICY,
               origin=True, **on_disk)  # fmt: skip
    assert (d.move, d.target, d.fetch) == (True, 2, True)


def test_on_disk_wins_only_at_equal_gain() -> None:
    # shards 1-4 empty (origin known): every node of shard 0 picks shard 3, the one on disk,
    # though the per-key hash spreads them when all are on disk (test above)
    nodes = pool(0, 0, 0, 0, 0, 0)
    for i in range(6):
        d = decide(key(f"n{i}"), nodes, 5, 1, now_s=0.0, last_move_s=None, policy=POLICY,
                   available=lambda shard: shard in (0, 3), origin=True)  # fmt: skip
        assert (d.target, d.fetch) == (3, False)
    # an empty shard (rule 1) to fetch beats a below-floor shard already on disk
    nodes = pool(0, 0, 0, 1)  # floor 2: shard 1 below it, shard 2 empty
    d = decide(key("n0"), nodes, 3, 2, now_s=0.0, last_move_s=None, policy=POLICY,
               available=lambda shard: shard != 2, origin=True)  # fmt: skip
    assert (d.move, d.target, d.fetch) == (True, 2, True)


def test_the_committees_listed_speeds_weigh_the_shards_without_being_passed() -> None:
    """The rebalancer reads the speeds from the pool it read (`/nodes` `speed`), as placement."""
    speeds = {"n0": 10, "n1": 100, "n2": 40, "n3": 100}
    nodes = [
        PoolNode(key(name), (shard,), "SERVING", True, speed=speeds[name])
        for name, shard in (("n0", 0), ("n1", 0), ("n2", 1), ("n3", 2))
    ]
    move, target, line = run("n0", nodes, floor=1)
    assert (move, target) == (True, 1) and "tokens/s" in line
    assert run("n1", nodes, floor=1)[0] is False
