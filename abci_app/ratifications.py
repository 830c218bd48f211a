"""Ratifications: validators attest that the committee chain confirmed a verdict, so that a
verdict confirmed by a numerics version's quorum becomes slashable on the EVM chain.

    verdict_ratify{verdict, signature}   signer: a validator (its consensus key)

A verdict confirmed by the quorum of the verifiers running the accused node's version
(abci_app/numerics.py) may hold less than 2/3 of all the power in votes, while FraudProofs
(`slashByVerdict`) counts the committee's signatures over the verdict against 2/3 of all the
power (contracts/Committee.sol). The version rule is committed, deterministic state: every
honest validator can attest "the committee chain confirmed this verdict" without re-judging
the work. A ratification is its operator key's EIP-712 signature over the very `Verdict` the
votes signed (rebuilt here from the record, for the genesis FraudProofs, in the genesis
committee domain), so the contract needs no change and counts it like a vote.

Accepted only (each refusal named, nothing written):
- from a validator (NOT_VALIDATOR); a benched verifier's validator may ratify: ratifying
  judges nothing, it repeats what the chain decided;
- for a verdict `verdict/<id>` that exists and is `confirmed` (VERDICT_NOT_CONFIRMED: unknown,
  still open, or superseded — a superseded verdict is never relayed);
- once per validator and verdict, and never from a validator that voted on it: its vote
  already carries the same signature (DUPLICATE_VOTE: a replay, or a vote then a
  ratification, is refused by name); `verdict_vote` refuses a ratifier's later vote the same
  way;
- with a signature by the validator's registered operator over that verdict
  (BAD_VERDICT_SIGNATURE; VERDICTS_DISABLED without the genesis EVM section).

The record gains `ratifications` {validator address: {operator, signature}} and
`ratified_power`. A ratification is not an accusation: it is not a vote, adds nothing to
`power` or to the accusers of the node, and earns its author no `confirmed`/`refused` mark when
the verdict settles. `/verdicts` lists the voters' and the ratifiers' signatures together (by
ascending operator) and, for a version-quorum verdict, `relayable` once votes and
ratifications hold ≥ 2/3 of all the power (abci_app/queries.py) — the watchers then relay it
like any other (node/watcher/verdicts.py).

Why this is sound: the committee's safety already assumes faulty power < T/3. An honest
validator ratifies only a verdict its own committed state holds confirmed, and the version rule
confirms only with ≥ 2 voters holding ≥ T/3 of the power, so an honest verifier judged the
work a fault. Faulty validators (< T/3) can withhold their ratifications — the honest ones
(> 2T/3) reach 2/3 without them — or sign whatever they like, which the contract counts only
toward 2/3 and never reaches it alone; they cannot make an honest validator ratify an
unconfirmed verdict, since this handler refuses one and an honest watcher reads its own
validator's committed state.
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from abci_app.verdicts import signed_verdict
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import VerdictRatify


def verdict_ratify(state: State, tx: SignedTx) -> None:
    body: VerdictRatify = tx.body
    validator = rules.validator(state, tx.signer)
    address = validator["address"]
    record = state.get(schema.VERDICT, body.verdict)
    if record is None or not record["confirmed"]:
        state_word = "unknown" if record is None else "not confirmed"
        rules.reject(Code.VERDICT_NOT_CONFIRMED, f"verdict {body.verdict} is {state_word}")
    ratifications = record.get("ratifications", {})
    if address in record["votes"] or address in ratifications:
        how = "voted on" if address in record["votes"] else "ratified"
        rules.reject(Code.DUPLICATE_VOTE, f"validator {address} already {how} {body.verdict}")
    fields = {k: record[k] for k in ("node", "offence", "evidence_hash", "challenger", "nonce")}
    _, operator = signed_verdict(state, validator, fields, body.signature)
    updated = {
        **record,
        "ratifications": {
            **ratifications,
            address: {"operator": operator, "signature": body.signature},
        },
        "ratified_power": record.get("ratified_power", 0) + validator["power"],
    }
    state.put(schema.VERDICT, body.verdict, updated)
    state.emit("planet.verdict", id=body.verdict, ratified=address)
