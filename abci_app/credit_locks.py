"""Credit locks: a credit pays one node, once, and the node knows it before it serves (issue 42,
attack 4; docs/credits.md "One credit pays one node").

    credit_lock{model, shard, locks: [[holder, credit epoch, assignment], ...]
                                     (or [[spent id, credit epoch], ...])}
                               a compute node, not LEFT, on a (model, shard) it registered or moved
                               away from within the credits' window (left_shards.py; REDEEM_SHARD
                               otherwise), each credit assigned to it on (model, shard) by its
                               holder (CREDIT_NOT_ASSIGNED: credit_holders.py), claims credits
                               it was paid with: each of an epoch e with e ≤ current ≤ e +
                               genesis `credits.lifetime_epochs` (CREDIT_EPOCH); not redeemed
                               (CREDIT_SPENT); not locked by another node (CREDIT_LOCKED). One
                               the node locked already is left as it is (a lock sent again after
                               a lost answer). → `clock/<spent id>` = {node, height, epoch},
                               pruned with epoch e + lifetime, like `cspent/`: a lock lasts as
                               long as its credit can be redeemed. The new locks bought
                               positions of the node on the shard (coverage.py `record_bought`:
                               what its commitments must cover), and the tx counts the node
                               alive (liveness.py).

The first lock of a spent id in block order wins: FinalizeBlock runs txs one by one, so of two
nodes' locks in one block the earlier tx writes the entry and the later one is refused
CREDIT_LOCKED, whatever their nodes, sizes or fees. The whole tx is refused on any failing item
(nothing written); the refusal names the item (`credit <index>:`) so the node drops that credit
and sends the rest again. CheckTx refuses, from the committed state, a lock of a credit already
locked by another node or redeemed (`admit_lock`), so a contested credit is named to the node
at once, without waiting for a block.

A redemption of a credit locked by another node is CREDIT_LOCKED (`check_redeemer`, called by
`credits.redeem`); a credit nobody locked is redeemed as before (the redemption is its lock and its
spend at once, and adds to `bought` like a lock: coverage.py rule 5). The lock holds no credit and
no signature: the spent id is a hash of the credit's secret nonce, and the node proves it holds the
credit when it redeems it.

/credit_lock  ?id    {id, node, height, epoch, spent, committed_height}: who locked the credit
                     of that spent id, when (null fields when nobody did), the height that
                     redeemed it (or null), and the latest committed height
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from abci_app import coverage, credit_holders, left_shards, rules, schema
from abci_app.codes import Code
from abci_app.query_params import QueryError, str_param
from abci_app.state import State
from protocol.committee.credit_locks import SPENT_ID, CreditLock
from protocol.committee.envelope import SignedTx
from protocol.credits import redeemable


def credit_lock(state: State, tx: SignedTx) -> None:
    body: CreditLock = tx.body
    genesis = state.genesis
    if genesis.credit_price_wei is None or not (genesis.escrow_address and genesis.evm_chain_id):
        rules.reject(Code.CREDITS_DISABLED, "genesis has no credits section or no escrow")
    node = rules.compute_node(state, tx.signer)
    left_shards.check(state, tx.signer, node, body.model, body.shard)  # REDEEM_SHARD
    credit_holders.check_lock(state, tx.signer, body)  # CREDIT_NOT_ASSIGNED
    current = rules.epoch_of(state, state.block_height)
    lifetime = genesis.credit_lifetime_epochs
    fresh: list[tuple[str, int]] = []
    for index, (identifier, epoch) in enumerate(body.locks):
        where = f"credit {index}"
        if not redeemable(epoch, current, lifetime):
            rules.reject(
                Code.CREDIT_EPOCH,
                f"{where}: a credit of epoch {epoch} is not redeemable in epoch {current}",
            )
        spent = state.get(schema.CREDIT_SPENT, identifier)
        if spent is not None:
            rules.reject(Code.CREDIT_SPENT, f"{where}: redeemed at height {spent}")
        lock = state.get(schema.CREDIT_LOCK, identifier)
        if lock is None:
            fresh.append((identifier, epoch))
        elif lock["node"] != tx.signer:
            rules.reject(
                Code.CREDIT_LOCKED,
                f"{where}: locked by node {lock['node']} at height {lock['height']}",
            )
    for identifier, epoch in fresh:
        state.put(
            schema.CREDIT_LOCK,
            identifier,
            {"node": tx.signer, "height": state.block_height, "epoch": epoch},
        )
        rules.track_at(state, schema.CREDIT_LOCK, identifier, epoch + lifetime)
    coverage.record_bought(state, tx.signer, body.shard, len(fresh))
    state.emit("planet.credit_lock", node=tx.signer, locked=len(fresh))


def check_redeemer(state: State, identifier: str, redeemer: str, where: str) -> None:
    """CREDIT_LOCKED when another node than `redeemer` locked the credit of `identifier`."""
    lock = state.get(schema.CREDIT_LOCK, identifier)
    if lock is not None and lock["node"] != redeemer:
        rules.reject(
            Code.CREDIT_LOCKED,
            f"{where}: locked by node {lock['node']} at height {lock['height']}",
        )


def admit_lock(state: State, signer: str, body: CreditLock) -> tuple[Code, str] | None:
    """Mempool admission (CheckTx, committed state only): the code and reason a lock would be
    refused for a credit already redeemed or locked by another node, naming the item; or None.
    FinalizeBlock decides; this names a contested credit to the node without a block's wait,
    and keeps a lock copied from another node (CREDIT_NOT_ASSIGNED) out of blocks."""
    refused = credit_holders.refusal_of_lock(state, signer, body)
    if refused is not None:
        return Code.CREDIT_NOT_ASSIGNED, refused
    for index, (identifier, _) in enumerate(body.locks):
        spent = state.committed(schema.CREDIT_SPENT, identifier)
        if spent is not None:
            return Code.CREDIT_SPENT, f"credit {index}: redeemed at height {spent}"
        lock = state.committed(schema.CREDIT_LOCK, identifier)
        if lock is not None and lock["node"] != signer:
            return (
                Code.CREDIT_LOCKED,
                f"credit {index}: locked by node {lock['node']} at height {lock['height']}",
            )
    return None


def _credit_lock(state: State, params: dict[str, Any]) -> Any:
    identifier = str_param(params, "id", SPENT_ID)
    if identifier is None:
        raise QueryError(Code.BAD_QUERY, "id (64 lowercase hex, a credit's spent id) is required")
    lock = state.committed(schema.CREDIT_LOCK, identifier) or {}
    return {
        "id": identifier,
        "node": lock.get("node"),
        "height": lock.get("height"),
        "epoch": lock.get("epoch"),
        "spent": state.committed(schema.CREDIT_SPENT, identifier),
        "committed_height": state.height,
    }


LOCK_ROUTES: dict[str, Callable[[State, dict[str, Any]], Any]] = {"/credit_lock": _credit_lock}
