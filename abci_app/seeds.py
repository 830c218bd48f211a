"""Verifier seeds: commit before the epoch, reveal after it (`seed_commit`, `seed_reveal`).

A validator's verifier derives its challenge prompts of epoch e from a secret 32-byte seed.
So that nobody can predict them from public chain data, and so that the verifier cannot pick
its prompts after seeing who serves, it commits first and opens the seed once e has closed:

    seed_commit{epoch e, commitment}   signer: a validator; e > the block's epoch and
                                       e <= block's epoch + 2; one per (validator, e)
    seed_reveal{epoch e, seed}         signer: the committing validator; e < the block's
                                       epoch; commitment == seed_commitment(signer, e, seed)

Record `seed/<e, 12 digits>/<signer>` = {epoch, validator (address), commitment, height,
seed (null until revealed), revealed_height}; indexed for pruning like commitments
(`retention.track`). Codes: NOT_VALIDATOR 14, SEED_NOT_IN_FUTURE 30, DUPLICATE_SEED 31,
UNKNOWN_SEED 32, SEED_NOT_CLOSED 33, SEED_MISMATCH 34, ALREADY_REVEALED 18. Query `/seeds?epoch=`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from abci_app import retention
from abci_app.codes import Code, Rejected
from protocol.committee import SeedCommit, SeedReveal, SignedTx, seed_commitment

if TYPE_CHECKING:
    from abci_app.state import State

NS = "seed"
MAX_AHEAD = 2  # a commitment may name at most the epoch after next


def key(epoch: int, signer: str) -> str:
    return f"{epoch:012d}/{signer}"


def _validator(state: State, signer: str) -> dict[str, Any]:
    validator = state.validator_by_signer(signer)
    if validator is None:
        raise Rejected(Code.NOT_VALIDATOR, f"signer {signer} is not a validator")
    return validator


def seed_commit(state: State, tx: SignedTx) -> None:
    body: SeedCommit = tx.body
    validator = _validator(state, tx.signer)
    current = retention.epoch_of(state, state.block_height)
    if not current < body.epoch <= current + MAX_AHEAD:
        raise Rejected(
            Code.SEED_NOT_IN_FUTURE,
            f"a seed for epoch {body.epoch} must be committed during epochs "
            f"{body.epoch - MAX_AHEAD} … {body.epoch - 1} (this block is in epoch {current})",
        )
    entry = key(body.epoch, tx.signer)
    if state.get(NS, entry) is not None:
        raise Rejected(Code.DUPLICATE_SEED, f"a seed for epoch {body.epoch} is already committed")
    state.put(
        NS,
        entry,
        {
            "epoch": body.epoch,
            "validator": validator["address"],
            "commitment": body.commitment,
            "height": state.block_height,
            "seed": None,
            "revealed_height": None,
        },
    )
    retention.track(state, NS, entry)


def seed_reveal(state: State, tx: SignedTx) -> None:
    body: SeedReveal = tx.body
    _validator(state, tx.signer)
    entry = key(body.epoch, tx.signer)
    record = state.get(NS, entry)
    if record is None:
        raise Rejected(Code.UNKNOWN_SEED, f"no seed committed for epoch {body.epoch}")
    current = retention.epoch_of(state, state.block_height)
    if body.epoch >= current:
        raise Rejected(
            Code.SEED_NOT_CLOSED, f"epoch {body.epoch} has not closed (this is epoch {current})"
        )
    if record["seed"] is not None:
        raise Rejected(Code.ALREADY_REVEALED, f"the seed of epoch {body.epoch} is revealed")
    if seed_commitment(tx.signer, body.epoch, bytes.fromhex(body.seed[2:])) != record["commitment"]:
        raise Rejected(Code.SEED_MISMATCH, "the seed does not open the commitment")
    state.put(NS, entry, {**record, "seed": body.seed, "revealed_height": state.block_height})
    state.emit("planet.seed", epoch=body.epoch, validator=record["validator"])


def seeds_of_epoch(state: State, epoch: int) -> list[dict[str, Any]]:
    """Committed records of `epoch` (query side: committed state only)."""
    prefix = f"{epoch:012d}/"
    return [
        {"signer": k[len(prefix) :], **v}
        for k, v in state.committed_items(NS, prefix, f"{epoch:012d}0")
    ]
