"""Who may lock or redeem a credit: the party its holder assigned it to (issue 42, attack 4
follow-up; docs/credits.md "Who may lock or redeem a credit"; `protocol.committee.credit_holder`).

A holder-bound credit's nonce is its holder's Ed25519 key; the buyer gives it to a party by
signing an assignment with it. The chain checks, for every credit of a `credit_lock`,
`credit_redeem` or `relay_redeem` that carries assignments, that the holder key (the lock's row,
or the redeemed credit's nonce) signed an assignment to the tx's own party:

    credit_lock, credit_redeem   a node: its committee key (the tx signer), the tx's model, shard
    relay_redeem                 a relay: its registered X25519 key (`relay/<signer>`)

else CREDIT_NOT_ASSIGNED naming the item. A lock or redemption copied out of the mempool by
another party names that other party and is refused, whoever lands first. On a chain whose
genesis sets `credits.holder_bound`, a lock or redemption without assignments is refused
CREDIT_NOT_ASSIGNED too (the form of before: anyone could lock a spent id seen in the mempool);
without it, such txs are taken as before and assignments given are checked all the same.

Deterministic: libsodium's Ed25519 verification over bytes the tx fixes.
"""

from __future__ import annotations

from collections.abc import Sequence

from abci_app import rules
from abci_app.codes import Code
from abci_app.state import State
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import assigned, node_party, relay_party
from protocol.committee.credit_locks import CreditLock


def refusal_of_lock(state: State, signer: str, body: CreditLock) -> str | None:
    """Why a lock by `signer` is refused CREDIT_NOT_ASSIGNED, naming the item; or None."""
    if not body.assignments:
        if state.genesis.credit_holder_bound:
            return "credit 0: no holder's assignment (this chain binds credits to their holders)"
        return None
    party = node_party(bytes.fromhex(signer), body.model, body.shard)
    for index, (holder, assignment) in enumerate(body.assignments):
        if not assigned(holder, party, assignment):
            return (
                f"credit {index}: its holder did not assign it to node {signer} on "
                f"{body.model} shard {body.shard}"
            )
    return None


def check_lock(state: State, signer: str, body: CreditLock) -> None:
    """CREDIT_NOT_ASSIGNED unless every credit of the lock is assigned to `signer`."""
    refused = refusal_of_lock(state, signer, body)
    if refused is not None:
        rules.reject(Code.CREDIT_NOT_ASSIGNED, refused)


def check_node_redemption(
    state: State,
    signer: str,
    model: str,
    shard: int,
    credits: Sequence[ThresholdCredit],
    assignments: Sequence[bytes],
) -> None:
    """CREDIT_NOT_ASSIGNED unless each credit's holder assigned it to node `signer` on
    (model, shard)."""
    party = node_party(bytes.fromhex(signer), model, shard)
    _check_redemption(state, credits, assignments, party, f"node {signer} on {model} shard {shard}")


def check_relay_redemption(
    state: State,
    relay_key: str,
    credits: Sequence[ThresholdCredit],
    assignments: Sequence[bytes],
) -> None:
    """CREDIT_NOT_ASSIGNED unless each credit's holder assigned it to the relay of the
    registered X25519 key `relay_key`."""
    party = relay_party(bytes.fromhex(relay_key))
    _check_redemption(state, credits, assignments, party, f"relay {relay_key}")


def _check_redemption(
    state: State,
    credits: Sequence[ThresholdCredit],
    assignments: Sequence[bytes],
    party: bytes,
    who: str,
) -> None:
    if not assignments:
        if state.genesis.credit_holder_bound:
            rules.reject(
                Code.CREDIT_NOT_ASSIGNED,
                "credit 0: no holder's assignment (this chain binds credits to their holders)",
            )
        return
    for index, (credit, assignment) in enumerate(zip(credits, assignments, strict=True)):
        if not assigned(credit.nonce, party, assignment):
            rules.reject(
                Code.CREDIT_NOT_ASSIGNED,
                f"credit {index}: its holder did not assign it to {who}",
            )
