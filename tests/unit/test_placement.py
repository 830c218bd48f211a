"""Auto placement (`planet join --model M` without `--shard`): the weakest shard of the pool, by
routable replicas × speed, ties by joining nodes then index; the committee's answer parsed at
one boundary or refused by name."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from node.agent.placement import (
    MalformedPoolAnswer,
    ModelNotRegistered,
    PoolNode,
    choose_shard,
    parse_floor,
    parse_nodes,
    read_pool,
)

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32


def key(n: int) -> str:
    return f"{n:064x}"


def node(n: int, *shards: int, status: str = "SERVING", routable: bool = True) -> PoolNode:
    return PoolNode(key=key(n), shards=shards, status=status, routable=routable)


def entry(n: int, *shards: int, **overrides: Any) -> dict[str, Any]:
    """A /nodes entry as the committee app writes it (node_view)."""
    base = {
        "key": key(n),
        "evm_address": "0x" + "11" * 20,
        "role": "compute",
        "model": MODEL,
        "shards": list(shards),
        "endpoint": f"http://10.0.0.{n}:8000",
        "capacity": 16,
        "status": "SERVING",
        "status_height": 3,
        "last_heartbeat": 9,
        "reputation": 500000,
        "untrusted": False,
        "uncommitted": False,
        "stake": str(10**18),
        "stake_attestations": 1,
        "routable": True,
    }
    return {**base, **overrides}


def test_empty_pool_takes_shard_0() -> None:
    placement = choose_shard(MODEL, 3, [])
    assert placement.shard == 0
    assert placement.reason == (
        "shard 0 of 3: no shard has a routable node yet; ties go to the lowest shard index"
    )


def test_holes_are_filled_first_even_next_to_a_crowded_shard() -> None:
    pool = [node(1, 0), node(2, 0), node(3, 0), node(4, 2)]
    assert choose_shard(MODEL, 3, pool).shard == 1
    pool = [node(1, 0), node(2, 1)]
    placement = choose_shard(MODEL, 3, pool)
    assert placement.shard == 2
    assert placement.reason == "shard 2 of 3: it has 0 routable nodes (shards 0 and 1 have 1 each)"


def test_three_joiners_in_turn_cover_every_shard_then_double_up() -> None:
    pool: list[PoolNode] = []
    chosen = []
    for n in range(5):
        shard = choose_shard(MODEL, 3, pool).shard
        chosen.append(shard)
        pool.append(node(n, shard))
    assert chosen == [0, 1, 2, 0, 1]


def test_only_routable_nodes_count_as_replicas() -> None:
    pool = [
        node(1, 0, status="DOWN", routable=False),
        node(2, 0, status="LEFT", routable=False),
        node(3, 1),
    ]
    assert choose_shard(MODEL, 2, pool).shard == 0


def test_weakest_shard_by_replicas_times_measured_speed() -> None:
    # shard 0: one fast node (90); shard 1: two slow ones (2 × 30 = 60); shard 2: one (50)
    pool = [node(1, 0), node(2, 1), node(3, 1), node(4, 2)]
    speeds = {key(1): 90, key(2): 30, key(3): 30, key(4): 50}
    placement = choose_shard(MODEL, 3, pool, speeds=speeds)
    assert placement.shard == 2 and placement.measured
    assert placement.reason == (
        "shard 2 of 3: it has 50 tokens/s over 1 routable node (shard 0 has 90 tokens/s over 1, "
        "shard 1 has 60 tokens/s over 2)"
    )
    # by count alone shard 0 or 2 (one replica each) would win: the speeds decide
    assert choose_shard(MODEL, 3, pool).shard == 0
    slow_shard_0 = {**speeds, key(1): 20}
    assert choose_shard(MODEL, 3, pool, speeds=slow_shard_0).shard == 0


def test_unmeasured_speed_of_any_routable_node_falls_back_to_counting_replicas() -> None:
    pool = [node(1, 0), node(2, 1), node(3, 1)]
    placement = choose_shard(MODEL, 2, pool, speeds={key(1): 100, key(2): 1})  # 3 unmeasured
    assert not placement.measured
    assert placement.shard == 0  # 1 replica against 2


def test_a_span_node_counts_on_each_of_its_shards() -> None:
    pool = [node(1, 0, 1), node(2, 2)]
    assert [s.replicas for s in choose_shard(MODEL, 3, pool).supply] == [1, 1, 1]


def test_tie_break_is_deterministic_by_joining_nodes_then_index() -> None:
    pool = [node(1, 0), node(2, 1), node(3, 2)]
    for order in (pool, pool[::-1], [pool[1], pool[2], pool[0]]):
        placement = choose_shard(MODEL, 3, order)
        assert placement.shard == 0
        assert "ties go to the lowest shard index" in placement.reason
    # equally weak shards 0 and 1: shard 0 already has a node on its way
    joining = [node(4, 0, status="JOIN", routable=False), node(5, 2)]
    placement = choose_shard(MODEL, 3, joining)
    assert placement.shard == 1
    assert placement.reason == (
        "shard 1 of 3: it has 0 routable nodes (shard 0 has 0 + 1 joining, shard 2 has 1)"
    )


def test_an_already_registered_node_key_keeps_its_shard() -> None:
    pool = [node(1, 0), node(2, 0), node(3, 1, status="DOWN", routable=False)]
    placement = choose_shard(MODEL, 3, pool, own_key=key(2))
    assert placement.shard == 0
    assert "already registered" in placement.reason


def test_shards_beyond_the_registered_count_are_not_counted() -> None:
    placement = choose_shard(MODEL, 2, [node(1, 0), node(2, 1, 5)])
    assert [s.replicas for s in placement.supply] == [1, 1]


def test_unknown_model_is_refused_by_name() -> None:
    with pytest.raises(ModelNotRegistered) as raised:
        choose_shard(MODEL, 0, [])
    assert raised.value.code == "model_not_registered"
    assert MODEL in raised.value.message and "not registered" in raised.value.message
    assert raised.value.hint


def test_placement_json_carries_the_reason_and_the_supply() -> None:
    doc = choose_shard(MODEL, 2, [node(1, 0)]).to_json()
    assert doc["shard"] == 1 and doc["shards"] == 2 and doc["reason"].startswith("shard 1 of 2")
    assert doc["supply"][0] == {"shard": 0, "replicas": 1, "throughput": 1, "pending": 0}


def test_parse_nodes_reads_the_committee_answer() -> None:
    answer = {
        "nodes": [entry(1, 0), entry(2, 1, status="JOIN", routable=False), entry(3, 0, 1)],
    }
    assert parse_nodes(answer, MODEL) == (
        node(1, 0),
        node(2, 1, status="JOIN", routable=False),
        node(3, 0, 1),
    )
    assert parse_nodes({"nodes": []}, MODEL) == ()


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (None, "expected an object with a `nodes` list"),
        ({"nodes": {}}, "expected an object with a `nodes` list"),
        ({"nodes": ["x"]}, "nodes[0]: expected an object"),
        ({"nodes": [entry(1, 0, key="AB" * 32)]}, "nodes[0].key"),
        ({"nodes": [entry(1, 0), entry(2, 1, model="sha256:" + "cd" * 32)]}, "nodes[1].model"),
        ({"nodes": [entry(1, 0, role="verifier")]}, "nodes[0].role"),
        ({"nodes": [entry(1, 0, status="serving")]}, "nodes[0].status"),
        ({"nodes": [entry(1, 0, routable=1)]}, "nodes[0].routable"),
        ({"nodes": [entry(1, 0, routable="true")]}, "nodes[0].routable"),
        ({"nodes": [entry(1)]}, "nodes[0].shards"),
        ({"nodes": [entry(1, 1, 0)]}, "nodes[0].shards"),
        ({"nodes": [entry(1, 0, 0)]}, "nodes[0].shards"),
        ({"nodes": [entry(1, -1)]}, "nodes[0].shards"),
        ({"nodes": [entry(1, 65536)]}, "nodes[0].shards"),
        ({"nodes": [entry(1, shards=[True])]}, "nodes[0].shards"),
        ({"nodes": [entry(1, shards=[1.0])]}, "nodes[0].shards"),
        ({"nodes": [entry(1, shards="0")]}, "nodes[0].shards"),
        ({"nodes": [entry(1, shards=list(range(257)))]}, "nodes[0].shards"),
    ],
)
def test_malformed_committee_answers_are_refused_by_name(answer: Any, named: str) -> None:
    with pytest.raises(MalformedPoolAnswer) as raised:
        parse_nodes(answer, MODEL)
    assert raised.value.code == "malformed_committee_answer"
    assert named in raised.value.message
    assert "--shard K" in (raised.value.hint or "")


def test_read_pool_asks_for_the_models_compute_nodes() -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    class Link:
        async def query(self, path: str, **params: Any) -> Any:
            asked.append((path, params))
            return {"nodes": [entry(1, 0)]}

    assert asyncio.run(read_pool(Link(), MODEL)) == (node(1, 0),)
    assert asked == [("/nodes", {"model": MODEL, "role": "compute"})]


def test_a_shard_below_the_replica_floor_is_filled_before_a_slower_one() -> None:
    """Issue 44: shard 0 has one fast node (90), shard 1 two slow ones (2 × 30): by throughput
    alone shard 1 is the weakest, but shard 0 has one node, below the floor of 2 — a node that
    stalls there leaves it with nobody — so the joiner takes shard 0 and says why."""
    pool = [node(1, 0), node(2, 1), node(3, 1)]
    speeds = {key(1): 90, key(2): 30, key(3): 30}
    placement = choose_shard(MODEL, 2, pool, speeds=speeds)
    assert placement.shard == 0
    assert placement.reason.endswith(
        "; below the replica floor of 2 (shard 1 has 60 tokens/s over 2 routable nodes, "
        "at or above it)"
    )
    assert choose_shard(MODEL, 2, pool, speeds=speeds, floor=1).shard == 1  # no floor: speed
    joining = [*pool, node(4, 0, status="JOIN", routable=False)]  # shard 0's second is on its way
    assert choose_shard(MODEL, 2, joining, speeds=speeds).shard == 1


def test_the_replica_floor_is_read_from_params_or_refused_by_name() -> None:
    assert parse_floor({"genesis": {}}) == 2  # a chain from before the floor: the default
    assert parse_floor({"genesis": {"replica_floor": 3}}) == 3
    floors: list[Any] = [0, 65, True, "2", None]
    for bad in [None, {"genesis": []}, *({"genesis": {"replica_floor": f}} for f in floors)]:
        with pytest.raises(MalformedPoolAnswer):
            parse_floor(bad)


# -- the committee's measured speeds (issue 44: the verifiers measure, the chain keeps the median)


def test_placement_weighs_the_speeds_the_committee_lists() -> None:
    """Shard 0 has two slow nodes (2 × 10 tokens/s), shard 1 one fast node (50): by counts the
    joiner would take shard 1 (one replica, floor 1), by the committee's speeds shard 0 is the
    weakest; the line says the speeds were measured."""
    answer = {
        "nodes": [entry(1, 0, speed=10), entry(2, 0, speed=10), entry(3, 1, speed=50)],
    }
    nodes = parse_nodes(answer, MODEL)
    assert [n.speed for n in nodes] == [10, 10, 50]
    placement = choose_shard(MODEL, 2, nodes, floor=1)
    assert placement.shard == 0 and placement.measured
    assert "20 tokens/s over 2 routable nodes" in placement.reason
    assert placement.basis.startswith("weighed by the speeds the verifiers measured")
    assert placement.to_json()["basis"] == placement.basis
    # one routable node not measured yet: replica counts, and the line says why
    answer["nodes"][2] = entry(3, 1, speed=None)
    counted = choose_shard(MODEL, 2, parse_nodes(answer, MODEL), floor=1)
    assert counted.shard == 1 and not counted.measured
    assert counted.basis == (
        "weighed by replica counts: 1 of 3 routable nodes has no measured speed yet"
    )


@pytest.mark.parametrize("speed", [0, -3, 100_001, 2.5, True, "10"])
def test_a_speed_out_of_bounds_or_not_an_integer_is_refused_by_name(speed: Any) -> None:
    with pytest.raises(MalformedPoolAnswer) as raised:
        parse_nodes({"nodes": [entry(1, 0, speed=speed)]}, MODEL)
    assert "nodes[0].speed" in raised.value.message
