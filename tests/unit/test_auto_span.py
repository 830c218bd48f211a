"""`planet join --shards auto`: the span is sized from the machine's memory and what the pool
lacks (node/agent/placement.py `choose_auto_span`, node/agent/machine_memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.agent.machine_memory import available_bytes, parse_meminfo
from node.agent.placement import (
    MemoryFit,
    NotEnoughMemory,
    PoolNode,
    choose_auto_span,
    choose_shard,
)
from protocol.spans import ShardSpan

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "cd" * 32
GIB = 1024**3
MIB = 1024**2


def node(n: int, *shards: int, routable: bool = True, status: str = "SERVING") -> PoolNode:
    return PoolNode(key=f"{n:064x}", shards=shards, status=status, routable=routable)


def fit(available_gib: float, shards: int = 3, shard_mib: int = 400) -> MemoryFit:
    """`shards` shards of `shard_mib` resident, 1 GiB of KV caps, 1 GiB headroom."""
    return MemoryFit(
        available=int(available_gib * GIB),
        headroom=GIB,
        shard_bytes=(shard_mib * MIB,) * shards,
        kv_bytes=GIB,
    )


def test_a_fresh_pools_first_node_with_room_serves_the_whole_model() -> None:
    placement = choose_auto_span(MODEL, 3, [], fit(8))
    assert placement.span == ShardSpan(0, 2)
    assert placement.reason.startswith("shards 0-2 of 3 have no node; serving them as one hop (")
    assert "2.2 GiB with its KV caps, of 8.0 GiB available less 1.0 GiB headroom" in (
        placement.reason
    )
    assert placement.reason.endswith("makes the model answerable")


def test_memory_for_two_of_three_takes_the_first_two() -> None:
    # 2 shards + KV = 1.8 GiB fits in 3.0 - 1.0; 3 shards (2.2 GiB) do not
    placement = choose_auto_span(MODEL, 3, [], fit(3.0))
    assert placement.span == ShardSpan(0, 1)
    assert "serving shards 0-1 as one hop, the longest run of them this machine holds" in (
        placement.reason
    )
    assert placement.reason.endswith("the rest still need nodes")


def test_the_longest_unserved_run_wins_over_the_first() -> None:
    # shard 0 unserved alone, 2-4 unserved together; room for all: the run 2-4
    pool = [node(1, 1)]
    placement = choose_auto_span(MODEL, 5, pool, fit(8, shards=5))
    assert placement.span == ShardSpan(2, 4)
    assert placement.reason.startswith("shards 0, 2-4 of 5 have no node; serving shards 2-4")


def test_a_shard_with_a_joining_node_is_not_unserved() -> None:
    pool = [node(1, 0), node(2, 1, routable=False, status="JOIN")]
    placement = choose_auto_span(MODEL, 3, pool, fit(8))
    assert placement.span == ShardSpan(2, 2) and placement.last is None
    assert placement.reason.startswith("shard 2 of 3 has no node; serving it (")
    assert placement.reason.endswith("completes the pool")


def test_every_shard_served_takes_the_weakest_one_and_says_why_not_a_span() -> None:
    pool = [node(1, 0), node(2, 0), node(3, 1), node(4, 2), node(5, 2)]
    placement = choose_auto_span(MODEL, 3, pool, fit(64))
    assert placement.span == ShardSpan(1, 1)
    assert placement.shard == choose_shard(MODEL, 3, pool).shard
    assert "every shard has a node" in placement.reason
    assert "faster than each of its shards' replicas by the span's length" in placement.reason


def test_memory_for_less_than_one_shard_is_an_error_with_a_hint() -> None:
    with pytest.raises(NotEnoughMemory) as caught:
        choose_auto_span(MODEL, 3, [], fit(2.2))  # 1.2 GiB usable, a shard + KV is 1.4
    assert str(caught.value.message).startswith("shard 0 needs 1.4 GiB (weights 400 MiB + KV")
    assert caught.value.hint and "--shards 1" in caught.value.hint
    served = [node(1, 0), node(2, 1), node(3, 2)]
    with pytest.raises(NotEnoughMemory):
        choose_auto_span(MODEL, 3, served, fit(2.2))


def test_a_registered_key_keeps_its_span() -> None:
    own = node(9, 1, 2)
    assert choose_auto_span(MODEL, 3, [own], fit(8), own_key=own.key).span == ShardSpan(1, 2)


def test_the_same_pool_and_memory_give_the_same_answer() -> None:
    pool = [node(1, 1)]
    assert choose_auto_span(MODEL, 4, pool, fit(3.0, 4)) == choose_auto_span(
        MODEL, 4, list(pool), fit(3.0, 4)
    )


def test_meminfo_is_parsed_or_the_os_is_asked(tmp_path: Path) -> None:
    text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   23048544 kB\n"
    assert parse_meminfo(text) == 23048544 * 1024
    assert parse_meminfo("MemFree: 100 kB\n") is None
    assert parse_meminfo("MemAvailable: -5 kB\n") is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    assert available_bytes(meminfo) == 23048544 * 1024
    assert available_bytes(tmp_path / "absent") > 0  # the free-page count
