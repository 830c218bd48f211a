"""`status` and `running`: what of a devnet still runs, from its state file and its processes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deploy.committee.network import load_network
from deploy.committee.processes import pid_alive, running_processes
from deploy.committee.status import network_status
from deploy.devnet.hosts import Placement, inside, lab_alive
from deploy.devnet.plan import devnet_dir, read_state
from deploy.devnet.processes import ours
from node.agent.launch import agent_alive, read_joined
from node.chain.committee_link import CommitteeLink
from protocol.errors import PlanetError


def running(state: dict[str, Any]) -> bool:
    """Whether any process of this devnet still runs."""
    pids = state.get("pids", {})
    if ours(pids.get("anvil"), "anvil") or ours(pids.get("gateway"), "gateway"):
        return True
    if lab_alive(state):
        return True
    if any(ours(pid, "verifier") for pid in pids.get("verifiers", [])):
        return True
    if state.get("committee_dir"):
        with contextlib.suppress(PlanetError):
            if running_processes(load_network(Path(state["committee_dir"]))):
                return True
    for home in state.get("operators", []):
        joined = read_joined(Path(home) / "run")
        if joined is not None and (agent_alive(joined) or pid_alive(joined.node_pid)):
            return True
    return False


def status(home: Path) -> dict[str, Any]:
    """devnet.json plus what runs now: processes, validators, nodes, pool health, gateway."""
    directory = devnet_dir(home)
    state = read_state(directory)
    if state is None:
        return {"dir": str(directory), "status": "absent"}
    out = dict(state)
    if state.get("hosts"):
        out["hosts_alive"] = lab_alive(state)
        if not out["hosts_alive"]:  # nothing inside can be reached any more
            out["running"] = running(state)
            return out
    with inside(Placement.from_state(state).control_netns):
        _status(state, out)
    out["running"] = running(state)
    return out


def _status(state: dict[str, Any], out: dict[str, Any]) -> None:
    pids = state.get("pids", {})
    out["processes"] = {
        "anvil": ours(pids.get("anvil"), "anvil"),
        "gateway": ours(pids.get("gateway"), "gateway") if pids.get("gateway") else None,
    }
    out["validators"] = []
    if state.get("committee_dir"):
        try:
            network = load_network(Path(state["committee_dir"]))
            out["validators"] = asyncio.run(network_status(network))
        except PlanetError as error:
            out["validators_error"] = error.message
    local = []
    for operator in state.get("operators", []):
        joined = read_joined(Path(operator) / "run")
        local.append(
            None
            if joined is None
            else {
                "home": operator,
                "model": joined.model,
                "shard": joined.shard,
                "endpoint": joined.endpoint,
                "node_key": joined.node_key,
                "node_alive": pid_alive(joined.node_pid),
                "agent_alive": agent_alive(joined),
            }
        )
    out["local_nodes"] = local
    out["nodes"], out["pool"] = [], None
    if state.get("committee_rpc") and state.get("model_hash"):
        try:
            out["nodes"], out["pool"] = asyncio.run(
                _chain_view(state["committee_rpc"], state["model_hash"])
            )
        except PlanetError as error:
            out["nodes_error"] = error.message
    if state.get("gateway_url"):
        try:
            with urllib.request.urlopen(state["gateway_url"] + "/health", timeout=2) as answer:
                out["gateway_healthy"] = answer.status == 200
        except (urllib.error.URLError, OSError):
            out["gateway_healthy"] = False
    if pids.get("verifiers") and state.get("committee_dir") and state.get("committee_rpc"):
        try:
            out["verifiers"] = _verifiers(state, pids["verifiers"])
        except PlanetError as error:
            out["verifiers_error"] = error.message


def consensus_public_key(home: str | Path) -> str | None:
    """A validator's ed25519 consensus key (64 hex) from its CometBFT home; None if unreadable."""
    path = Path(home) / "config" / "priv_validator_key.json"
    try:
        raw = base64.b64decode(json.loads(path.read_text())["pub_key"]["value"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _verifiers(state: dict[str, Any], pids: list[int]) -> list[dict[str, Any]]:
    """Each verifier the devnet started: alive, and the findings URL its validator published
    (`/verifier_endpoints`; None until its verifier has sent it)."""
    network = load_network(Path(state["committee_dir"]))
    endpoints = asyncio.run(_endpoints(state["committee_rpc"]))
    rows = []
    for validator, pid in zip(network.validators, pids, strict=False):
        key = consensus_public_key(validator.home)
        rows.append(
            {
                "validator": validator.index,
                "alive": ours(pid, "verifier"),
                "findings_url": endpoints.get(key) if key else None,
            }
        )
    return rows


async def _endpoints(urls: list[str]) -> dict[str, str]:
    link = CommitteeLink(urls, timeout_s=3.0)
    try:
        answer = await link.query("/verifier_endpoints")
    finally:
        await link.close()
    endpoints = answer.get("endpoints") if isinstance(answer, dict) else None
    return endpoints if isinstance(endpoints, dict) else {}


async def _chain_view(urls: list[str], model: str) -> tuple[list[dict[str, Any]], Any]:
    link = CommitteeLink(urls, timeout_s=3.0)
    try:
        nodes = await link.nodes(model=model, role="compute")
        pool = await link.query("/pool_health", model=model)
        return nodes, pool
    finally:
        await link.close()
