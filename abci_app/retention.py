"""What the chain forgets, and when: state costs its writer (deterministic, height-driven).

Three rules, all scheduled by height or epoch (never a scan of all entries):

1. **Unstaked registrations expire.** Each registration schedules a check at
   `registered_height + registration_ttl` (`regdue/<height>`, genesis `registration_ttl`,
   default 100 blocks); an `attest_stake` that moves the agreed amount below `min_stake[role]`
   schedules one at `height + registration_ttl`. At a check the node is deleted when it is
   still not staked (agreed < min_stake of its role) and at least `registration_ttl` blocks
   old: `node/`, `evm/`, `rep/`, `stake/`, `acct/` entries of that key go.
2. **Settled records are pruned.** Every new commitment, evidence record (and the other
   records their features index: seeds, spot-check reports, settled queries, payouts) gets
   an index entry `gc/<epoch, 12 digits>/<ns>/<key>` for the epoch of the block that wrote it.
   Epoch e is *settled* once it has closed and the next block applied its reputation; its
   records stay readable for `retention_epochs` more epochs (genesis, default 10) and are
   deleted from the first block of epoch e + retention_epochs + 1 on, at most
   `prune_per_block` records per block (genesis, default 10 000) in index order, so a backlog
   is drained over the following blocks.
4. **Time-bound records expire** (`track_until`): a record kept only until a unix time (a charged
   voucher's replay guard, until the voucher's expiry) gets `gcexp/<time, 20 digits>/<ns>/<key>`
   and is deleted by the first block whose header time is past it (`prune_expired`, at most
   `prune_per_block` per block). Block time is CometBFT's BFT time: the same on every node.
3. **Old epoch records go too:** closing epoch e (which writes `epoch/<e+1>`) deletes
   `epoch/<e-retention_epochs-1>`: the current record and the `retention_epochs + 1` before it
   stay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from abci_app.state import State

GC = "gc"
GC_EXPIRY = "gcexp"
NODE_NAMESPACES = ("node", "rep", "stake", "acct")


def epoch_of(state: State, height: int) -> int:
    """The epoch a block height belongs to (heights (e−1)·L+1 … e·L are epoch e)."""
    return max(1, (height - 1) // state.genesis.epoch_length + 1)


def track(state: State, ns: str, key: str) -> None:
    """Index a newly written record for pruning once the current epoch is settled."""
    epoch = epoch_of(state, state.block_height)
    state.put(GC, f"{epoch:012d}/{ns}/{key}", 0)


def track_many(state: State, ns: str, keys: list[str]) -> None:
    """`track` for many records written by one tx (the epoch computed once)."""
    epoch = epoch_of(state, state.block_height)
    for key in keys:
        state.put(GC, f"{epoch:012d}/{ns}/{key}", 0)


def schedule_registration_check(state: State, node_key: str, height: int) -> None:
    due = str(height + state.genesis.registration_ttl)
    pending = state.get("regdue", due) or []
    if node_key not in pending:
        state.put("regdue", due, sorted([*pending, node_key]))


def is_staked(state: State, node: dict[str, object], node_key: str) -> bool:
    stake = state.get("stake", node_key)
    agreed = stake["agreed"] if stake else None
    minimum = state.genesis.min_stake.get(str(node["role"]), 0)
    return agreed is not None and int(agreed) >= minimum


def delete_node(state: State, node_key: str, node: dict[str, object]) -> None:
    for ns in NODE_NAMESPACES:
        if state.get(ns, node_key) is not None:
            state.delete(ns, node_key)
    evm = str(node["evm_address"]).lower()
    if state.get("evm", evm) == node_key:
        state.delete("evm", evm)


def expire_registrations(state: State, height: int) -> None:
    due = state.get("regdue", str(height))
    if due is None:
        return
    ttl = state.genesis.registration_ttl
    for key in due:
        node = state.get("node", key)
        if node is None or height < node["registered_height"] + ttl:
            continue
        if not is_staked(state, node, key):
            delete_node(state, key, node)
            state.emit("planet.node", node=key, status="EXPIRED")
    state.delete("regdue", str(height))


def prune(state: State, height: int) -> None:
    """Delete up to `prune_per_block` records of settled epochs past their retention window."""
    prunable = epoch_of(state, height) - state.genesis.retention_epochs - 1
    if prunable < 1:
        return
    stop = f"{prunable + 1:012d}/"
    budget = state.genesis.prune_per_block
    for index_key, _ in state.committed_items(GC, "", stop):
        if budget == 0:
            break
        budget -= 1
        _, ns, key = index_key.split("/", 2)
        state.delete(GC, index_key)
        state.delete(ns, key)


def prune_epoch_record(state: State, following: int) -> None:
    """Called when epoch `following` is fixed: forget the record that left the window."""
    old = following - state.genesis.retention_epochs - 2
    if old >= 1:
        state.delete("epoch", str(old))


def track_until(state: State, ns: str, key: str, until: int) -> None:
    """Index a record to delete once a block's time is past `until` (unix seconds)."""
    state.put(GC_EXPIRY, f"{until:020d}/{ns}/{key}", 0)


def prune_expired(state: State, now: int) -> None:
    """Delete up to `prune_per_block` time-bound records whose time is before `now`."""
    budget = state.genesis.prune_per_block
    for index_key, _ in state.committed_items(GC_EXPIRY, "", f"{now:020d}"):
        if budget == 0:
            break
        budget -= 1
        _, ns, key = index_key.split("/", 2)
        state.delete(GC_EXPIRY, index_key)
        state.delete(ns, key)
