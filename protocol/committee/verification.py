"""Verification txs of validators and their verifiers: `verdict_vote`, `verdict_ratify`,
`seed_commit`, `seed_reveal`, `spot_check_report`, `verifier_endpoint`, `verifier_numerics`.

A verdict vote carries an operator key's EIP-712 signature over a `Verdict` (the chain checks
it against the genesis domain); a ratification carries the same signature over a verdict the
committee already confirmed, naming it by its id (abci_app/ratifications.py). A verifier
commits to the secret seed its challenges of an epoch derive from before the epoch starts and
reveals it after (`seed_commitment`), and reports the spot checks it did
(docs/verification.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import (
    ADDRESS,
    HEX32_0X,
    HEX64,
    MAX_NONCE,
    SIG65,
    U64,
    TxDecodeError,
    check,
)
from protocol.numerics import MAX_NUMERICS
from protocol.urls import BadUrlError, canonical_url


@dataclass(frozen=True, slots=True)
class VerdictVote:
    """A validator's vote for `Verdict(node, offence, evidenceHash, challenger, nonce)`:
    `signature` is its operator key's EIP-712 signature (65 bytes r‖s‖v, 0x-hex) under the
    "Planet Committee" domain from genesis."""

    node: str
    offence: int
    evidence_hash: str
    challenger: str
    verdict_nonce: int
    signature: str

    TYPE: ClassVar[str] = "verdict_vote"

    def to_json(self) -> dict[str, Any]:
        return {
            "challenger": self.challenger,
            "evidence_hash": self.evidence_hash,
            "node": self.node,
            "offence": self.offence,
            "signature": self.signature,
            "verdict_nonce": self.verdict_nonce,
        }

    @classmethod
    def from_json(cls, body: Any) -> VerdictVote:
        keys = {"challenger", "evidence_hash", "node", "offence", "signature", "verdict_nonce"}
        b = check.exact_object(body, "body", keys)
        return cls(
            node=check.text(b["node"], "body.node", ADDRESS),
            offence=check.integer(b["offence"], "body.offence", 1, 5),
            evidence_hash=check.text(b["evidence_hash"], "body.evidence_hash", HEX32_0X),
            challenger=check.text(b["challenger"], "body.challenger", ADDRESS),
            verdict_nonce=check.integer(b["verdict_nonce"], "body.verdict_nonce", 0, (1 << 64) - 1),
            signature=check.text(b["signature"], "body.signature", SIG65),
        )


@dataclass(frozen=True, slots=True)
class VerdictRatify:
    """A validator's attestation that the committee chain confirmed the verdict `verdict` (its
    id: the 0x struct hash of its `Verdict`, as `/verdicts` lists it), without judging the work
    itself: `signature` is its operator key's EIP-712 signature over that same `Verdict` (the
    chain rebuilds it from its record), which FraudProofs counts like a vote. Sent by the
    validator's watcher for a verdict confirmed by a numerics version's quorum, so that the
    signatures reach the 2/3 of all the power the contract checks (node/watcher/verdicts.py)."""

    verdict: str
    signature: str

    TYPE: ClassVar[str] = "verdict_ratify"

    def to_json(self) -> dict[str, Any]:
        return {"signature": self.signature, "verdict": self.verdict}

    @classmethod
    def from_json(cls, body: Any) -> VerdictRatify:
        b = check.exact_object(body, "body", {"signature", "verdict"})
        return cls(
            verdict=check.text(b["verdict"], "body.verdict", HEX32_0X),
            signature=check.text(b["signature"], "body.signature", SIG65),
        )


SEED_DOMAIN = b"planet/seed/v1\n"


def seed_commitment(signer_hex: str, epoch: int, seed: bytes) -> str:
    """`0x` + sha256(SEED_DOMAIN ‖ signer key (32 B) ‖ uint64_be(epoch) ‖ seed (32 B)): bound to
    its signer and epoch, so nobody can copy another verifier's commitment or reuse one."""
    if len(seed) != 32 or not HEX64.match(signer_hex) or not 0 <= epoch <= U64:
        raise ValueError("seed_commitment needs a 64-hex signer, a u64 epoch, a 32-byte seed")
    digest = hashlib.sha256(
        SEED_DOMAIN + bytes.fromhex(signer_hex) + epoch.to_bytes(8, "big") + seed
    ).hexdigest()
    return "0x" + digest


@dataclass(frozen=True, slots=True)
class SeedCommit:
    """A validator's verifier commits to the secret seed its challenges of `epoch` derive from
    (sent before that epoch starts; see docs/verification.md)."""

    epoch: int
    commitment: str  # seed_commitment(signer, epoch, seed)

    TYPE: ClassVar[str] = "seed_commit"

    def to_json(self) -> dict[str, Any]:
        return {"commitment": self.commitment, "epoch": self.epoch}

    @classmethod
    def from_json(cls, body: Any) -> SeedCommit:
        b = check.exact_object(body, "body", {"commitment", "epoch"})
        return cls(
            epoch=check.integer(b["epoch"], "body.epoch", 1, MAX_NONCE),
            commitment=check.text(b["commitment"], "body.commitment", HEX32_0X),
        )


@dataclass(frozen=True, slots=True)
class SeedReveal:
    """Opens the seed committed for `epoch` once it has closed (the chain checks it)."""

    epoch: int
    seed: str  # 0x + 64 hex

    TYPE: ClassVar[str] = "seed_reveal"

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seed": self.seed}

    @classmethod
    def from_json(cls, body: Any) -> SeedReveal:
        b = check.exact_object(body, "body", {"epoch", "seed"})
        return cls(
            epoch=check.integer(b["epoch"], "body.epoch", 1, MAX_NONCE),
            seed=check.text(b["seed"], "body.seed", HEX32_0X),
        )


MAX_SPOT_REPORT = 256


@dataclass(frozen=True, slots=True)
class SpotCheckReport:
    """A validator's verifier lists the spot checks it completed (any outcome) on the blocks
    committed during `epoch`: `[node key hex, session 0x-hex, step (block), shard]`, 1–256
    items strictly ascending. The chain credits only triples that were committed in `epoch`,
    selected under the seed of epoch + 1 and assigned to the signer (abci_app/spot_reports.py)."""

    epoch: int
    checks: tuple[tuple[str, str, int, int], ...]

    TYPE: ClassVar[str] = "spot_check_report"

    def to_json(self) -> dict[str, Any]:
        return {"checks": [list(c) for c in self.checks], "epoch": self.epoch}

    @classmethod
    def from_json(cls, body: Any) -> SpotCheckReport:
        b = check.exact_object(body, "body", {"checks", "epoch"})
        items = check.rows(b["checks"], "body.checks", 4, MAX_SPOT_REPORT)
        if not items:
            raise TxDecodeError(f"body.checks: expected 1..{MAX_SPOT_REPORT} items")
        checks = tuple(
            (
                check.text(i[0], "body.checks[].node", HEX64),
                check.text(i[1], "body.checks[].session", HEX32_0X),
                check.integer(i[2], "body.checks[].step", 0, U64),
                check.integer(i[3], "body.checks[].shard", 0, 65535),
            )
            for i in items
        )
        if list(checks) != sorted(set(checks)):
            raise TxDecodeError("body.checks: must be strictly ascending")
        return cls(epoch=check.integer(b["epoch"], "body.epoch", 1, U64), checks=checks)


@dataclass(frozen=True, slots=True)
class VerifierEndpoint:
    """Where a validator's verifier hands its spot-check findings to the other verifiers (the
    node-signed tickets it judged FAILED, each sealed to one verifier of the epoch's set:
    node/verifier/findings.py): `url` in canonical form (protocol/urls.py), the latest one
    counts."""

    url: str

    TYPE: ClassVar[str] = "verifier_endpoint"

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url}

    @classmethod
    def from_json(cls, body: Any) -> VerifierEndpoint:
        b = check.exact_object(body, "body", {"url"})
        url = b["url"]
        if not isinstance(url, str):
            raise TxDecodeError("body.url: expected a string")
        try:
            canonical = canonical_url(url)
        except BadUrlError as error:
            raise TxDecodeError(f"body.url: {error.message}") from None
        if canonical != url:
            raise TxDecodeError(f"body.url: not in canonical form (expected {canonical})")
        return cls(url=url)


@dataclass(frozen=True, slots=True)
class VerifierNumerics:
    """The numerics version (protocol/numerics.py) a validator's verifier runs, from the next
    epoch on: a spot-check verdict on a node of that version may be confirmed by the quorum of
    the verifiers announcing it (abci_app/numerics.py). Rate-limited like a node's change."""

    numerics: int

    TYPE: ClassVar[str] = "verifier_numerics"

    def to_json(self) -> dict[str, Any]:
        return {"numerics": self.numerics}

    @classmethod
    def from_json(cls, body: Any) -> VerifierNumerics:
        b = check.exact_object(body, "body", {"numerics"})
        return cls(numerics=check.integer(b["numerics"], "body.numerics", 1, MAX_NUMERICS))
