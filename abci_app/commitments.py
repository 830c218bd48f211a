"""Commit-reveal: compute nodes commit to their outputs, reveal them later; the chain keeps the
evidence when a node equivocates or a reveal does not open its commitment (`commit`, `reveal`).

- `commit`: by a compute node of the staked pools only (`pool/<model>/<key>`; NOT_STAKED
  otherwise, before anything is read or written: a free registration adds nothing to `cov/`,
  so an epoch close's work grows with stake, coverage.py). Per record
  `commit/<node>/<session>/<step>/<shard>` = {commitment, height}. The same
  value again refuses the whole batch (DUPLICATE_COMMITMENT); a different value for a recorded
  (session, step, shard) stores `equivocation` evidence instead of overwriting.
- `reveal`: every record must have an unrevealed commitment by the signer (UNKNOWN_COMMITMENT,
  ALREADY_REVEALED), else the whole batch is refused; the record gets {output_hash, salt,
  revealed_height, match} and a mismatch stores `reveal_mismatch` evidence. A node whose stake
  ended still reveals what it committed (compute node, not LEFT: no stake asked).
- Every stored record counts as 32 committed positions of its (node, shard) in the block's
  epoch, and a stored step 0 as one session begun there (`coverage.record_commits`: what
  redemptions consume).
- Evidence: `evidence/<id>`, id = 0x sha256 of the canonical record (also the verdict's
  `evidenceHash`). Commitments and evidence are indexed for pruning (`rules.track`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from abci_app import coverage, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.canonical import canonical_json
from protocol.committee.commitments import CommitBatch, RevealBatch
from protocol.committee.envelope import SignedTx
from protocol.eip712 import commitment_value


def evidence_id(record: dict[str, Any]) -> str:
    """0x-hex sha256 of the canonical evidence record (also the verdict's `evidenceHash`)."""
    return "0x" + hashlib.sha256(canonical_json(record)).hexdigest()


def _store_evidence(state: State, record: dict[str, Any]) -> str:
    ident = evidence_id(record)
    if state.get(schema.EVIDENCE, ident) is None:
        state.put(schema.EVIDENCE, ident, {**record, "id": ident, "height": state.block_height})
        rules.track(state, schema.EVIDENCE, ident)
    state.emit("planet.evidence", id=ident, kind=record["kind"], node=record["node"])
    return ident


def admit_commit(state: State, signer: str) -> str | None:
    """Mempool admission (CheckTx, committed state only): why a `commit` by `signer`, a
    registered compute node that has not left, would be refused NOT_STAKED (outside the staked
    pools), or None. Keeps a stranger's free nodes' commits out of blocks; FinalizeBlock
    decides (the other refusals, and a stake that changed since, are judged there)."""
    node = state.committed(schema.NODE, signer)
    if node is None or node["role"] != "compute" or node["status"] == schema.LEFT:
        return None
    if state.committed(schema.POOL, schema.pool_key(str(node["model"]), signer)) is None:
        return f"node {signer} is not staked (agreed stake below min_stake.compute)"
    return None


def commit(state: State, tx: SignedTx) -> None:
    body: CommitBatch = tx.body
    rules.staked_compute_node(state, tx.signer)  # NOT_STAKED: cov/ holds staked nodes' work
    fresh: list[tuple[str, str]] = []
    signer = tx.signer
    # (session, step, shard) are unique within a batch: one lookup for all equals one per item
    keys = [
        schema.commitment_key(signer, item.session, item.step, item.shard)
        for item in body.commitments
    ]
    stored = state.get_many(schema.COMMITMENT, keys)
    for key, item in zip(keys, body.commitments, strict=True):
        existing = stored.get(key)
        if existing is None:
            fresh.append((key, item.commitment))
        elif existing["commitment"] == item.commitment:
            rules.reject(Code.DUPLICATE_COMMITMENT, f"commitment {key} already recorded")
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
    per_shard: dict[int, int] = {}
    sessions: dict[int, int] = {}  # per shard: sessions whose first block (step 0) is new here
    for key, value in fresh:
        state.put(schema.COMMITMENT, key, {"commitment": value, "height": height})
        _, _, step, shard_text = key.rsplit("/", 3)
        shard = int(shard_text)
        per_shard[shard] = per_shard.get(shard, 0) + 1
        if step == "0":
            sessions[shard] = sessions.get(shard, 0) + 1
    rules.track_many(state, schema.COMMITMENT, [key for key, _ in fresh])
    coverage.record_commits(state, tx.signer, per_shard, sessions)
    state.emit("planet.commit", node=tx.signer, count=len(fresh))


def reveal(state: State, tx: SignedTx) -> None:
    body: RevealBatch = tx.body
    rules.compute_node(state, tx.signer)
    checked: list[tuple[str, dict[str, Any], bool, Any]] = []
    keys = [
        schema.commitment_key(tx.signer, item.session, item.step, item.shard)
        for item in body.reveals
    ]
    stored = state.get_many(schema.COMMITMENT, keys)
    for key, item in zip(keys, body.reveals, strict=True):
        existing = stored.get(key)
        if existing is None:
            rules.reject(Code.UNKNOWN_COMMITMENT, f"no commitment {key}")
        if "revealed_height" in existing:
            rules.reject(Code.ALREADY_REVEALED, f"commitment {key} was already revealed")
        expected = commitment_value(
            item.session, item.step, item.shard, item.output_hash, item.salt
        )
        checked.append((key, existing, "0x" + expected.hex() == existing["commitment"], item))
    mismatches = 0
    for key, existing, ok, item in checked:
        state.put(
            schema.COMMITMENT,
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
