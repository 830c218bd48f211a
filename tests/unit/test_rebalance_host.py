"""The files a rebalancing agent reads and writes in the operator home (node/agent/node_host.py):
`node_launch.json` parsed or refused by name, joined.json pointing at the adopted process, and
the tuning flags `planet join` passes to the agent (node/agent/launch.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from node.agent import launch
from node.agent.mover import Replacement
from node.agent.node_host import BadLaunchFile, NodeLaunch, read_launch, write_launch
from node.server.launcher import NodeProcess
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


def test_the_launch_file_round_trips_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    given = NodeLaunch(tmp_path / "m.json", "127.0.0.1", ("--max-sessions", "4"), tmp_path / "k")
    write_launch(tmp_path, given)
    assert read_launch(tmp_path) == given
    for bad in ("not json", "[]", '{"manifest": "m"}', json.dumps({**given.to_json(), "host": 3})):
        (tmp_path / "node_launch.json").write_text(bad)
        with pytest.raises(BadLaunchFile) as refused:
            read_launch(tmp_path)
        assert refused.value.code == "bad_node_launch_file"


def test_adopt_points_joined_json_at_the_new_process(tmp_path: Path) -> None:
    from node.agent.node_host import ProcessHost

    host = ProcessHost.__new__(ProcessHost)  # adopt reads only run_dir (no manifest)
    host.run_dir = tmp_path
    joined = {"shard": 0, "port": 18100, "endpoint": "https://127.0.0.1:18100", "node_pid": 11,
              "node_log": "x", "agent_pid": 12, "model": "m"}  # fmt: skip
    (tmp_path / "joined.json").write_text(json.dumps(joined))
    process = NodeProcess(2, 18102, 21, tmp_path / "node-2.log", tmp_path / "node-2.pid",
                          key="ab" * 32)  # fmt: skip
    old = asyncio.run(host.adopt(Replacement(2, process.url, process)))
    assert old == (11, 0, "https://127.0.0.1:18100")
    now = json.loads((tmp_path / "joined.json").read_text())
    assert (now["shard"], now["port"], now["node_pid"]) == (2, 18102, 21)
    assert now["endpoint"] == "https://127.0.0.1:18102" and now["agent_pid"] == 12


def test_rebalance_tuning_passes_only_the_agents_flags(monkeypatch) -> None:
    monkeypatch.setenv("PLANET_REBALANCE_ARGS", "--rebalance-jitter-s 1 --rebalance-every 3")
    assert launch._rebalance_tuning() == ["--rebalance-jitter-s", "1", "--rebalance-every", "3"]
    for bad in ("--rebalance-jitter-s", "--home /etc 1 2", "--rebalance-every 1 --x 2"):
        monkeypatch.setenv("PLANET_REBALANCE_ARGS", bad)
        with pytest.raises(UsageError):
            launch._rebalance_tuning()
