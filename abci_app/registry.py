"""The node registry: registration, lifecycle, stake, and what ends a registration.

Txs (`register_node`, `heartbeat`, `leave`, `attest_stake`, `move_shards`, and `relay`: an
overlay relay registers with its endpoint and X25519 key, and shares the rest; /relays lists the
staked ones, relay_queries.py): each handler reads through
`state.get`, refuses (`rules.reject`) before writing anything when a rule fails, and otherwise
writes with `state.put`; a refused tx changes nothing but its signer's nonce.

Lifecycle (`node/<key>.status`): JOIN at registration; a heartbeat makes JOIN/DOWN SERVING;
`leave` makes it LEFT (final). `move_shards` (rebalancing, node/agent/rebalance.py) changes what
a compute node serves and where: its shards and endpoint, nothing else (key, stake,
reputation, status stay); refused for a node that left (INVALID_LIFECYCLE), for another role
(WRONG_ROLE), to what it already has (MOVE_UNCHANGED), to a shard beyond its model's count in
genesis `models` (MOVE_SHARD_UNKNOWN), and within `MOVE_COOLDOWN_BLOCKS` of its last move
(MOVE_TOO_SOON: a node cannot flap between shards). A move from one shard to another carries
its price along (the record and its schedule); otherwise its prices on the shards it left go.
The credits the node earned on a shard it left stay redeemable there for their window
(left_shards.py).

Two height-driven rules end a node's standing, each checked at the exact height it is due
(never a scan of all nodes):

- **Heartbeat timeout**: a JOIN/SERVING node whose last heartbeat — or last evidence of
  service (`last_served`, liveness.py) — is more than `heartbeat_timeout` blocks old becomes
  DOWN (`hbdue/<height>` index, `expire_heartbeats`).
- **Unstaked registrations expire**: each registration schedules a check at
  `registered_height + registration_ttl` (`regdue/<height>`, genesis `registration_ttl`,
  default 100 blocks); an `attest_stake` that moves the agreed amount below `min_stake[role]`
  schedules one at `height + registration_ttl`. At a check the node is deleted when it is
  still not staked (agreed < min_stake of its role) and at least `registration_ttl` blocks
  old: its `node/`, `evm/`, `rep/`, `stake/`, `acct/` entries go (`expire_registrations`).
"""

from __future__ import annotations

from typing import Any

from abci_app import coverage, left_shards, prices, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.registry import AttestStake, MoveShards, RegisterNode
from protocol.committee.relays import RELAY_ROLE, RegisterRelay

# blocks between two moves of one node (`move_shards`); the node's agent waits minutes anyway
MOVE_COOLDOWN_BLOCKS = 10
# the entries of a node key that an expired registration deletes (and `evm/<its address>`)
NODE_NAMESPACES = (schema.NODE, schema.REPUTATION, schema.STAKE, schema.NONCE, schema.SPEED)


# --- txs ----------------------------------------------------------------------------------------


def register_node(state: State, tx: SignedTx) -> None:
    body: RegisterNode = tx.body
    evm = _refuse_taken(state, tx.signer, body.evm_address, "node")
    _check_rendezvous(state, body)
    _check_numerics(state, body)
    height = state.block_height
    record = {
        "key": tx.signer,
        "evm_address": body.evm_address,
        "role": body.role,
        "model": body.model,
        "shards": list(body.shards),
        "endpoint": body.endpoint,
        "capacity": body.capacity,
        "status": schema.JOIN,
        "status_height": height,
        "registered_height": height,
        "last_heartbeat": height,
    }
    if body.rendezvous:  # only then: a record without it is what it was before
        record["rendezvous"] = [r.to_json() for r in body.rendezvous]
    if body.numerics is not None:  # likewise: an unannounced registration stores no field
        record["numerics"] = body.numerics
    if body.rebalances is not None:  # likewise: unannounced (an older release) stores nothing
        record["rebalances"] = body.rebalances
    state.put(schema.NODE, tx.signer, record)
    state.put(schema.EVM_BINDING, evm, tx.signer)
    rep = state.genesis.reputation
    state.put(
        schema.REPUTATION,
        tx.signer,
        {"r": rep.initial, "window": [], "epochs": 0, "last_epoch": 0},
    )
    schedule_heartbeat_check(state, tx.signer, height)
    schedule_registration_check(state, tx.signer, height)
    state.emit("planet.node", node=tx.signer, status=schema.JOIN)


def _check_rendezvous(state: State, body: RegisterNode) -> None:
    """Each rendezvous entry names a registered relay (RENDEZVOUS_NOT_RELAY) and an address at
    that relay's registered IP (RENDEZVOUS_ENDPOINT): a node claims a port only at a relay it
    names, never another server's address."""
    for entry in body.rendezvous:
        relay = state.get(schema.RELAY, entry.relay)
        node = state.get(schema.NODE, entry.relay)
        if relay is None or node is None or node.get("status") == schema.LEFT:
            rules.reject(Code.RENDEZVOUS_NOT_RELAY, f"{entry.relay} is not a registered relay")
        registered = str(relay["endpoint"]).split("://", 1)[1].rsplit(":", 1)[0]
        if entry.host != registered:
            rules.reject(
                Code.RENDEZVOUS_ENDPOINT,
                f"rendezvous endpoint {entry.endpoint} is not at relay {entry.relay}'s address "
                f"{registered}",
            )


def _check_numerics(state: State, body: RegisterNode) -> None:
    """An announced numerics version must be one the genesis accepts (NUMERICS_NOT_ACCEPTED): a
    verifier skips the bitwise checks of a node on other numerics than its own, so a version no
    verifier runs would exempt its announcer from them. Unannounced: every check, as before."""
    accepted = state.genesis.numerics
    if body.numerics is not None and body.numerics not in accepted:
        rules.reject(
            Code.NUMERICS_NOT_ACCEPTED,
            f"numerics {body.numerics} is not accepted by this chain (genesis numerics "
            f"{list(accepted)})",
        )


def _refuse_taken(state: State, signer: str, evm_address: str, noun: str) -> str:
    """A registration's key and EVM address must both be free (ALREADY_REGISTERED,
    EVM_ADDRESS_TAKEN); returns the address's binding key (lowercase)."""
    if state.get(schema.NODE, signer) is not None:
        rules.reject(Code.ALREADY_REGISTERED, f"{noun} {signer} is already registered")
    evm = evm_address.lower()
    if state.get(schema.EVM_BINDING, evm) is not None:
        taken = f"EVM address {evm_address} is bound to another {noun}"
        rules.reject(Code.EVM_ADDRESS_TAKEN, taken)
    return evm


def register_relay(state: State, tx: SignedTx) -> None:
    """An overlay relay registers: a node record with role relay (listed by /relays once
    staked: relay_queries.py), its endpoint and X25519 key held for it alone."""
    body: RegisterRelay = tx.body
    evm = _refuse_taken(state, tx.signer, body.evm_address, "key")
    if state.get(schema.RELAY_BY_KEY, body.relay_key) is not None:
        rules.reject(Code.RELAY_KEY_TAKEN, f"X25519 key {body.relay_key} is another relay's")
    if state.get(schema.RELAY_BY_URL, body.endpoint) is not None:
        rules.reject(Code.RELAY_ENDPOINT_TAKEN, f"endpoint {body.endpoint} is another relay's")
    height = state.block_height
    state.put(
        schema.NODE,
        tx.signer,
        {
            "key": tx.signer,
            "evm_address": body.evm_address,
            "role": RELAY_ROLE,
            "model": "",
            "shards": [],
            "endpoint": body.endpoint,
            "capacity": 0,
            "relay_key": body.relay_key,
            "status": schema.JOIN,
            "status_height": height,
            "registered_height": height,
            "last_heartbeat": height,
        },
    )
    state.put(schema.EVM_BINDING, evm, tx.signer)
    state.put(schema.RELAY, tx.signer, {"endpoint": body.endpoint, "relay_key": body.relay_key})
    state.put(schema.RELAY_BY_KEY, body.relay_key, tx.signer)
    state.put(schema.RELAY_BY_URL, body.endpoint, tx.signer)
    schedule_heartbeat_check(state, tx.signer, height)
    schedule_registration_check(state, tx.signer, height)
    state.emit("planet.node", node=tx.signer, status=schema.JOIN, role=RELAY_ROLE)


def heartbeat(state: State, tx: SignedTx) -> None:
    node = rules.registered_node(state, tx.signer)
    if node["status"] == schema.LEFT:
        rules.reject(Code.INVALID_LIFECYCLE, f"node {tx.signer} has left")
    height = state.block_height
    updated = {**node, "last_heartbeat": height}
    if node["status"] != schema.SERVING:
        updated["status"] = schema.SERVING
        updated["status_height"] = height
        state.emit("planet.node", node=tx.signer, status=schema.SERVING)
    state.put(schema.NODE, tx.signer, updated)
    schedule_heartbeat_check(state, tx.signer, height)


def leave(state: State, tx: SignedTx) -> None:
    node = rules.registered_node(state, tx.signer)
    if node["status"] == schema.LEFT:
        rules.reject(Code.INVALID_LIFECYCLE, f"node {tx.signer} has already left")
    left = {**node, "status": schema.LEFT, "status_height": state.block_height}
    state.put(schema.NODE, tx.signer, left)
    update_pool(state, tx.signer, left)
    release_relay(state, tx.signer)
    state.emit("planet.node", node=tx.signer, status=schema.LEFT)


def move_shards(state: State, tx: SignedTx) -> None:
    """A compute node now serves `body.shards` of its model at `body.endpoint`."""
    body: MoveShards = tx.body
    node = rules.compute_node(state, tx.signer)
    if list(body.shards) == node["shards"] and body.endpoint == node["endpoint"]:
        rules.reject(Code.MOVE_UNCHANGED, f"node {tx.signer} already serves {list(body.shards)}")
    count = state.genesis.models.get(node["model"])
    if count is not None and body.shards[-1] >= count:
        rules.reject(
            Code.MOVE_SHARD_UNKNOWN,
            f"model {node['model']} has shards 0..{count - 1}, not {body.shards[-1]}",
        )
    height = state.block_height
    moved = node.get("moved_height")
    if moved is not None and height - int(moved) < MOVE_COOLDOWN_BLOCKS:
        rules.reject(
            Code.MOVE_TOO_SOON,
            f"node {tx.signer} moved at height {moved}; the next move from height "
            f"{int(moved) + MOVE_COOLDOWN_BLOCKS}",
        )
    _carry_prices(state, tx.signer, node["shards"], list(body.shards))
    state.put(
        schema.NODE,
        tx.signer,
        {**node, "shards": list(body.shards), "endpoint": body.endpoint, "moved_height": height},
    )
    state.emit("planet.node", node=tx.signer, status=node["status"], moved="1")


def _carry_prices(state: State, key: str, old: list[int], new: list[int]) -> None:
    """A move from one shard to one other carries the node's price record (its schedule) along,
    so clients never see it routable on the new shard without a price; otherwise the prices on
    the shards it left go."""
    records = {}
    for shard in old:
        if shard not in new:
            record = state.get(schema.PRICE, schema.price_key(key, shard))
            left_shards.note(state, key, shard, record)  # its credits there stay redeemable
            if record is not None:
                records[shard] = record
                state.delete(schema.PRICE, schema.price_key(key, shard))
    target = schema.price_key(key, new[0])
    if len(old) == len(new) == 1 and old[0] in records and state.get(schema.PRICE, target) is None:
        state.put(schema.PRICE, target, records[old[0]])


def attest_stake(state: State, tx: SignedTx) -> None:
    """A validator's attestation; the agreed amount is the one attested by ≥ 2/3 of the power."""
    body: AttestStake = tx.body
    validator = rules.validator(state, tx.signer)
    node = rules.registered_node(state, body.node)
    record = state.get(schema.STAKE, body.node) or {
        "attestations": {},
        "agreed": None,
        "height": 0,
    }
    attestations = {**record["attestations"], validator["address"]: str(body.amount)}
    power_by_amount: dict[str, int] = {}
    for address, amount in attestations.items():
        power = state.by_address[address]["power"]
        power_by_amount[amount] = power_by_amount.get(amount, 0) + power
    agreed, height = record["agreed"], record["height"]
    for amount in sorted(power_by_amount, key=int):
        if state.has_two_thirds(power_by_amount[amount]) and amount != agreed:
            agreed, height = amount, state.block_height
            state.emit("planet.stake", node=body.node, amount=amount)
    state.put(
        schema.STAKE,
        body.node,
        {"attestations": attestations, "agreed": agreed, "height": height},
    )
    if agreed != record["agreed"] and not is_staked(state, node, body.node):
        schedule_registration_check(state, body.node, state.block_height)
    update_pool(state, body.node, node)


# --- the staked pools (/pool_health, the epoch draw) ----------------------------------------------


def update_pool(state: State, node_key: str, node: dict[str, Any]) -> None:
    """Keep `pool/<model>/<node_key>` exactly for a compute node that is staked and has not
    left (`node`: its record as this block leaves it). Free registrations never enter it, so
    what /pool_health reads grows with stake, not with what strangers register. Only a
    member may `commit` (commitments.py), and an epoch close judges the cover entries of the
    members and of the nodes that left the pools since the last close (coverage.py `close`)."""
    member = (
        node["role"] == "compute"
        and node["status"] != schema.LEFT
        and is_staked(state, node, node_key)
    )
    entry = schema.pool_key(str(node["model"]), node_key)
    listed = state.get(schema.POOL, entry) is not None
    if member and not listed:
        state.put(schema.POOL, entry, 1)
    elif listed and not member:
        state.delete(schema.POOL, entry)
        coverage.left_pool(state, node_key)  # its close still settles what it committed


def staked_serving(state: State) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of the SERVING compute nodes of the staked pools (`pool/<model>/<key>`,
    `update_pool`: the compute nodes whose agreed stake reaches `min_stake.compute` and that
    have not left), in key order, as the current block sees them: what the epoch boundary
    draws its challenges from (epochs.py) and counts routable nodes in (settlement.py). Reads
    one pool row and one node record per staked node, nothing of a free registration:
    registering and heartbeating cost nothing, so the boundary's reads grow with stake, and a
    stranger's free nodes never enter the draw."""
    keys = {entry.rsplit("/", 1)[1] for entry in state.keys(schema.POOL)}
    out = []
    for key in sorted(keys):
        node = state.get(schema.NODE, key)
        if node is not None and node["status"] == schema.SERVING and node["role"] == "compute":
            out.append((key, node))
    return out


# --- heartbeat timeouts -------------------------------------------------------------------------


def schedule_heartbeat_check(state: State, node_key: str, last_heartbeat: int) -> None:
    """Re-check `node_key` at the first height where it would be overdue."""
    due = str(last_heartbeat + state.genesis.heartbeat_timeout + 1)
    pending = state.get(schema.HEARTBEAT_DUE, due) or []
    if node_key not in pending:
        state.put(schema.HEARTBEAT_DUE, due, sorted([*pending, node_key]))


def last_alive(node: dict[str, Any]) -> int:
    """The last height the node showed it was alive: its heartbeat or evidence of service
    (`last_served`, set by liveness.py; absent until the first)."""
    return max(int(node["last_heartbeat"]), int(node.get("last_served", 0)))


def expire_heartbeats(state: State, height: int) -> None:
    """EndBlock: the nodes due at `height` that showed no sign of life since become DOWN."""
    due = state.get(schema.HEARTBEAT_DUE, str(height))
    if due is None:
        return
    timeout = state.genesis.heartbeat_timeout
    for key in due:
        node = state.get(schema.NODE, key)
        if (
            node
            and node["status"] in (schema.JOIN, schema.SERVING)
            and last_alive(node) + timeout < height
        ):
            state.put(schema.NODE, key, {**node, "status": schema.DOWN, "status_height": height})
            state.emit("planet.node", node=key, status=schema.DOWN)
    state.delete(schema.HEARTBEAT_DUE, str(height))


# --- unstaked registrations ---------------------------------------------------------------------


def schedule_registration_check(state: State, node_key: str, height: int) -> None:
    due = str(height + state.genesis.registration_ttl)
    pending = state.get(schema.REGISTRATION_DUE, due) or []
    if node_key not in pending:
        state.put(schema.REGISTRATION_DUE, due, sorted([*pending, node_key]))


def is_staked(state: State, node: dict[str, object], node_key: str) -> bool:
    stake = state.get(schema.STAKE, node_key)
    agreed = stake["agreed"] if stake else None
    minimum = state.genesis.min_stake.get(str(node["role"]), 0)
    return agreed is not None and int(agreed) >= minimum


def delete_node(state: State, node_key: str, node: dict[str, object]) -> None:
    entry = schema.pool_key(str(node["model"]), node_key)
    if state.get(schema.POOL, entry) is not None:
        state.delete(schema.POOL, entry)
    coverage.forget(state, node_key)  # no close reads an expired node's entries again
    for ns in NODE_NAMESPACES:
        if state.get(ns, node_key) is not None:
            state.delete(ns, node_key)
    evm = str(node["evm_address"]).lower()
    if state.get(schema.EVM_BINDING, evm) == node_key:
        state.delete(schema.EVM_BINDING, evm)
    prices.forget(state, node_key)
    release_relay(state, node_key)


def release_relay(state: State, key: str) -> None:
    """A relay that leaves or expires leaves the relay list, and frees its endpoint and X25519
    key for another relay; nothing for other roles."""
    relay = state.get(schema.RELAY, key)
    if relay is None:
        return
    state.delete(schema.RELAY, key)
    if state.get(schema.RELAY_BY_KEY, relay["relay_key"]) == key:
        state.delete(schema.RELAY_BY_KEY, relay["relay_key"])
    if state.get(schema.RELAY_BY_URL, relay["endpoint"]) == key:
        state.delete(schema.RELAY_BY_URL, relay["endpoint"])


def expire_registrations(state: State, height: int) -> None:
    """EndBlock: delete the nodes due at `height` that are still not staked."""
    due = state.get(schema.REGISTRATION_DUE, str(height))
    if due is None:
        return
    ttl = state.genesis.registration_ttl
    for key in due:
        node = state.get(schema.NODE, key)
        if node is None or height < node["registered_height"] + ttl:
            continue
        if not is_staked(state, node, key):
            delete_node(state, key, node)
            state.emit("planet.node", node=key, status=schema.EXPIRED)
    state.delete(schema.REGISTRATION_DUE, str(height))
