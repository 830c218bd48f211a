"""The `/relays` query: the overlay relays users' clients may draw (docs/overlay.md,
docs/committee.md).

A relay registers as a node does (`relay` tx, registry.py): its committee key, bound to an EVM
address, gets a `node/<key>` record with role `relay`, starts JOIN, heartbeats to stay up,
leaves with `leave`, and its stake is attested by the validators' watchers, which read the
Staking contract's stake of that address and count it only while its role there is Relay
(node/watcher/watcher.py). So the same rules hold as for nodes:

- a relay is *listed* (`/relays`) only while validators with ≥ 2/3 of the power agree on a stake
  of at least genesis `min_stake.relay` and it is JOIN or SERVING (not DOWN, not LEFT);
- a registration whose stake is not agreed within `registration_ttl` blocks is deleted, with its
  endpoint and key (registry.expire_registrations).

Each relay holds its own endpoint and X25519 key (registry.register_relay refuses a second relay
with either), so one server cannot be listed twice to weigh on the users' draws.
"""

from __future__ import annotations

from typing import Any

from abci_app import schema
from abci_app.query_params import NODE_KEY, limit_param, str_param
from abci_app.state import State
from protocol.committee.relays import RELAY_ROLE as ROLE

LIVE = (schema.JOIN, schema.SERVING)


def relay_view(state: State, key: str) -> dict[str, Any] | None:
    """A relay's `/relays` entry, or None while it is not listed (not staked, DOWN or LEFT)."""
    node = state.committed(schema.NODE, key)
    if node is None or node["role"] != ROLE or node["status"] not in LIVE:
        return None
    stake = state.committed(schema.STAKE, key)
    agreed = stake["agreed"] if stake else None
    if agreed is None or int(agreed) < state.genesis.min_stake.get(ROLE, 0):
        return None
    return {
        "key": key,
        "evm_address": node["evm_address"],
        "endpoint": node["endpoint"],
        "relay_key": node["relay_key"],
        "stake": agreed,
        "status": node["status"],
    }


def relays_page(state: State, params: dict[str, Any]) -> Any:
    """`/relays[?after=KEY][&limit=N]`: the listed relays among the next `limit` registered ones
    after `after`, in key order. `next` is the key to pass as `after` when more follow, else
    null, so paging until null lists every relay once; a page may hold fewer than `limit`
    relays (the unlisted ones it passed over), never more."""
    after = str_param(params, "after", NODE_KEY)
    limit = limit_param(params)
    relays: list[dict[str, Any]] = []
    seen, last = 0, ""
    for key, _ in state.committed_items(schema.RELAY, after or ""):
        if key == after:
            continue  # the previous page's last key
        if seen == limit:
            return {"relays": relays, "next": last}
        seen += 1
        last = key
        view = relay_view(state, key)
        if view is not None:
            relays.append(view)
    return {"relays": relays, "next": None}


RELAY_ROUTES = {"/relays": relays_page}
