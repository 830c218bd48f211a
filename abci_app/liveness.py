"""Liveness: what keeps a node SERVING besides its heartbeats, and how long a DOWN node stays a
fallback for clients (issue 44, "no false deaths").

A node's agent sends heartbeats; on a loaded machine it can miss them for longer than
`heartbeat_timeout` while the node's compute process goes on serving. Two rules keep such a
node from being dropped while it serves:

- **Evidence of service counts as a heartbeat.** At the height of an accepted tx the node
  signs itself that shows it working (`commit`, `reveal`: the positions it served;
  `credit_lock`, `redeem`: the credits its clients paid with) the node is alive exactly as if
  it had sent a heartbeat in that block: `last_served` is set to the height, the heartbeat check is
  rescheduled, and a DOWN node is SERVING again. A node still in JOIN stays JOIN (a node
  becomes SERVING by its own heartbeat first). Deterministic: heights only, at most one
  write per node and block. Nobody else's word counts: a gateway's `work_report` naming the
  node keeps nothing alive (any key may bind itself as a gateway, so a dead node's operator
  could otherwise keep it listed; issue 45).
- **A DOWN mark is a hint to clients.** A node DOWN for at most `grace_blocks` (ten heartbeat
  timeouts) that is otherwise routable (staked, trusted, committing) is listed by `/nodes`
  with `"grace": true`. Clients (the gateway's router, the nodes' next-hop policy) route to
  such a node only when its shard has no routable node and it answers them live (`/info`):
  a live answer wins over a missed heartbeat, and a dead node fails that check.
"""

from __future__ import annotations

from typing import Any

from abci_app import registry, schema
from abci_app.state import State

GRACE_TIMEOUTS = 10  # a DOWN node is a client-side fallback for this many heartbeat timeouts


def note_service(state: State, node_key: str) -> None:
    """Evidence at this height that `node_key` serves (see the module docstring)."""
    node = state.get(schema.NODE, node_key)
    if node is None or node["status"] not in (schema.JOIN, schema.SERVING, schema.DOWN):
        return
    height = state.block_height
    if node.get("last_served", 0) >= height:
        return  # already counted in this block
    updated = {**node, "last_served": height}
    if node["status"] == schema.DOWN:
        updated["status"] = schema.SERVING
        updated["status_height"] = height
        state.emit("planet.node", node=node_key, status=schema.SERVING, evidence="service")
    state.put(schema.NODE, node_key, updated)
    registry.schedule_heartbeat_check(state, node_key, height)


def grace_blocks(state: State) -> int:
    return GRACE_TIMEOUTS * state.genesis.heartbeat_timeout


def in_grace(state: State, node: dict[str, Any], height: int) -> bool:
    """DOWN since at most `grace_blocks` before `height` (the committed height, for queries)."""
    return node["status"] == schema.DOWN and height - int(node["status_height"]) <= grace_blocks(
        state
    )
