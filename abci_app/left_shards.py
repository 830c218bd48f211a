"""Shards a compute node moved away from stay redeemable on its credits for a while (issue 44).

A move (`move_shards`, registry.py) does not end what the node earned on the shard it left: the
clients it served there paid with credits it may not have redeemed yet (the agent redeems in
passes; the old process still answers the sessions it drains after the move, and is paid for
them). So the move writes, per shard left,

    leftshard/<node>/<shard, 5 digits>/<epoch, 20 digits> = {"price": its price record or None}

(the epoch of the move's block; the price record as it was on that shard, prices.py), and
`credit_lock` / `credit_redeem` on that shard are taken (not REDEEM_SHARD) while the current
epoch is at most that epoch + genesis `credits.lifetime_epochs` + 1: a credit the node was paid
there, before the move or while draining (a drain is far shorter than an epoch), has an issue
epoch at most the move's epoch + 1, so its own window ends by then. The redemption is held to
the price recorded here, and to the node's committed positions on that shard (coverage.py) as
any other. Each entry is pruned after its window (`rules.track_at`); a node that leaves one
shard twice has one entry per move, the latest read.
"""

from __future__ import annotations

from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State


def note(state: State, node: str, shard: int, price: dict[str, Any] | None) -> None:
    """`node` left `shard` in this block, where its price record was `price`."""
    epoch = rules.epoch_of(state, state.block_height)
    key = schema.left_shard_key(node, shard, epoch)
    state.put(schema.LEFT_SHARD, key, {"price": price})
    rules.track_at(state, schema.LEFT_SHARD, key, epoch + state.genesis.credit_lifetime_epochs + 1)


def latest(state: State, node: str, shard: int) -> tuple[int, dict[str, Any]] | None:
    """(epoch, entry) of the node's latest move away from `shard` still in its window."""
    prefix = schema.left_shard_key(node, shard, 0)[:-20]
    entries = state.items(schema.LEFT_SHARD, prefix, prefix[:-1] + "0")
    if not entries:
        return None
    key, entry = entries[-1]
    epoch = int(key.rsplit("/", 1)[1])
    current = rules.epoch_of(state, state.block_height)
    if current > epoch + state.genesis.credit_lifetime_epochs + 1:
        return None
    return epoch, entry


def check(state: State, signer: str, node: dict[str, Any], model: str, shard: int) -> None:
    """A credit tx on (`model`, `shard`) by `signer`: a shard it serves, or one it left within
    the window; REDEEM_SHARD otherwise."""
    if model == node["model"] and (shard in node["shards"] or latest(state, signer, shard)):
        return
    rules.reject(Code.REDEEM_SHARD, f"shard {shard} of {model} is not registered by this node")


def price_record(state: State, node: str, shard: int) -> dict[str, Any] | None:
    """The node's price record on a shard it left (within the window), else None."""
    found = latest(state, node, shard)
    return found[1]["price"] if found is not None else None
