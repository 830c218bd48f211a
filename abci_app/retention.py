"""What the chain forgets, and when: indexed records are deleted once their time has passed.

Both rules are height- or time-driven and read only their index (never a scan of all entries);
records join an index when they are written (`rules.track`, `rules.track_until`). The other
ways state leaves: unstaked registrations expire (registry.py), old epoch records go when an
epoch closes (epochs.py).

1. **Settled records are pruned** (`prune`). Every new commitment and evidence record (and the
   seeds, spot-check reports and credits, settled queries and payout statements) gets an index
   entry `gc/<epoch, 12 digits>/<ns>/<key>` for the epoch of the block that wrote it. Epoch e is
   *settled* once it has closed and the next block applied its reputation; its records stay
   readable for `retention_epochs` more epochs (genesis, default 10) and are deleted from the
   first block of epoch e + retention_epochs + 1 on, at most `prune_per_block` records per
   block (genesis, default 10 000) in index order, so a backlog is drained over the following
   blocks.
2. **Time-bound records expire** (`prune_expired`): a record kept only until a unix time (a
   charged voucher's replay guard, until the voucher's expiry) has
   `gcexp/<time, 20 digits>/<ns>/<key>` and is deleted by the first block whose header time is
   past it, at most `prune_per_block` per block. Block time is CometBFT's BFT time: the same on
   every node.
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.state import State


def prune(state: State, height: int) -> None:
    """Delete up to `prune_per_block` records of settled epochs past their retention window."""
    prunable = rules.epoch_of(state, height) - state.genesis.retention_epochs - 1
    if prunable < 1:
        return
    stop = f"{schema.epoch_key(prunable + 1)}/"
    budget = state.genesis.prune_per_block
    for index_key, _ in state.committed_items(schema.PRUNE_INDEX, "", stop):
        if budget == 0:
            break
        budget -= 1
        _, ns, key = index_key.split("/", 2)
        state.delete(schema.PRUNE_INDEX, index_key)
        state.delete(ns, key)


def prune_expired(state: State, now: int) -> None:
    """Delete up to `prune_per_block` time-bound records whose time is before `now`."""
    budget = state.genesis.prune_per_block
    for index_key, _ in state.committed_items(schema.EXPIRY_INDEX, "", f"{now:020d}"):
        if budget == 0:
            break
        budget -= 1
        _, ns, key = index_key.split("/", 2)
        state.delete(schema.EXPIRY_INDEX, index_key)
        state.delete(ns, key)
