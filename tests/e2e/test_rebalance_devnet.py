"""Rebalancing on the shared devnet (issue 44; node/agent/rebalance.py, mover.py): a node joined
with `planet join --model M` alone (auto placement) moves to a shard whose node died, while a
question asked during the move is answered.

The shared devnet runs one node per shard. An auto-placed operator joins (the weakest shard: it
doubles one up); then the devnet node of another shard stops heartbeating (its agent is
SIGSTOPped: to the committee the node is dead, and it goes DOWN after `heartbeat_timeout`
blocks; its compute process stays, so the devnet is whole again once the agent goes on — the
session's later tests need it). That shard then has no routable node; the auto-placed node's
agent sees the pool change, loads that shard in a second process while its old one still
serves, re-registers (`move_shards`), drains its old process and stops it. A paid question
asked through the gateway while this happens is answered. The time from the chain listing the
shard as short (DOWN) to the moved node being routable on it is printed (`rebalance_recovery`)
and bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from node.server.launcher import pid_alive
from tests.e2e.devnet_session import User, query, wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECOVERY_BOUND_S = 120  # short (DOWN on chain) → served again by the moved node
TUNING = "--rebalance-jitter-s 2 --rebalance-drain-s 30 --rebalance-every 10"


def _joined(home: Path) -> dict[str, Any]:
    return json.loads((home / "run" / "joined.json").read_text())


def _node(rpc: str, key: str) -> dict[str, Any]:
    return query(rpc, "/node", key=key) or {}


def _ask(env: dict[str, str], user: User, question: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "planet", "ask", "--pay", *user.pay_args(),
            "--max-tokens", "24", question]  # fmt: skip
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe, text=True)


def test_an_auto_placed_node_moves_to_a_shard_whose_node_died(
    devnet_env: dict[str, str], shared_devnet: dict[str, Any], new_operator: Any, fresh_user: User
) -> None:
    rpc = shared_devnet["committee_rpc"][0]
    mover = new_operator("auto", {"PLANET_REBALANCE_ARGS": TUNING})
    start = _joined(mover.home)["shard"]
    agent_log = mover.home / "run" / "agent.log"
    wait(lambda: "rebalance: stayed on shard" in agent_log.read_text(), 60, "a first decision")
    # the devnet node of the highest other shard dies (to the committee)
    victims = [_joined(Path(h)) for h in shared_devnet["operators"]]
    victim = max((v for v in victims if v["shard"] != start), key=lambda v: v["shard"])
    target = victim["shard"]
    os.kill(victim["agent_pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    question = None
    try:
        wait(lambda: _node(rpc, victim["node_key"]).get("status") == "DOWN", 120, "victim DOWN")
        short_at = time.monotonic()
        wait(lambda: f"loading shard {target}" in agent_log.read_text(), 60, "the move to start")
        question = _ask(devnet_env, fresh_user, "Name three colours.")  # in flight meanwhile

        def served() -> bool:
            view = _node(rpc, mover.node_key)
            return view.get("shards") == [target] and view.get("routable") is True

        wait(served, RECOVERY_BOUND_S, f"the auto-placed node routable on shard {target}")
        served_at = time.monotonic()
        out, err = question.communicate(timeout=300)
        assert question.returncode == 0, err[-3000:]
        assert out.strip()
    finally:
        if question is not None and question.poll() is None:
            question.kill()
        os.kill(victim["agent_pid"], signal.SIGCONT)
    log = agent_log.read_text()
    assert f"rebalance: moving shard {start} -> {target}: shard {target} has no routable" in log
    assert f"rebalance: moved shard {start} -> {target}" in log
    assert "rebalance: old node of shard" in log  # drained, or cut after the bound
    joined = _joined(mover.home)
    assert joined["shard"] == target
    assert joined["endpoint"] == _node(rpc, mover.node_key)["endpoint"]
    wait(lambda: not any(f"node-{start}.pid" == p.name for p in (mover.home / "run").iterdir()),
         60, "the old process's pid file gone")  # fmt: skip
    assert pid_alive(joined["node_pid"])
    # the devnet's node comes back (its agent heartbeats again): the session's devnet is whole
    wait(lambda: _node(rpc, victim["node_key"]).get("routable") is True, 90, "victim routable")
    print(
        "rebalance_recovery "
        + json.dumps(
            {
                "stop_to_down_s": round(short_at - stopped_at, 1),
                "down_to_served_s": round(served_at - short_at, 1),
                "stop_to_served_s": round(served_at - stopped_at, 1),
            }
        )
    )
    assert served_at - short_at <= RECOVERY_BOUND_S
