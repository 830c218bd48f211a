"""One function per tx type: the state rules of the committee chain.

Each handler reads through `state.get`, raises `Rejected(code, message)` before writing anything
when a rule fails, and otherwise writes with `state.put` (the tx's writes are merged only on
success, so a rejected tx changes nothing but its signer's nonce).

Namespaces written here: `node/<key>` (registry + lifecycle), `evm/<address>` (EVM binding),
`stake/<key>` (attestations and the agreed amount), `commit/<key>/<session>/<step>/<shard>`,
`evidence/<id>`, `rep/<key>` (reputation), `verdict/<id>`, `hbdue/<height>` (heartbeat deadlines),
`regdue/<height>` (registration expiry checks), `seed/<epoch>/<signer>` (seeds.py),
`vdue/<epoch>` + `vrep/<validator address>` (accusations.py) and `gc/<epoch>/<ns>/<key>`
(the pruning index of commitments and evidence; see `retention.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from abci_app import accusations, retention, seeds, settlement, spot_reports
from abci_app.codes import Code, Rejected
from protocol.canonical import canonical_json
from protocol.committee import (
    AttestStake,
    CommitBatch,
    Heartbeat,
    Leave,
    RegisterNode,
    RevealBatch,
    SeedCommit,
    SeedReveal,
    SignedTx,
    SpotCheckReport,
    VerdictVote,
)
from protocol.eip712 import Verdict, commitment_value, committee_domain, recover_digest
from protocol.errors import ProtocolError

if TYPE_CHECKING:
    from abci_app.state import State

JOIN, SERVING, DOWN, LEFT = "JOIN", "SERVING", "DOWN", "LEFT"


def _reject(code: Code, message: str) -> NoReturn:
    raise Rejected(code, message)


def _node(state: State, key: str) -> dict[str, Any]:
    node = state.get("node", key)
    if node is None:
        _reject(Code.UNKNOWN_NODE, f"node {key} is not registered")
    return node


def schedule_heartbeat_check(state: State, node_key: str, last_heartbeat: int) -> None:
    """Re-check `node_key` at the first height where it would be overdue."""
    due = str(last_heartbeat + state.genesis.heartbeat_timeout + 1)
    pending = state.get("hbdue", due) or []
    if node_key not in pending:
        state.put("hbdue", due, sorted([*pending, node_key]))


def evidence_id(record: dict[str, Any]) -> str:
    """0x-hex sha256 of the canonical evidence record (also the verdict's `evidenceHash`)."""
    return "0x" + hashlib.sha256(canonical_json(record)).hexdigest()


def _store_evidence(state: State, record: dict[str, Any]) -> str:
    ident = evidence_id(record)
    if state.get("evidence", ident) is None:
        state.put("evidence", ident, {**record, "id": ident, "height": state.block_height})
        retention.track(state, "evidence", ident)
    state.emit("planet.evidence", id=ident, kind=record["kind"], node=record["node"])
    return ident


# --- registry and lifecycle ---------------------------------------------------------------------


def register_node(state: State, tx: SignedTx) -> None:
    body: RegisterNode = tx.body
    if state.get("node", tx.signer) is not None:
        _reject(Code.ALREADY_REGISTERED, f"node {tx.signer} is already registered")
    evm = body.evm_address.lower()
    if state.get("evm", evm) is not None:
        _reject(Code.EVM_ADDRESS_TAKEN, f"EVM address {body.evm_address} is bound to another node")
    height = state.block_height
    state.put(
        "node",
        tx.signer,
        {
            "key": tx.signer,
            "evm_address": body.evm_address,
            "role": body.role,
            "model": body.model,
            "shards": list(body.shards),
            "endpoint": body.endpoint,
            "capacity": body.capacity,
            "status": JOIN,
            "status_height": height,
            "registered_height": height,
            "last_heartbeat": height,
        },
    )
    state.put("evm", evm, tx.signer)
    rep = state.genesis.reputation
    state.put("rep", tx.signer, {"r": rep.initial, "window": [], "epochs": 0, "last_epoch": 0})
    schedule_heartbeat_check(state, tx.signer, height)
    retention.schedule_registration_check(state, tx.signer, height)
    state.emit("planet.node", node=tx.signer, status=JOIN)


def heartbeat(state: State, tx: SignedTx) -> None:
    node = _node(state, tx.signer)
    if node["status"] == LEFT:
        _reject(Code.INVALID_LIFECYCLE, f"node {tx.signer} has left")
    height = state.block_height
    updated = {**node, "last_heartbeat": height}
    if node["status"] != SERVING:
        updated["status"] = SERVING
        updated["status_height"] = height
        state.emit("planet.node", node=tx.signer, status=SERVING)
    state.put("node", tx.signer, updated)
    schedule_heartbeat_check(state, tx.signer, height)


def leave(state: State, tx: SignedTx) -> None:
    node = _node(state, tx.signer)
    if node["status"] == LEFT:
        _reject(Code.INVALID_LIFECYCLE, f"node {tx.signer} has already left")
    state.put("node", tx.signer, {**node, "status": LEFT, "status_height": state.block_height})
    state.emit("planet.node", node=tx.signer, status=LEFT)


# --- stake --------------------------------------------------------------------------------------


def attest_stake(state: State, tx: SignedTx) -> None:
    body: AttestStake = tx.body
    validator = state.validator_by_signer(tx.signer)
    if validator is None:
        _reject(Code.NOT_VALIDATOR, f"signer {tx.signer} is not a validator")
    node = _node(state, body.node)
    record = state.get("stake", body.node) or {"attestations": {}, "agreed": None, "height": 0}
    attestations = {**record["attestations"], validator["address"]: str(body.amount)}
    power_by_amount: dict[str, int] = {}
    for address, amount in attestations.items():
        power = state.by_address[address]["power"]
        power_by_amount[amount] = power_by_amount.get(amount, 0) + power
    agreed, height = record["agreed"], record["height"]
    for amount in sorted(power_by_amount, key=int):
        if state.has_two_thirds(power_by_amount[amount]) and amount != agreed:
            agreed, height = amount, state.block_height
            state.emit("planet.stake", node=body.node, amount=amount)
    state.put(
        "stake", body.node, {"attestations": attestations, "agreed": agreed, "height": height}
    )
    if agreed != record["agreed"] and not retention.is_staked(state, node, body.node):
        retention.schedule_registration_check(state, body.node, state.block_height)


# --- commit-reveal ------------------------------------------------------------------------------


def _compute_node(state: State, key: str) -> dict[str, Any]:
    node = _node(state, key)
    if node["role"] != "compute":
        _reject(Code.WRONG_ROLE, f"node {key} has role {node['role']}, not compute")
    if node["status"] == LEFT:
        _reject(Code.INVALID_LIFECYCLE, f"node {key} has left")
    return node


def commit(state: State, tx: SignedTx) -> None:
    body: CommitBatch = tx.body
    _compute_node(state, tx.signer)
    fresh: list[tuple[str, str]] = []
    signer = tx.signer
    # (session, step, shard) are unique within a batch: one lookup for all equals one per item
    keys = [f"{signer}/{item.session}/{item.step}/{item.shard}" for item in body.commitments]
    stored = state.get_many("commit", keys)
    for key, item in zip(keys, body.commitments, strict=True):
        existing = stored.get(key)
        if existing is None:
            fresh.append((key, item.commitment))
        elif existing["commitment"] == item.commitment:
            _reject(Code.DUPLICATE_COMMITMENT, f"commitment {key} already recorded")
        else:
            _store_evidence(
                state,
                {
                    "kind": "equivocation",
                    "node": tx.signer,
                    "session": item.session,
                    "step": item.step,
                    "shard": item.shard,
                    "commitment": existing["commitment"],
                    "other_commitment": item.commitment,
                },
            )
    height = state.block_height
    for key, value in fresh:
        state.put("commit", key, {"commitment": value, "height": height})
    retention.track_many(state, "commit", [key for key, _ in fresh])
    state.emit("planet.commit", node=tx.signer, count=len(fresh))


def reveal(state: State, tx: SignedTx) -> None:
    body: RevealBatch = tx.body
    _compute_node(state, tx.signer)
    checked: list[tuple[str, dict[str, Any], bool, Any]] = []
    keys = [f"{tx.signer}/{item.session}/{item.step}/{item.shard}" for item in body.reveals]
    stored = state.get_many("commit", keys)
    for key, item in zip(keys, body.reveals, strict=True):
        existing = stored.get(key)
        if existing is None:
            _reject(Code.UNKNOWN_COMMITMENT, f"no commitment {key}")
        if "revealed_height" in existing:
            _reject(Code.ALREADY_REVEALED, f"commitment {key} was already revealed")
        expected = commitment_value(
            item.session, item.step, item.shard, item.output_hash, item.salt
        )
        checked.append((key, existing, "0x" + expected.hex() == existing["commitment"], item))
    mismatches = 0
    for key, existing, ok, item in checked:
        state.put(
            "commit",
            key,
            {
                **existing,
                "output_hash": item.output_hash,
                "salt": item.salt,
                "revealed_height": state.block_height,
                "match": ok,
            },
        )
        if not ok:
            mismatches += 1
            _store_evidence(
                state,
                {
                    "kind": "reveal_mismatch",
                    "node": tx.signer,
                    "session": item.session,
                    "step": item.step,
                    "shard": item.shard,
                    "commitment": existing["commitment"],
                    "output_hash": item.output_hash,
                    "salt": item.salt,
                },
            )
    state.emit("planet.reveal", node=tx.signer, count=len(checked), mismatches=mismatches)


# --- verdicts -----------------------------------------------------------------------------------


def verdict_vote(state: State, tx: SignedTx) -> None:
    body: VerdictVote = tx.body
    validator = state.validator_by_signer(tx.signer)
    if validator is None:
        _reject(Code.NOT_VALIDATOR, f"signer {tx.signer} is not a validator")
    genesis = state.genesis
    if (
        genesis.committee_address is None
        or genesis.evm_chain_id is None
        or genesis.fraud_proofs_address is None
    ):
        _reject(
            Code.VERDICTS_DISABLED,
            "genesis has no evm {chain_id, committee_address, fraud_proofs_address}",
        )
    operator = validator.get("operator")
    if not operator:
        _reject(
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
        _reject(Code.BAD_VERDICT_SIGNATURE, error.message)
    if recovered.lower() != operator.lower():
        _reject(
            Code.BAD_VERDICT_SIGNATURE, f"signature recovers {recovered}, not operator {operator}"
        )
    ident = "0x" + verdict.struct_hash().hex()
    record = state.get("verdict", ident) or {
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
        _reject(Code.DUPLICATE_VOTE, f"validator {validator['address']} already voted on {ident}")
    votes = {
        **record["votes"],
        validator["address"]: {"operator": operator, "signature": body.signature},
    }
    power = record["power"] + validator["power"]
    updated = {**record, "votes": votes, "power": power}
    if not record["votes"]:
        accusations.first_vote(state, ident)
    if not record["confirmed"] and state.has_two_thirds(power):
        updated["confirmed"] = True
        updated["confirmed_height"] = state.block_height
        state.emit("planet.verdict", id=ident, confirmed="true")
        settlement.note_slashed(state, verdict.node)
    state.put("verdict", ident, updated)


HANDLERS: dict[str, Callable[[State, SignedTx], None]] = {
    RegisterNode.TYPE: register_node,
    Heartbeat.TYPE: heartbeat,
    Leave.TYPE: leave,
    AttestStake.TYPE: attest_stake,
    CommitBatch.TYPE: commit,
    RevealBatch.TYPE: reveal,
    VerdictVote.TYPE: verdict_vote,
    SeedCommit.TYPE: seeds.seed_commit,
    SeedReveal.TYPE: seeds.seed_reveal,
    SpotCheckReport.TYPE: spot_reports.spot_check_report,
}
