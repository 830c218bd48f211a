"""Verdicts: validators' EIP-712 votes that a node cheated, and the verifiers' track record.

`verdict_vote` (a validator): its operator key's signature over `Verdict(node, offence,
evidenceHash, challenger, nonce, consumer = genesis fraud_proofs_address)` in the committee
domain of genesis `evm`. `verdict/<id>` (id = 0x struct hash) accumulates `votes` and `power`;
`confirmed` at ≥ 2/3 of the power, which also marks the accused account `slashed/<epoch>/<account>`
(it earns nothing that epoch: settlement.py). Codes: NOT_VALIDATOR, VERDICTS_DISABLED,
BAD_VERDICT_SIGNATURE, DUPLICATE_VOTE.

A vote is an accusation: when the verdict it supports is not confirmed by the end of the epoch
AFTER the one of its first vote, it is *refused* and every validator that voted for it gets one
`refused` mark; a confirmed verdict gives its voters one `confirmed` mark. Deterministic and
height-driven:

- the first vote of a verdict in epoch e adds its id to `vdue/<e+1>` (a list);
- EndBlock of the last height of epoch d settles `vdue/<d>` (`settle_accusations`): the verdict
  record gets `settled: "confirmed" | "refused"`, each voter's `vrep/<validator address>` =
  {confirmed, refused, last_epoch} is counted, then `vdue/<d>` is deleted.

Query `/verifiers`. What a refused mark costs beyond the record (reputation-weighted votes,
slashing a colluding verifier) is for the settlement rules to decide; the record is the chain's
memory of who accused wrongly.
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import VerdictVote
from protocol.eip712 import Verdict, committee_domain, recover_digest
from protocol.errors import ProtocolError


def verdict_vote(state: State, tx: SignedTx) -> None:
    body: VerdictVote = tx.body
    validator = rules.validator(state, tx.signer)
    genesis = state.genesis
    if (
        genesis.committee_address is None
        or genesis.evm_chain_id is None
        or genesis.fraud_proofs_address is None
    ):
        rules.reject(
            Code.VERDICTS_DISABLED,
            "genesis has no evm {chain_id, committee_address, fraud_proofs_address}",
        )
    operator = validator.get("operator")
    if not operator:
        rules.reject(
            Code.BAD_VERDICT_SIGNATURE, f"validator {validator['address']} has no operator address"
        )
    try:
        verdict = Verdict(
            node=body.node,
            offence=body.offence,
            evidence_hash=bytes.fromhex(body.evidence_hash[2:]),
            challenger=body.challenger,
            nonce=body.verdict_nonce,
            consumer=genesis.fraud_proofs_address,
        )
        domain = committee_domain(genesis.evm_chain_id, genesis.committee_address)
        recovered = recover_digest(verdict.digest(domain), bytes.fromhex(body.signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.BAD_VERDICT_SIGNATURE, error.message)
    if recovered.lower() != operator.lower():
        rules.reject(
            Code.BAD_VERDICT_SIGNATURE, f"signature recovers {recovered}, not operator {operator}"
        )
    ident = "0x" + verdict.struct_hash().hex()
    record = state.get(schema.VERDICT, ident) or {
        "id": ident,
        "node": verdict.node,
        "offence": verdict.offence,
        "evidence_hash": body.evidence_hash,
        "challenger": verdict.challenger,
        "nonce": verdict.nonce,
        "votes": {},
        "power": 0,
        "confirmed": False,
        "confirmed_height": None,
        "first_height": state.block_height,
    }
    if validator["address"] in record["votes"]:
        rules.reject(
            Code.DUPLICATE_VOTE, f"validator {validator['address']} already voted on {ident}"
        )
    updated = rules.add_vote(state, record, validator, operator, body.signature)
    if not record["votes"]:
        _settle_after_next_epoch(state, ident)
    if updated["confirmed"] and not record["confirmed"]:
        state.emit("planet.verdict", id=ident, confirmed="true")
        epoch = rules.epoch_of(state, state.block_height)
        state.put(schema.SLASHED, schema.in_epoch(epoch, verdict.node.lower()), 1)
    state.put(schema.VERDICT, ident, updated)


def _settle_after_next_epoch(state: State, verdict_id: str) -> None:
    """A verdict's first vote: its accusation is settled when the next epoch closes."""
    deadline = schema.epoch_key(rules.epoch_of(state, state.block_height) + 1)
    pending = state.get(schema.VERDICT_DUE, deadline) or []
    if verdict_id not in pending:
        state.put(schema.VERDICT_DUE, deadline, sorted([*pending, verdict_id]))


def settle_accusations(state: State, epoch: int) -> None:
    """EndBlock of the last block of `epoch`: settle the verdicts whose deadline it is."""
    due = schema.epoch_key(epoch)
    pending = state.get(schema.VERDICT_DUE, due)
    if pending is None:
        return
    for verdict_id in pending:
        record = state.get(schema.VERDICT, verdict_id)
        if record is None or "settled" in record:
            continue
        outcome = "confirmed" if record["confirmed"] else "refused"
        state.put(schema.VERDICT, verdict_id, {**record, "settled": outcome})
        for address in sorted(record["votes"]):
            mark = state.get(schema.VERIFIER_RECORD, address) or {
                "confirmed": 0,
                "refused": 0,
                "last_epoch": 0,
            }
            state.put(
                schema.VERIFIER_RECORD,
                address,
                {**mark, outcome: mark[outcome] + 1, "last_epoch": epoch},
            )
        if outcome == "refused":
            state.emit("planet.accusation", id=verdict_id, outcome=outcome)
    state.delete(schema.VERDICT_DUE, due)
