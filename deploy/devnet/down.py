"""`down`: stop every process of the devnet (agents first, so they send `leave`), then its
hosts if it has them; idempotent."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from deploy.committee.network import load_network
from deploy.committee.processes import pid_alive, stop_network
from deploy.devnet.hosts import stop_lab
from deploy.devnet.plan import CHEAT_NODE_MODULE, Progress, devnet_dir, read_state, write_state
from deploy.devnet.processes import ours
from node.agent.launch import stop_joined
from protocol.errors import PlanetError


def _stop_pid(pid: int | None, marker: str, grace_s: float = 10.0) -> bool:
    if not ours(pid, marker):
        return False
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(int(pid)):
        time.sleep(0.05)
    if pid_alive(int(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return True


def down(home: Path, progress: Progress) -> list[str]:
    """Stop every process of the devnet (gateway, agents → leave, nodes, committee, anvil).
    Idempotent; returns what was stopped."""
    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None:
        return []
    stopped = []
    pids = state.get("pids", {})
    for pid in pids.get("verifiers", []):
        if _stop_pid(pid, "verifier"):
            stopped.append(f"verifier {pid}")
            progress(f"stopped the verifier (pid {pid})")
    if _stop_pid(pids.get("gateway"), "gateway"):
        stopped.append("gateway")
        progress("stopped the gateway")
    for pid in pids.get("cheat_nodes", []):  # their agents stop (and leave) below
        if _stop_pid(pid, CHEAT_NODE_MODULE):
            stopped.append(f"cheating node {pid}")
            progress(f"stopped the cheating node (pid {pid})")
    for operator in state.get("operators", []):
        result = stop_joined(Path(operator) / "run")
        name = Path(operator).name
        if result["agent"] or result["node"]:
            stopped.append(name)
            progress(f"stopped {name} (agent sent `leave`, node stopped)")
    if state.get("committee_dir"):
        with contextlib.suppress(PlanetError):
            network = load_network(Path(state["committee_dir"]))
            names = stop_network(network)
            if names:
                stopped += names
                progress(f"stopped the committee ({', '.join(names)})")
    if _stop_pid(pids.get("anvil"), "anvil"):
        stopped.append("anvil")
        progress("stopped anvil")
    for item in stop_lab(state):  # last: the agents' `leave` crossed the hosts' links
        stopped.append(item)
        progress(f"removed the {item} (namespaces, links, what still ran in them)")
    state["status"] = "down"
    write_state(directory, state)
    return stopped
