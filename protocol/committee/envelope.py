"""The signed envelope of every committee tx: `SignedTx`, `sign`, `encode`, `decode`.

`decode` parses and validates tx bytes into a `SignedTx` whose body is the dataclass of its
`type` (`BODY_TYPES`); `verify` checks the ed25519 signature over `SIGN_DOMAIN +
canonical_json({body, nonce, signer, type})`. A tx whose bytes are not exactly the canonical
encoding is rejected (no malleable tx hashes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from protocol.canonical import JsonInputError, canonical_json, canonical_text, parse_json
from protocol.committee.commitments import CommitBatch, RevealBatch
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.committee.credit_locks import CreditLock
from protocol.committee.credits import CreditMint, CreditRedeem, FundMint, MintPartials
from protocol.committee.gateways import GatewayBind
from protocol.committee.grammar import HEX64, MAX_NONCE, TxDecodeError, check
from protocol.committee.prices import SetPrice
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    Leave,
    MoveShards,
    RegisterNode,
    SetNumerics,
)
from protocol.committee.relay_credits import RelayRedeem
from protocol.committee.relays import RegisterRelay
from protocol.committee.settlement import PayoutVote, WorkReport
from protocol.committee.validator_set import ValidatorApprove, ValidatorChange
from protocol.committee.verification import (
    SeedCommit,
    SeedReveal,
    SpotCheckReport,
    VerdictRatify,
    VerdictVote,
    VerifierEndpoint,
    VerifierNumerics,
)
from protocol.errors import ProtocolError

SIGN_DOMAIN = b"planet-committee-tx/v1\n"
MAX_TX_BYTES = 64 * 1024
MAX_TX_DEPTH = 8  # deepest valid tx: envelope → body → list → item (4)
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")


class TxSignatureError(ProtocolError):
    """The ed25519 signature does not verify under the tx's `signer`."""

    code = "tx_bad_signature"

    def __init__(self, signer: str) -> None:
        super().__init__(f"bad ed25519 signature for signer {signer}")
        self.signer = signer


TxBody = (
    RegisterNode
    | Heartbeat
    | Leave
    | AttestStake
    | CommitBatch
    | RevealBatch
    | VerdictVote
    | VerdictRatify
    | WorkReport
    | PayoutVote
    | SeedCommit
    | SeedReveal
    | SpotCheckReport
    | VerifierEndpoint
    | FundMint
    | MintPartials
    | SetPrice
    | CreditLock
    | GatewayBind
    | DkgDeal
    | DkgComplaint
    | DkgJustify
    | CreditMint
    | CreditRedeem
    | RegisterRelay
    | RelayRedeem
    | MoveShards
    | SetNumerics
    | VerifierNumerics
    | ValidatorChange
    | ValidatorApprove
)
BODY_TYPES: dict[str, Any] = {
    cls.TYPE: cls
    for cls in (
        RegisterNode,
        Heartbeat,
        Leave,
        AttestStake,
        CommitBatch,
        RevealBatch,
        VerdictVote,
        VerdictRatify,
        WorkReport,
        PayoutVote,
        SeedCommit,
        SeedReveal,
        SpotCheckReport,
        VerifierEndpoint,
        FundMint,
        MintPartials,
        SetPrice,
        CreditLock,
        GatewayBind,
        DkgDeal,
        DkgComplaint,
        DkgJustify,
        CreditMint,
        CreditRedeem,
        RegisterRelay,
        RelayRedeem,
        MoveShards,
        SetNumerics,
        VerifierNumerics,
        ValidatorChange,
        ValidatorApprove,
    )
}


@dataclass(frozen=True, slots=True)
class SignedTx:
    """A tx body with its signer, nonce and ed25519 signature (`sig` empty until signed).
    `raw` is the canonical tx bytes, set only by `decode` and `sign`."""

    body: Any
    signer: str
    nonce: int
    sig: str = ""
    raw: bytes = field(default=b"", compare=False, repr=False)

    @property
    def type(self) -> str:
        return self.body.TYPE

    def unsigned_json(self) -> dict[str, Any]:
        return {
            "body": self.body.to_json(),
            "nonce": self.nonce,
            "signer": self.signer,
            "type": self.type,
        }

    def sign_bytes(self) -> bytes:
        """What the signer signs: `SIGN_DOMAIN + canonical_json(envelope without sig)`."""
        if self.raw and self.sig:
            # `raw` is always the canonical encoding (set only by `decode` and `sign`), where the
            # signature is the one `"sig"` member: dropping it gives the unsigned canonical form
            # without re-encoding.
            return SIGN_DOMAIN + self.raw.replace(b',"sig":"' + self.sig.encode() + b'"', b"", 1)
        return SIGN_DOMAIN + canonical_json(self.unsigned_json())

    def encode(self) -> bytes:
        """The tx bytes sent to CometBFT (canonical JSON with `sig`)."""
        if not self.sig:
            raise ProtocolError("encode: tx is not signed")
        return canonical_json({**self.unsigned_json(), "sig": self.sig})

    def verify(self) -> None:
        """Check the ed25519 signature; raises `TxSignatureError`."""
        try:
            VerifyKey(bytes.fromhex(self.signer)).verify(self.sign_bytes(), bytes.fromhex(self.sig))
        except (BadSignatureError, ValueError):
            raise TxSignatureError(self.signer) from None


def sign(body: Any, key: SigningKey, nonce: int) -> SignedTx:
    """Build and sign a tx: `signer` is `key`'s public key."""
    if type(body).TYPE not in BODY_TYPES:
        raise ProtocolError(f"sign: unknown body type {type(body).__name__}")
    check.integer(nonce, "nonce", 1, MAX_NONCE)
    unsigned = SignedTx(body=body, signer=key.verify_key.encode().hex(), nonce=nonce)
    sig = key.sign(unsigned.sign_bytes()).signature.hex()
    signed = SignedTx(body=body, signer=unsigned.signer, nonce=nonce, sig=sig)
    return replace(signed, raw=signed.encode())


def encode(tx: SignedTx) -> bytes:
    """Canonical tx bytes (same as `tx.encode()`)."""
    return tx.encode()


def decode(raw: bytes) -> SignedTx:
    """Parse and validate tx bytes (no signature check: call `.verify()`); raises
    `TxDecodeError`."""
    if not isinstance(raw, bytes | bytearray):
        raise TxDecodeError("expected bytes")
    if len(raw) > MAX_TX_BYTES:
        raise TxDecodeError(f"tx is {len(raw)} bytes, over the {MAX_TX_BYTES}-byte limit")
    if raw[:1] != b"{":
        raise TxDecodeError("not a JSON object")
    try:
        doc = parse_json(raw, max_bytes=MAX_TX_BYTES, max_depth=MAX_TX_DEPTH, max_int_digits=20)
    except JsonInputError as error:
        raise TxDecodeError(error.message) from None
    envelope = check.exact_object(doc, "tx", {"body", "nonce", "sig", "signer", "type"})
    kind = envelope["type"]
    body_cls = BODY_TYPES.get(kind) if isinstance(kind, str) else None
    if body_cls is None:
        raise TxDecodeError(f"unknown tx type {ascii(kind)[:80]}")
    tx = SignedTx(
        body=body_cls.from_json(envelope["body"]),
        signer=check.text(envelope["signer"], "signer", HEX64),
        nonce=check.integer(envelope["nonce"], "nonce", 1, MAX_NONCE),
        sig=check.text(envelope["sig"], "sig", _HEX128),
        raw=bytes(raw),
    )
    # The schema checks above admit only strings, integers and lists/objects of them (no
    # floats), so plain sorted compact json.dumps is the canonical encoding here.
    if canonical_text(doc).encode() != raw:
        raise TxDecodeError("bytes are not the canonical encoding")
    return tx
