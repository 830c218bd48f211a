"""`down`: stop every process of the devnet (agents first, so they send `leave`), then its
hosts if it has them; idempotent."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deploy.committee.network import load_network
from deploy.committee.processes import pid_alive, stop_network
from deploy.devnet.hosts import stop_lab
from deploy.devnet.plan import CHEAT_NODE_MODULE, Progress, devnet_dir, read_state, write_state
from deploy.devnet.processes import ours
from node.agent.launch import stop_joined
from protocol.errors import PlanetError


def _stop_pids(targets: list[tuple[int | None, str]], grace_s: float = 10.0) -> list[int]:
    """SIGTERM every (pid, marker) that is still ours at once, wait for all of them (one
    shared deadline), SIGKILL what is left; the pids stopped."""
    mine = [int(pid) for pid, marker in targets if pid is not None and ours(pid, marker)]
    for pid in mine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in mine):
        time.sleep(0.05)
    for pid in mine:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return mine


def down(home: Path, progress: Progress) -> list[str]:
    """Stop every process of the devnet (verifiers, gateway and cheating nodes together; the
    operators' agents → leave, nodes, all operators at once; the committee; anvil).
    Idempotent; returns what was stopped."""
    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None:
        return []
    stopped = []
    pids = state.get("pids", {})
    front = [(pid, "verifier", "verifier") for pid in pids.get("verifiers", [])]
    front += [(pids.get("gateway"), "gateway", "gateway")]
    front += [(pid, CHEAT_NODE_MODULE, "cheating node") for pid in pids.get("cheat_nodes", [])]
    labels = {pid: label for pid, _, label in front}
    # the cheating nodes' agents stop (and leave) with the operators below
    for pid in _stop_pids([(pid, marker) for pid, marker, _ in front]):
        label = labels[pid]
        stopped.append("gateway" if label == "gateway" else f"{label} {pid}")
        progress(f"stopped the {label} (pid {pid})")
    operators = [Path(operator) for operator in state.get("operators", [])]
    if operators:  # each agent sends `leave` and waits for it: all of them at once
        with ThreadPoolExecutor(max_workers=len(operators)) as pool:
            agents = list(pool.map(lambda home: stop_joined(home / "run", node=False), operators))
            # a seat's node is another operator's process (second_model.py): the seats leave
            # their host one by one (each a read-modify-write of its seats file), then the
            # nodes stop at once, a host with its last seat
            seats = {Path(seat) for seat in state.get("seats", [])}
            nodes = {home: stop_joined(home / "run") for home in operators if home in seats}
            rest = [home for home in operators if home not in seats]
            ended = list(pool.map(lambda home: stop_joined(home / "run"), rest))
            nodes.update(zip(rest, ended, strict=True))
        for operator, agent in zip(operators, agents, strict=True):
            if agent["agent"] or nodes[operator]["node"]:
                stopped.append(operator.name)
                progress(f"stopped {operator.name} (agent sent `leave`, node stopped)")
    if state.get("committee_dir"):
        with contextlib.suppress(PlanetError):
            network = load_network(Path(state["committee_dir"]))
            names = stop_network(network)
            if names:
                stopped += names
                progress(f"stopped the committee ({', '.join(names)})")
    if _stop_pids([(pids.get("anvil"), "anvil")]):
        stopped.append("anvil")
        progress("stopped anvil")
    for item in stop_lab(state):  # last: the agents' `leave` crossed the hosts' links
        stopped.append(item)
        progress(f"removed the {item} (namespaces, links, what still ran in them)")
    state["status"] = "down"
    write_state(directory, state)
    return stopped
