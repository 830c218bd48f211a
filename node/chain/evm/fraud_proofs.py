"""`FraudProofs`: slashing on node-signed evidence and on committee-signed verdicts.

Node-signed proofs are two transactions: `commitChallenge(challengeCommitment(sender, evidence
id, offence, salt))`, mined, then the proof with the salt in a later block, so nobody who copies
the proof from the mempool can take the reward. The prove_* methods do both (a random salt unless
one is given); `commit_challenge` alone lets a caller commit early.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from node.chain.evm.sender import Binding, TxResult
from protocol.eip712 import (
    OFFENCE_COMMIT_REVEAL_MISMATCH,
    OFFENCE_EQUIVOCATION,
    OFFENCE_FAILED_VERIFICATION,
    Commitment,
    Domain,
    Reveal,
    TypedStruct,
    Verdict,
    challenge_commitment,
    evidence_id,
    fraud_proofs_domain,
)
from protocol.errors import ProtocolError


class FraudProofs(Binding):
    NAME = "FraudProofs"

    def domain(self) -> Domain:
        """The EIP-712 domain nodes sign their commitments and reveals in."""
        return fraud_proofs_domain(self.sender.chain_id, self.address)

    # --- node-signed evidence: commit, then prove -----------------------------------------------

    def commit_challenge(self, commitment: bytes) -> TxResult:
        """Commit to a challenge (see `protocol.eip712.challenge_commitment`)."""
        return self.transact("commitChallenge", commitment)

    def _commit_for(
        self, struct: TypedStruct, signature: bytes, offence: int, salt: bytes | None
    ) -> bytes:
        """Commit this account's challenge of the slot `struct` is about; returns the salt.
        A signature that does not recover is left for the contract to reject (no commitment)."""
        salt = salt if salt is not None else os.urandom(32)
        try:
            node = struct.recover(signature, self.domain())
        except ProtocolError:
            return salt
        slot = evidence_id(node, struct.session, struct.step, struct.shard)  # type: ignore[attr-defined]
        self.commit_challenge(challenge_commitment(self.sender.address, slot, offence, salt))
        return salt

    def prove_reveal_mismatch(
        self,
        commitment: Commitment,
        commitment_signature: bytes,
        reveal: Reveal,
        reveal_signature: bytes,
        *,
        salt: bytes | None = None,
    ) -> TxResult:
        """Slash the node whose signed reveal does not open its signed commitment (100 %):
        commits the challenge, then proves it in the next block."""
        salt = self._commit_for(
            commitment, commitment_signature, OFFENCE_COMMIT_REVEAL_MISMATCH, salt
        )
        return self.transact(
            "proveRevealMismatch",
            _commitment_tuple(commitment),
            commitment_signature,
            _reveal_tuple(reveal),
            reveal_signature,
            salt,
            next_block=True,
        )

    def prove_equivocation(
        self,
        first: Commitment,
        first_signature: bytes,
        second: Commitment,
        second_signature: bytes,
        *,
        salt: bytes | None = None,
    ) -> TxResult:
        """Slash the node that signed two different commitments for one slot (100 %)."""
        salt = self._commit_for(first, first_signature, OFFENCE_EQUIVOCATION, salt)
        return self.transact(
            "proveEquivocation",
            _commitment_tuple(first),
            first_signature,
            _commitment_tuple(second),
            second_signature,
            salt,
            next_block=True,
        )

    def prove_computation_fault(
        self, reveal: Reveal, reveal_signature: bytes, proof: bytes, *, salt: bytes | None = None
    ) -> TxResult:
        """Slash FailedVerification (50 %) when the deployment's fault verifier (ZK hook) accepts
        `proof` against the node-signed reveal (slot, model, input and output as signed)."""
        salt = self._commit_for(reveal, reveal_signature, OFFENCE_FAILED_VERIFICATION, salt)
        return self.transact(
            "proveComputationFault",
            _reveal_tuple(reveal),
            reveal_signature,
            proof,
            salt,
            next_block=True,
        )

    # --- recorded work (keeps the node's stake through the challenge window) --------------------

    def record_commitment(self, commitment: Commitment, signature: bytes) -> TxResult:
        """Keep the signing node's stake until `signed_at + challengeWindow + 1`."""
        return self.transact("recordCommitment", _commitment_tuple(commitment), signature)

    def record_reveal(self, reveal: Reveal, signature: bytes) -> TxResult:
        """Like `record_commitment`, for a signed reveal."""
        return self.transact("recordReveal", _reveal_tuple(reveal), signature)

    # --- committee verdicts ---------------------------------------------------------------------

    def slash_by_verdict(self, verdict: Verdict, signatures: Sequence[bytes]) -> TxResult:
        """Slash on a committee-signed verdict (the verdict's challenger earns the reward; its
        consumer must be this deployment's FraudProofs)."""
        return self.transact(
            "slashByVerdict",
            (
                verdict.node,
                verdict.offence,
                verdict.evidence_hash,
                verdict.challenger,
                verdict.nonce,
                verdict.consumer,
            ),
            list(signatures),
        )

    def relay_confirmed_verdict(self, record: Mapping[str, Any]) -> TxResult:
        """Relay one confirmed record of the committee's `/verdicts?confirmed=true` (its
        `node`, `offence`, `evidence_hash`, `challenger`, `nonce`, `signatures` sorted by
        signer) to this deployment's FraudProofs.slashByVerdict: what any relayer does."""
        verdict = Verdict(
            node=record["node"],
            offence=record["offence"],
            evidence_hash=bytes.fromhex(record["evidence_hash"][2:]),
            challenger=record["challenger"],
            nonce=record["nonce"],
            consumer=self.address,
        )
        return self.slash_by_verdict(verdict, [bytes.fromhex(s[2:]) for s in record["signatures"]])

    # --- reads ----------------------------------------------------------------------------------

    def is_proven(self, evidence_id: bytes) -> bool:
        return self.call("proven", evidence_id)

    def penalty_of(self, evidence_id: bytes) -> int:
        """Highest share (basis points) the evidence has cost its node so far."""
        return self.call("penaltyOf", evidence_id)


def _commitment_tuple(c: Commitment) -> tuple[bytes, int, int, bytes, int]:
    return (c.session, c.step, c.shard, c.commitment, c.signed_at)


def _reveal_tuple(r: Reveal) -> tuple[bytes, int, int, bytes, bytes, bytes, bytes, int]:
    return (
        r.session,
        r.step,
        r.shard,
        r.manifest_hash,
        r.input_hash,
        r.output_hash,
        r.salt,
        r.signed_at,
    )
