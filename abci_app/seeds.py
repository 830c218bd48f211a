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
(`rules.track`). Codes: NOT_VALIDATOR 14, SEED_NOT_IN_FUTURE 24, DUPLICATE_SEED 25,
UNKNOWN_SEED 26, SEED_NOT_CLOSED 27, SEED_MISMATCH 28, ALREADY_REVEALED 18. Query `/seeds?epoch=`.
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import SeedCommit, SeedReveal, seed_commitment

MAX_AHEAD = 2  # a commitment may name at most the epoch after next


def seed_commit(state: State, tx: SignedTx) -> None:
    body: SeedCommit = tx.body
    validator = rules.validator(state, tx.signer)
    current = rules.epoch_of(state, state.block_height)
    if not current < body.epoch <= current + MAX_AHEAD:
        rules.reject(
            Code.SEED_NOT_IN_FUTURE,
            f"a seed for epoch {body.epoch} must be committed during epochs "
            f"{body.epoch - MAX_AHEAD} … {body.epoch - 1} (this block is in epoch {current})",
        )
    entry = schema.in_epoch(body.epoch, tx.signer)
    if state.get(schema.SEED, entry) is not None:
        rules.reject(Code.DUPLICATE_SEED, f"a seed for epoch {body.epoch} is already committed")
    state.put(
        schema.SEED,
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
    rules.track(state, schema.SEED, entry)


def seed_reveal(state: State, tx: SignedTx) -> None:
    body: SeedReveal = tx.body
    rules.validator(state, tx.signer)
    entry = schema.in_epoch(body.epoch, tx.signer)
    record = state.get(schema.SEED, entry)
    if record is None:
        rules.reject(Code.UNKNOWN_SEED, f"no seed committed for epoch {body.epoch}")
    current = rules.epoch_of(state, state.block_height)
    if body.epoch >= current:
        rules.reject(
            Code.SEED_NOT_CLOSED, f"epoch {body.epoch} has not closed (this is epoch {current})"
        )
    if record["seed"] is not None:
        rules.reject(Code.ALREADY_REVEALED, f"the seed of epoch {body.epoch} is revealed")
    if seed_commitment(tx.signer, body.epoch, bytes.fromhex(body.seed[2:])) != record["commitment"]:
        rules.reject(Code.SEED_MISMATCH, "the seed does not open the commitment")
    state.put(
        schema.SEED, entry, {**record, "seed": body.seed, "revealed_height": state.block_height}
    )
    state.emit("planet.seed", epoch=body.epoch, validator=record["validator"])
