"""Computational-randomness routing (UNFED Layer 2): the next node follows from the last output.

Where a circuit leaves a choice — several routable nodes serve the next shard — nobody picks:
the node of shard s + 1 is derived from what the node of shard s committed for its output of
the session's first forward (the prefill):

    output_hash = keccak256(fingerprint bytes of that output)      (protocol.fingerprint blocks)
    salt        = keccak256("planet/route-salt/v1" ‖ session ‖ uint32_be(shard) ‖ output_hash)
    commitment  = commitment_value(session, ROUTE_STEP, shard, output_hash, salt)
                  (= keccak256(abi.encode(session, uint64 step, uint32 shard, outputHash, salt)),
                   the contracts' and the committee chain's commitment value)
    candidates  = the next shard's routable node keys, sorted, unique
    digest      = sha256("planet/route/v1" ‖ commitment ‖ uint32_be(next shard) ‖
                         sha256(concatenated candidate keys))
    next node   = candidates[uint256(digest) mod len(candidates)]

The node hands the client (or, with node-to-node forwarding, the next node) its EIP-712-signed
`Commitment` and `Reveal` for the slot (session, ROUTE_STEP, shard) and the fingerprint bytes.
Because the salt is a function of the output, the commitment is a function of the output alone
(UNFED's `hash(output)`): the node cannot grind a salt to steer; steering means changing its
output, which spot checks and challenges judge. Checking a route (`check_step`) needs no
secret, so a client, a gateway, the next node or a verifier can do it:

    RouteSignatureError    a signature does not recover, or commitment and reveal have two signers
    RouteSlotError         not the route slot, or commitment and reveal name different slots
    RouteSaltError         the salt is not the one derived from the output (a steering attempt)
    RouteFingerprintError  the fingerprint bytes are malformed or do not hash to output_hash
    RevealMismatchError    the reveal does not open the commitment (FraudProofs.proveRevealMismatch)
    RouteMismatchError     the next hop is not the derived node

A reveal that does not open its signed commitment, and two different signed commitments for
one route slot (the node showing the client one route and the chain another), are provable on
the EVM chain by anyone (`FraudProofs.proveRevealMismatch` / `proveEquivocation`, 100 %, the
challenger earns half): `fraud_proof_for` says which one a pair of statements makes.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from protocol.abi_words import keccak
from protocol.eip712 import Commitment, Domain, Reveal, commitment_value
from protocol.errors import ProtocolError
from protocol.fingerprint import FingerprintError, decode_blocks

ROUTE_STEP: Final = 2**64 - 1  # the slot of a session's route commitment (block steps are < 2^32)
_ROUTE_DOMAIN = b"planet/route/v1"
_SALT_DOMAIN = b"planet/route-salt/v1"
_KEY = re.compile(r"[0-9a-f]{64}\Z")
MAX_CANDIDATES: Final = 4096


class RouteError(ProtocolError):
    """A route step that does not check out; `reason` says why."""

    code = "route"

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad route: {reason}")
        self.reason = reason


class RouteCandidatesError(RouteError):
    code = "route_candidates"


class RouteSignatureError(RouteError):
    code = "route_signature"


class RouteSlotError(RouteError):
    code = "route_slot"


class RouteSaltError(RouteError):
    code = "route_salt"


class RouteFingerprintError(RouteError):
    code = "route_fingerprint"


class RevealMismatchError(RouteError):
    code = "reveal_mismatch"


class RouteMismatchError(RouteError):
    code = "route_mismatch"

    def __init__(self, shard: int, expected: str, got: str) -> None:
        super().__init__(f"shard {shard}: the route derives node {expected[:16]}…, got {got[:16]}…")
        self.shard = shard
        self.expected = expected
        self.got = got


def check_candidates(candidates: Sequence[str]) -> tuple[str, ...]:
    """Sorted, unique, well-formed candidate keys (64 lowercase hex), at least one."""
    keys = tuple(sorted(set(candidates)))
    if not keys:
        raise RouteCandidatesError("no candidate for the next shard")
    if len(keys) > MAX_CANDIDATES:
        raise RouteCandidatesError(f"more than {MAX_CANDIDATES} candidates")
    for key in keys:
        if not isinstance(key, str) or not _KEY.match(key):
            raise RouteCandidatesError("candidate keys must be 64 lowercase hex")
    return keys


def candidates_hash(candidates: Sequence[str]) -> bytes:
    keys = check_candidates(candidates)
    return hashlib.sha256(b"".join(bytes.fromhex(k) for k in keys)).digest()


def output_hash(fingerprint: bytes) -> bytes:
    """keccak256 of a forward's fingerprint bytes (one or more blocks)."""
    return keccak(fingerprint)


def route_salt(session: bytes, shard: int, out_hash: bytes) -> bytes:
    return keccak(_SALT_DOMAIN + session + struct.pack(">I", shard) + out_hash)


def route_commitment(session: bytes, shard: int, fingerprint: bytes) -> tuple[bytes, bytes, bytes]:
    """(output_hash, salt, commitment value) of the route slot for this output's fingerprint."""
    out = output_hash(fingerprint)
    salt = route_salt(session, shard, out)
    return out, salt, commitment_value(session, ROUTE_STEP, shard, out, salt)


def next_node(commitment: bytes, next_shard: int, candidates: Sequence[str]) -> str:
    """The node of `next_shard` that a committed output routes to."""
    keys = check_candidates(candidates)
    digest = hashlib.sha256(
        _ROUTE_DOMAIN + commitment + struct.pack(">I", next_shard) + candidates_hash(keys)
    ).digest()
    return keys[int.from_bytes(digest, "big") % len(keys)]


@dataclass(frozen=True)
class RouteStep:
    """What the node of `commitment.shard` hands over with its first answer."""

    commitment: Commitment
    commitment_sig: bytes
    reveal: Reveal
    reveal_sig: bytes
    fingerprint: bytes


def sign_step(
    private_key: bytes | str,
    domain: Domain,
    session: bytes,
    shard: int,
    fingerprint: bytes,
    *,
    manifest_hash: bytes,
    input_hash: bytes,
    signed_at: int,
) -> RouteStep:
    """A node's honest route statement for its output fingerprint (signed under `domain`,
    the FraudProofs EIP-712 domain)."""
    out, salt, value = route_commitment(session, shard, fingerprint)
    commitment = Commitment(session, ROUTE_STEP, shard, value, signed_at)
    reveal = Reveal(session, ROUTE_STEP, shard, manifest_hash, input_hash, out, salt, signed_at)
    return RouteStep(
        commitment,
        commitment.sign(private_key, domain),
        reveal,
        reveal.sign(private_key, domain),
        fingerprint,
    )


def _recover(struct_: Commitment | Reveal, signature: bytes, domain: Domain) -> str:
    try:
        return struct_.recover(signature, domain)
    except ProtocolError as error:
        raise RouteSignatureError(f"{struct_.PRIMARY_TYPE}: {error.message}") from None


def check_step(
    step: RouteStep,
    domain: Domain,
    *,
    node_address: str | None = None,
    next_shard: int | None = None,
    candidates: Sequence[str] = (),
    next_key: str | None = None,
) -> str:
    """Check one route statement; returns the signer's address. With `next_shard` and
    `candidates` (and `next_key`, the node actually used next) also checks the derivation.
    Raises the named RouteErrors of the module docstring, most severe first."""
    c, r = step.commitment, step.reveal
    signer = _recover(c, step.commitment_sig, domain)
    revealer = _recover(r, step.reveal_sig, domain)
    if signer != revealer:
        raise RouteSignatureError(f"commitment signed by {signer}, reveal by {revealer}")
    if node_address is not None and signer.lower() != node_address.lower():
        raise RouteSignatureError(f"signed by {signer}, the node is {node_address}")
    if (c.session, c.step, c.shard) != (r.session, r.step, r.shard):
        raise RouteSlotError("commitment and reveal name different slots")
    if c.step != ROUTE_STEP:
        raise RouteSlotError(f"step {c.step} is not the route slot")
    if r.commitment_value() != c.commitment:
        raise RevealMismatchError("the signed reveal does not open the signed commitment")
    if r.salt != route_salt(r.session, r.shard, r.output_hash):
        raise RouteSaltError("salt is not derived from the output (steering attempt)")
    try:
        decode_blocks(step.fingerprint)
    except FingerprintError as error:
        raise RouteFingerprintError(error.reason) from None
    if output_hash(step.fingerprint) != r.output_hash:
        raise RouteFingerprintError("fingerprint does not hash to the revealed output_hash")
    if next_shard is not None:
        if next_shard != c.shard + 1:
            raise RouteSlotError(f"shard {c.shard} routes shard {c.shard + 1}, not {next_shard}")
        expected = next_node(c.commitment, next_shard, candidates)
        if next_key is not None and next_key != expected:
            raise RouteMismatchError(next_shard, expected, next_key)
    return signer


def fraud_proof_for(
    first: tuple[Commitment, bytes], second: tuple[Commitment, bytes] | tuple[Reveal, bytes]
) -> str | None:
    """Which FraudProofs call a pair of node-signed statements for one slot supports:
    "reveal_mismatch" (commitment + a reveal that does not open it), "equivocation" (two
    different commitments), or None (no fault, or not the same slot)."""
    commitment = first[0]
    other = second[0]
    slot = (commitment.session, commitment.step, commitment.shard)
    if (other.session, other.step, other.shard) != slot:
        return None
    if isinstance(other, Reveal):
        return None if other.commitment_value() == commitment.commitment else "reveal_mismatch"
    return None if other.commitment == commitment.commitment else "equivocation"
