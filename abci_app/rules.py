"""What every state rule shares: who may sign, the epoch of a height, the pruning index.

The feature modules (registry, commitments, verdicts, seeds, spot_reports, settlement, epochs,
retention) import this module, `schema` and `state`, and never each other.

    reject(code, message)       refuse the tx (`Rejected`; nothing it wrote is kept)
    registered_node / compute_node / staked_compute_node / validator
                                the signer checks, each with its named code
    epoch_of(state, height)     heights (e−1)·L+1 … e·L are epoch e (L = genesis epoch_length)
    track / track_many          index records for pruning once their epoch is settled
    track_at                    … once a given (later) epoch is settled
    track_until                 index a record for deletion once block time passes a moment
    add_vote                    a validator's signed vote on a verdict or payout statement
"""

from __future__ import annotations

from typing import Any, NoReturn

from abci_app import schema
from abci_app.codes import Code, Rejected
from abci_app.state import State


def reject(code: Code, message: str) -> NoReturn:
    raise Rejected(code, message)


def registered_node(state: State, key: str) -> dict[str, Any]:
    node = state.get(schema.NODE, key)
    if node is None:
        reject(Code.UNKNOWN_NODE, f"node {key} is not registered")
    return node


def compute_node(state: State, key: str) -> dict[str, Any]:
    """A registered compute node that has not left."""
    node = registered_node(state, key)
    if node["role"] != "compute":
        reject(Code.WRONG_ROLE, f"node {key} has role {node['role']}, not compute")
    if node["status"] == schema.LEFT:
        reject(Code.INVALID_LIFECYCLE, f"node {key} has left")
    return node


def staked_compute_node(state: State, key: str) -> dict[str, Any]:
    """A compute node of the staked pools (`pool/<model>/<key>`, registry.py `update_pool`:
    agreed stake ≥ min_stake.compute, not left), as this tx sees them: NOT_STAKED otherwise."""
    node = compute_node(state, key)
    if state.get(schema.POOL, schema.pool_key(str(node["model"]), key)) is None:
        reject(
            Code.NOT_STAKED,
            f"node {key} is not staked (agreed stake below min_stake.compute): "
            "only staked nodes commit",
        )
    return node


def validator(state: State, signer: str) -> dict[str, Any]:
    """The validator record of `signer` (a consensus key)."""
    record = state.validator_by_signer(signer)
    if record is None:
        reject(Code.NOT_VALIDATOR, f"signer {signer} is not a validator")
    return record


def epoch_of(state: State, height: int) -> int:
    """The epoch a block height belongs to (heights (e−1)·L+1 … e·L are epoch e)."""
    return max(1, (height - 1) // state.genesis.epoch_length + 1)


def track(state: State, ns: str, key: str) -> None:
    """Index a newly written record for pruning once the current epoch is settled."""
    epoch = epoch_of(state, state.block_height)
    state.put(schema.PRUNE_INDEX, schema.prune_key(epoch, ns, key), 0)


def track_many(state: State, ns: str, keys: list[str]) -> None:
    """`track` for many records written by one tx (the epoch computed once)."""
    epoch = epoch_of(state, state.block_height)
    for key in keys:
        state.put(schema.PRUNE_INDEX, schema.prune_key(epoch, ns, key), 0)


def track_at(state: State, ns: str, key: str, epoch: int) -> None:
    """Index a record for pruning once `epoch` (or the current one, if later) is settled."""
    epoch = max(epoch, epoch_of(state, state.block_height))
    state.put(schema.PRUNE_INDEX, schema.prune_key(epoch, ns, key), 0)


def add_vote(
    state: State, record: dict[str, Any], validator: dict[str, Any], operator: str, signature: str
) -> dict[str, Any]:
    """`record` (a verdict or a payout statement) with the validator's operator signature and
    power added, `confirmed` (and `confirmed_height`) once the power reaches 2/3."""
    votes = {
        **record["votes"],
        validator["address"]: {"operator": operator, "signature": signature},
    }
    power = record["power"] + validator["power"]
    updated = {**record, "votes": votes, "power": power}
    if not record["confirmed"] and state.has_two_thirds(power):
        updated["confirmed"] = True
        updated["confirmed_height"] = state.block_height
    return updated


def track_until(state: State, ns: str, key: str, until: int) -> None:
    """Index a record to delete once a block's time is past `until` (unix seconds)."""
    state.put(schema.EXPIRY_INDEX, schema.expiry_key(until, ns, key), 0)
