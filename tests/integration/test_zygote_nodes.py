"""A real `planet node serve` forked from the session's zygote (tests/conftest.py
`zygote_lane`, node/zygote) through the launcher: it answers /health from its own process,
the launcher knows it for a node by its command line, and stops it by pid."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.gateway_net import prepared_manifest, wait_for
from harness.zygote import ping
from node.procs import listens_on
from node.server.launcher import (
    free_ports,
    is_planet_node,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)

pytestmark = pytest.mark.integration


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_node_forked_by_zygote_serves_health_and_stops(
    zygote_lane: Path | None, tmp_path: Path
) -> None:
    if zygote_lane is None:
        pytest.skip("no zygote in this session (PLANET_TEST_ZYGOTE=0, or it failed to start)")
    manifest = prepared_manifest(parts=2, quant="int8")
    first, second = free_ports(2, 23600, 23700)
    node = start_node(manifest=manifest, shard=0, port=first, run_dir=tmp_path / "a")
    other = start_node(manifest=manifest, shard=1, port=second, run_dir=tmp_path / "b")
    try:
        assert _parent(node.pid) == ping(zygote_lane) != os.getpid()
        wait_healthy([node, other], timeout_s=180)
        assert listens_on(node.pid, node.port) is True
        assert is_planet_node(node.pid)
        assert stop_pid(node.pid)
        assert not pid_alive(node.pid)
        os.kill(other.pid, signal.SIGKILL)  # as the failover tests do: reaped by the zygote
        wait_for(lambda: not pid_alive(other.pid), 30, "the killed node gone from /proc")
        assert stop_pid(other.pid) is False
    finally:
        stop_pid(node.pid)
        stop_pid(other.pid)
