"""Verdicts: validators' EIP-712 votes that a node cheated, and the verifiers' track record.

`verdict_vote` (a validator): its operator key's signature over `Verdict(node, offence,
evidenceHash, challenger, nonce, consumer = genesis fraud_proofs_address)` in the committee
domain of genesis `evm`. `verdict/<id>` (id = 0x struct hash) accumulates `votes` and `power`;
`confirmed` at ≥ 2/3 of the power — or, for a node that announces numerics, at the quorum of
the verifiers announcing the version it computed with (abci_app/numerics.py: the versions
pinned at the first vote in `numerics`, the one that confirmed in `quorum_numerics`; a version
below the floor is unchecked and convicts nobody) — which also marks the accused account
`slashed/<epoch>/<account>` = [offences confirmed] (it earns nothing that epoch:
settlement.py). **One slash per node, epoch and offence**: a verdict that reaches 2/3 in an
epoch where the same node already has a confirmed verdict of the same offence, or of a failed
verification (which convicts it and covers everything else), is not confirmed but `superseded`
(the height it reached 2/3): it is not relayed to FraudProofs, and its accusation costs its
voters nothing (settled `unconfirmed`). Several verifiers that each find a different failing
block of one node in one epoch then halve its stake once, not once per finding. Codes:
NOT_VALIDATOR, VERDICTS_DISABLED, BAD_VERDICT_SIGNATURE, DUPLICATE_VOTE (also for a validator
that ratified the verdict: abci_app/ratifications.py, where a version-quorum verdict gathers
the other validators' signatures FraudProofs needs; `signed_verdict` checks both).

A confirmed verdict on a failed verification (offence 3, a challenge or spot-check finding
≥ 2/3 of the power reached) also **convicts** the node: its reputation R drops to 0 (untrusted,
not routable; abci_app/epochs.py raises it again only from agreed challenge scores, which an
unroutable node no longer gets), and `vconv/<account>` records the epoch.

A vote is an accusation: when the verdict it supports is not confirmed by the end of the
SETTLE_EPOCHS-th epoch after the one of its first vote, it is settled. The other verifiers
re-judge a finding from their own tickets first (node/verifier/spotchecks.py: a ticket fetch
and a shard's recomputation, tens of seconds on a busy machine, longer than a short epoch):
settling sooner would count their lag as disagreement. Deterministic and height-driven:

- the first vote of a verdict in epoch e adds its id to `vdue/<e + SETTLE_EPOCHS>` (a list);
- EndBlock of the last height of epoch d settles `vdue/<d>` (`settle_accusations`): the verdict
  record gets `settled`, each voter's `vrep/<validator address>` = {confirmed, refused,
  unconfirmed, last_epoch, benched_until} is counted, then `vdue/<d>` is deleted. Outcomes:
  - `confirmed`: ≥ 2/3 reached; its voters get a `confirmed` mark;
  - `unconfirmed` (no cost): a timeout accusation (offence 4) nobody else could confirm (a
    node may withhold a ticket from one verifier only), any accusation against a node the
    committee convicted of another offence since the epoch before the vote (the accuser was
    right about the node, another verifier's finding got there first), or one against a node
    that validators holding ≥ 2/3 of the power accused of something (any verdict) from the
    epoch before the vote to its settlement: a node that answers the verifier that finds it
    out and withholds its ticket from the others turns their re-judgements into timeout votes
    (node/verifier/spotchecks.py), and cannot get the finder benched that way;
  - `refused` (a **false accusation**, it costs its author): every voter gets a `refused` mark
    and is **benched** until epoch `d + BENCH_EPOCHS × its refused marks`: while benched its
    verdict votes are refused (`VERIFIER_BENCHED`) and its verifier is left out of the epochs'
    spot-check verifier sets (abci_app/epochs.py), so it is assigned no checks and earns no
    verification share (settlement pays the verifiers' cut by credited checks).

Query `/verifiers`. Slashing a colluding verifier's EVM stake (offence 5) needs a verdict on its
operator address like any other: not automated here.
"""

from __future__ import annotations

from typing import Any

from abci_app import numerics, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import VerdictVote
from protocol.eip712 import (
    OFFENCE_FAILED_VERIFICATION,
    OFFENCE_TIMEOUT,
    Verdict,
    committee_domain,
    recover_digest,
)
from protocol.errors import ProtocolError

BENCH_EPOCHS = 10  # epochs benched per refused accusation (escalates with each one)
SETTLE_EPOCHS = 3  # a verdict first voted in epoch e is settled at the close of e + SETTLE_EPOCHS
ACCUSED_EPOCHS = SETTLE_EPOCHS + 2  # epochs of accusers kept per node: vote − 1 … settlement


def benched(state: State, address: str, epoch: int) -> bool:
    """Whether validator `address`'s verifier is benched in `epoch` (false accusations)."""
    mark = state.get(schema.VERIFIER_RECORD, address)
    return mark is not None and mark.get("benched_until", 0) >= epoch


def verdict_vote(state: State, tx: SignedTx) -> None:
    body: VerdictVote = tx.body
    validator = rules.validator(state, tx.signer)
    current = rules.epoch_of(state, state.block_height)
    if benched(state, validator["address"], current):
        rules.reject(
            Code.VERIFIER_BENCHED,
            f"validator {validator['address']} is benched for a false accusation",
        )
    fields = {
        "node": body.node,
        "offence": body.offence,
        "evidence_hash": body.evidence_hash,
        "challenger": body.challenger,
        "nonce": body.verdict_nonce,
    }
    verdict, operator = signed_verdict(state, validator, fields, body.signature)
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
    if validator["address"] in record.get("ratifications", {}):
        rules.reject(
            Code.DUPLICATE_VOTE, f"validator {validator['address']} already ratified {ident}"
        )
    if not record["votes"]:  # the versions the node's checked work used, pinned at the first vote
        versions = numerics.judged_versions(state, verdict.node, current)
        record = {**record, "numerics": versions} if versions else record
    updated = rules.add_vote(state, record, validator, operator, body.signature)
    if not updated["confirmed"] and record.get("numerics"):
        # not 2/3 of all: the quorum of the verifiers running the node's version may confirm
        version = numerics.version_quorum(state, record["numerics"], updated["votes"], current)
        if version is not None:
            updated = {
                **updated,
                "confirmed": True,
                "confirmed_height": state.block_height,
                "quorum_numerics": version,
            }
    if not record["votes"]:
        _settle_later(state, ident)
    _note_accuser(state, verdict.node, validator["address"], current)
    if updated["confirmed"] and not record["confirmed"]:
        slot = schema.in_epoch(current, verdict.node.lower())
        earlier = state.get(schema.SLASHED, slot) or []
        if OFFENCE_FAILED_VERIFICATION in earlier or verdict.offence in earlier:
            # one slash per node, epoch and offence (a failed verification covers all): the
            # node already answers for this epoch; the verdict is right but not executed
            updated = {**updated, "confirmed": False, "confirmed_height": None}
            if not record.get("superseded"):
                updated["superseded"] = state.block_height
                state.emit("planet.verdict", id=ident, confirmed="false", superseded="true")
        else:
            state.emit("planet.verdict", id=ident, confirmed="true")
            state.put(schema.SLASHED, slot, sorted([*earlier, verdict.offence]))
            _convict(state, verdict.node, verdict.offence, current)
    state.put(schema.VERDICT, ident, updated)


def signed_verdict(
    state: State, validator: dict[str, Any], fields: dict[str, Any], signature: str
) -> tuple[Verdict, str]:
    """The `Verdict` of `fields` (node, offence, evidence_hash 0x-hex, challenger, nonce) for
    the genesis FraudProofs, and `validator`'s operator address, once `signature` (0x r‖s‖v)
    is that operator's EIP-712 signature over it in the genesis committee domain; refuses by
    name (VERDICTS_DISABLED, BAD_VERDICT_SIGNATURE) otherwise."""
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
            node=fields["node"],
            offence=fields["offence"],
            evidence_hash=bytes.fromhex(str(fields["evidence_hash"])[2:]),
            challenger=fields["challenger"],
            nonce=fields["nonce"],
            consumer=genesis.fraud_proofs_address,
        )
        domain = committee_domain(genesis.evm_chain_id, genesis.committee_address)
        recovered = recover_digest(verdict.digest(domain), bytes.fromhex(signature[2:]))
    except ProtocolError as error:
        rules.reject(Code.BAD_VERDICT_SIGNATURE, error.message)
    if recovered.lower() != operator.lower():
        rules.reject(
            Code.BAD_VERDICT_SIGNATURE, f"signature recovers {recovered}, not operator {operator}"
        )
    return verdict, str(operator)


def _convict(state: State, account: str, offence: int, epoch: int) -> None:
    """A confirmed verdict: remember it; a failed verification zeroes the node's reputation."""
    state.put(schema.CONVICTED, account.lower(), epoch)
    if offence != OFFENCE_FAILED_VERIFICATION:
        return
    key = state.get(schema.EVM_BINDING, account.lower())
    record = state.get(schema.REPUTATION, key) if key is not None else None
    if record is not None:
        state.put(schema.REPUTATION, key, {**record, "r": 0})


def _note_accuser(state: State, account: str, validator: str, epoch: int) -> None:
    """Remember that `validator` accused `account` in `epoch` (the last ACCUSED_EPOCHS kept)."""
    key = account.lower()
    epochs = {
        e: voters
        for e, voters in (state.get(schema.ACCUSERS, key) or {}).items()
        if int(e) > epoch - ACCUSED_EPOCHS
    }
    voters = epochs.get(str(epoch), [])
    if validator not in voters:
        epochs[str(epoch)] = sorted([*voters, validator])
    state.put(schema.ACCUSERS, key, dict(sorted(epochs.items(), key=lambda item: int(item[0]))))


def _accused_by_two_thirds(state: State, account: str, first: int, last: int) -> bool:
    """Whether validators with ≥ 2/3 of the power voted verdicts against `account` in epochs
    `first` … `last` (any offence, any evidence)."""
    epochs = state.get(schema.ACCUSERS, account.lower()) or {}
    voters = {v for e, vs in epochs.items() if first <= int(e) <= last for v in vs}
    powers = state.validator_keys()
    return state.has_two_thirds(sum(powers[v][1] for v in voters if v in powers))


def _settle_later(state: State, verdict_id: str) -> None:
    """A verdict's first vote: its accusation is settled when the SETTLE_EPOCHS-th epoch after
    this one closes."""
    deadline = schema.epoch_key(rules.epoch_of(state, state.block_height) + SETTLE_EPOCHS)
    pending = state.get(schema.VERDICT_DUE, deadline) or []
    if verdict_id not in pending:
        state.put(schema.VERDICT_DUE, deadline, sorted([*pending, verdict_id]))


def _outcome(state: State, record: dict[str, Any]) -> str:
    if record["confirmed"]:
        return "confirmed"
    if record["offence"] == OFFENCE_TIMEOUT or record.get("superseded"):
        return "unconfirmed"
    convicted = state.get(schema.CONVICTED, str(record["node"]).lower())
    voted_in = rules.epoch_of(state, record["first_height"])
    if convicted is not None and convicted >= voted_in - 1:
        return "unconfirmed"
    if _accused_by_two_thirds(state, str(record["node"]), voted_in - 1, voted_in + SETTLE_EPOCHS):
        return "unconfirmed"
    return "refused"


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
        outcome = _outcome(state, record)
        state.put(schema.VERDICT, verdict_id, {**record, "settled": outcome})
        for address in sorted(record["votes"]):
            mark = {
                "confirmed": 0,
                "refused": 0,
                "unconfirmed": 0,
                "benched_until": 0,
                **(state.get(schema.VERIFIER_RECORD, address) or {}),
            }
            mark[outcome] += 1
            mark["last_epoch"] = epoch
            if outcome == "refused":
                mark["benched_until"] = epoch + BENCH_EPOCHS * mark["refused"]
            state.put(schema.VERIFIER_RECORD, address, mark)
        if outcome != "confirmed":
            state.emit("planet.accusation", id=verdict_id, outcome=outcome)
    state.delete(schema.VERDICT_DUE, due)
