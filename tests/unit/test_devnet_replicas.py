"""How many compute nodes `planet devnet up` starts (deploy/devnet/replicas.py): two per shard
where the available memory holds them, else one, always saying why."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.devnet.replicas import GIB, available_memory, devnet_bytes, node_count
from planet import main as cli
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

SIZES = {"validators": 4, "verifiers": 4, "gateway": True}


def test_devnet_starts_two_per_shard_when_memory_holds_them() -> None:
    wanted = devnet_bytes(6, **SIZES)
    count = node_count(nodes=None, replicas=None, available=wanted, **SIZES)
    assert (count.nodes, count.replicas) == (6, 2)
    assert "replica floor" in count.note


def test_devnet_starts_one_per_shard_and_says_why_when_memory_is_short() -> None:
    short = devnet_bytes(6, **SIZES) - 1
    count = node_count(nodes=None, replicas=None, available=short, **SIZES)
    assert (count.nodes, count.replicas) == (3, 1)
    assert "below the replica floor" in count.note and "available" in count.note
    assert "--replicas 2" in count.note
    unknown = node_count(nodes=None, replicas=None, available=None, **SIZES)
    assert unknown.nodes == 3 and "/proc/meminfo" in unknown.note


def test_devnet_memory_plan_counts_the_second_model_s_seat() -> None:
    """The second model's seat (node0's process) and client part (the gateway) take memory
    too: where two per shard fit only without them, a devnet with the second model starts one
    per shard and says so; with `--one-model` two."""
    one_model = devnet_bytes(6, **SIZES)
    both = devnet_bytes(6, **SIZES, second_model=True)
    assert both - one_model == 3 * GIB // 4
    count = node_count(nodes=None, replicas=None, available=one_model, second_model=True, **SIZES)
    assert (count.nodes, count.replicas) == (3, 1) and "below the replica floor" in count.note
    assert (
        node_count(nodes=None, replicas=None, available=both, second_model=True, **SIZES).nodes == 6
    )
    assert node_count(nodes=None, replicas=None, available=one_model, **SIZES).nodes == 6


def test_devnet_replicas_and_nodes_flags() -> None:
    assert node_count(nodes=None, replicas=1, available=100 * GIB, **SIZES).nodes == 3
    forced = node_count(nodes=None, replicas=3, available=GIB, **SIZES)
    assert forced.nodes == 9 and "warning" in forced.note
    assert node_count(nodes=4, replicas=None, available=None, **SIZES).nodes == 4
    with pytest.raises(UsageError, match="not both"):
        node_count(nodes=3, replicas=1, available=None, **SIZES)
    with pytest.raises(UsageError, match=r"--replicas must be 1\.\.3"):
        node_count(nodes=None, replicas=0, available=None, **SIZES)


def test_available_memory_reads_meminfo_or_says_nothing(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683784 kB\nMemAvailable:   17526476 kB\n")
    assert available_memory(meminfo) == 17526476 * 1024
    meminfo.write_text("MemAvailable:   lots kB\n")
    assert available_memory(meminfo) is None
    assert available_memory(tmp_path / "absent") is None


def test_devnet_up_both_flags_is_one_error_line(tmp_path: Path, capsys) -> None:
    code = cli.main(["devnet", "up", "--nodes", "3", "--replicas", "2", "--home", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "error: give --nodes or --replicas, not both" in err
    assert "hint:" in err and "Traceback" not in err
    assert not (tmp_path / "devnet").exists()
