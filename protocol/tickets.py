"""Spot-check tickets: a node's inputs for one selected block, sealed to one verifier.

When a (node, session, block, shard) triple is selected (`protocol.spotcheck`), the assigned
verifier asks the node for a ticket (`TicketRequest`, signed with the verifier's ed25519 key)
and the node answers with a **context-free** ticket, signed with the node's ed25519 key over
(request hash ‖ ticket) and sealed to the verifier (libsodium sealed box, X25519 from the
verifier's ed25519 key): sealed = SealedBox(verifier).encrypt(node signature (64 B) ‖ ticket).
Nothing in a ticket names a session, user, query or layer: only what a stateless recomputation
needs.

Ticket bytes (the sealed plaintext), big-endian integers, every byte accounted for:

    magic  "PTK\\x01"             4   format version 1
    dtype  u8                     1   1 = float32 little-endian (the only one)
    hidden u16                    2   activation width H (1 … 16384)
    block  u32                    4   checked positions [32·block, count)
    count  u32                    4   positions carried [0, count); 32·block < count ≤ 32·block + 32
    salt   32 B                  32   the salt of the node's commitment to this block
    fplen  u16                    2   = 2 + 8·(count − 32·block)
    fingerprint                fplen  the committed fingerprint block (protocol.fingerprint)
    inputs                count·H·4   the node's input activations for positions [0, count)

A verifier recomputes the node's shard over `inputs` in one prefill, compares its own top-k of
the block's positions with `fingerprint` (tolerance per quant mode), and checks that
`fingerprint` and `salt` open the commitment the node put on the committee chain before the
selection existed — so a node cannot hand over an honest fingerprint once it learns it was drawn.

Errors (all `TicketError`, a `ProtocolError`), each named for what broke:

    TicketError
    ├── TicketTooLargeError        more bytes than the limits allow (checked before parsing)
    ├── TicketTruncatedError       fewer bytes than the header announces
    ├── TicketTrailingBytesError   bytes after the last input value
    ├── TicketMagicError           not a ticket, or another format version
    ├── TicketFieldError           a header field outside its range (dtype, hidden, block, count)
    ├── TicketFingerprintError     the fingerprint block is malformed or not for these positions
    ├── TicketNonFiniteError       an input is NaN or ±inf
    ├── TicketSealError            the sealed box does not open with this key (tampered, other
    │                              key), or the node's signature inside does not verify
    └── TicketRequestError         a ticket request that is malformed or not validly signed
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

from protocol.canonical import JsonInputError, canonical_json, parse_json
from protocol.errors import ProtocolError
from protocol.fingerprint import (
    BLOCK_POSITIONS,
    BYTES_PER_POSITION,
    HEADER_BYTES,
    FingerprintError,
    decode_block,
)
from protocol.spotcheck import SelectionError, Triple

MAGIC: Final = b"PTK\x01"
DTYPE_FLOAT32: Final = 1
MAX_HIDDEN: Final = 16_384
MAX_POSITIONS: Final = 8_192
_HEADER = struct.Struct(">4sBHII32sH")  # magic, dtype, hidden, block, count, salt, fplen
HEADER_SIZE: Final = _HEADER.size  # 49
MAX_TICKET_BYTES: Final = 64 * 1024 * 1024  # plaintext cap: 8192 positions of H = 2048
MAX_SEALED_BYTES: Final = MAX_TICKET_BYTES + 48 + 64  # sealed box (32-byte key + 16 MAC) + sig
_SEALED_OVERHEAD: Final = 48


# ---- errors -----------------------------------------------------------------------------------
class TicketError(ProtocolError):
    """A ticket (or ticket request) that breaks the format."""

    code = "bad_ticket"

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad ticket: {reason}")
        self.reason = reason


class TicketTooLargeError(TicketError):
    code = "ticket_too_large"


class TicketTruncatedError(TicketError):
    code = "ticket_truncated"


class TicketTrailingBytesError(TicketError):
    code = "ticket_trailing_bytes"


class TicketMagicError(TicketError):
    code = "ticket_magic"


class TicketFieldError(TicketError):
    code = "ticket_field"


class TicketFingerprintError(TicketError):
    code = "ticket_fingerprint"


class TicketNonFiniteError(TicketError):
    code = "ticket_non_finite"


class TicketSealError(TicketError):
    code = "ticket_seal"


class TicketRequestError(TicketError):
    code = "ticket_request"


# ---- the ticket -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ticket:
    """A parsed ticket. `inputs` is float32 [1, count, hidden] (read-only)."""

    block: int
    salt: bytes
    fingerprint: bytes
    inputs: np.ndarray

    @property
    def count(self) -> int:
        return int(self.inputs.shape[1])

    @property
    def hidden(self) -> int:
        return int(self.inputs.shape[2])

    @property
    def start(self) -> int:
        """First checked position (32·block)."""
        return self.block * BLOCK_POSITIONS


def _check_shape(block: int, count: int, hidden: int) -> None:
    if not 1 <= hidden <= MAX_HIDDEN:
        raise TicketFieldError(f"hidden size {hidden} outside 1…{MAX_HIDDEN}")
    if not 1 <= count <= MAX_POSITIONS:
        raise TicketFieldError(f"{count} positions outside 1…{MAX_POSITIONS}")
    start = block * BLOCK_POSITIONS
    if not start < count <= start + BLOCK_POSITIONS:
        raise TicketFieldError(
            f"block {block} covers positions from {start}; {count} positions carried"
        )


def _check_fingerprint(fingerprint: bytes, checked: int) -> None:
    try:
        block, used = decode_block(fingerprint)
    except FingerprintError as error:
        raise TicketFingerprintError(error.reason) from None
    if used != len(fingerprint):
        raise TicketFingerprintError(f"{len(fingerprint) - used} bytes after the block")
    if block.positions != checked:
        raise TicketFingerprintError(
            f"fingerprint of {block.positions} positions for a block of {checked}"
        )


def encode_ticket(block: int, salt: bytes, fingerprint: bytes, inputs: np.ndarray) -> bytes:
    """Ticket bytes; `inputs` [1, count, H] or [count, H], any float dtype (sent as float32)."""
    array = np.asarray(inputs)
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2:
        raise TicketFieldError(f"inputs must be [1, T, H] or [T, H], got {list(array.shape)}")
    count, hidden = (int(v) for v in array.shape)
    if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block <= 2**32 - 1:
        raise TicketFieldError(f"block {block!r} outside 0…2^32−1")
    _check_shape(block, count, hidden)
    if not isinstance(salt, bytes) or len(salt) != 32:
        raise TicketFieldError("salt must be 32 bytes")
    _check_fingerprint(fingerprint, count - block * BLOCK_POSITIONS)
    values = np.ascontiguousarray(array, dtype="<f4")
    if not np.isfinite(values).all():
        raise TicketNonFiniteError("inputs contain NaN or inf")
    header = _HEADER.pack(MAGIC, DTYPE_FLOAT32, hidden, block, count, salt, len(fingerprint))
    size = HEADER_SIZE + len(fingerprint) + values.nbytes
    if size > MAX_TICKET_BYTES:
        raise TicketTooLargeError(f"{size} bytes exceed {MAX_TICKET_BYTES}")
    return header + fingerprint + values.tobytes()


def decode_ticket(data: bytes) -> Ticket:
    """Parse ticket bytes; every malformed input raises a named `TicketError`."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TicketFieldError("ticket must be bytes")
    data = bytes(data)
    if len(data) > MAX_TICKET_BYTES:
        raise TicketTooLargeError(f"{len(data)} bytes exceed {MAX_TICKET_BYTES}")
    if len(data) < 4 or data[:4] != MAGIC:
        raise TicketMagicError("not a version-1 ticket")
    if len(data) < HEADER_SIZE:
        raise TicketTruncatedError(f"header needs {HEADER_SIZE} bytes, got {len(data)}")
    _, dtype, hidden, block, count, salt, fplen = _HEADER.unpack_from(data)
    if dtype != DTYPE_FLOAT32:
        raise TicketFieldError(f"unknown dtype {dtype}")
    _check_shape(block, count, hidden)
    checked = count - block * BLOCK_POSITIONS
    if fplen != HEADER_BYTES + checked * BYTES_PER_POSITION:
        raise TicketFingerprintError(f"fingerprint length {fplen} for {checked} positions")
    need = HEADER_SIZE + fplen + count * hidden * 4
    if len(data) < need:
        raise TicketTruncatedError(f"ticket needs {need} bytes, got {len(data)}")
    if len(data) > need:
        raise TicketTrailingBytesError(f"{len(data) - need} bytes after the inputs")
    fingerprint = data[HEADER_SIZE : HEADER_SIZE + fplen]
    _check_fingerprint(fingerprint, checked)
    values = np.frombuffer(data, dtype="<f4", offset=HEADER_SIZE + fplen).reshape(1, count, hidden)
    if not np.isfinite(values).all():
        raise TicketNonFiniteError("inputs contain NaN or inf")
    return Ticket(block=block, salt=salt, fingerprint=fingerprint, inputs=values)


# ---- sealing ----------------------------------------------------------------------------------
def _verify_key(verifier: str | bytes) -> VerifyKey:
    raw = bytes.fromhex(verifier) if isinstance(verifier, str) and _HEX64.match(verifier) else None
    if raw is None and isinstance(verifier, bytes) and len(verifier) == 32:
        raw = verifier
    if raw is None:
        raise TicketRequestError("verifier key must be 32 bytes (64 lowercase hex)")
    return VerifyKey(raw)


_TICKET_SIG_DOMAIN = b"planet-ticket/v1\n"
SIGNATURE_BYTES: Final = 64


def _ticket_sign_bytes(request: TicketRequest, ticket_bytes: bytes) -> bytes:
    return _TICKET_SIG_DOMAIN + hashlib.sha256(request.sign_bytes()).digest() + ticket_bytes


def seal(ticket_bytes: bytes, request: TicketRequest, node_key: SigningKey) -> bytes:
    """Sign ticket bytes with the node's ed25519 key, bound to the request it answers (so it
    cannot be replayed for another triple or verifier), and seal signature ‖ ticket to the
    request's verifier (the X25519 twin of its ed25519 key): only that verifier opens it."""
    if node_key.verify_key.encode().hex() != request.triple.node:
        raise TicketRequestError("the request names another node")
    try:
        public: PublicKey = _verify_key(request.verifier).to_curve25519_public_key()
    except CryptoError:
        raise TicketRequestError("verifier key is not a valid ed25519 point") from None
    signature = node_key.sign(_ticket_sign_bytes(request, ticket_bytes)).signature
    return SealedBox(public).encrypt(signature + ticket_bytes)


def unseal(sealed: bytes, request: TicketRequest, verifier_key: SigningKey) -> bytes:
    """Open a sealed ticket with the verifier's ed25519 signing key and check the node's
    signature over it (bound to `request`): the node's signed statement, signature ‖ ticket
    bytes — what the verifier may forward to its peers (`forward`)."""
    if not isinstance(sealed, bytes | bytearray | memoryview):
        raise TicketSealError("sealed ticket must be bytes")
    if len(sealed) > MAX_SEALED_BYTES:
        raise TicketTooLargeError(f"{len(sealed)} sealed bytes exceed {MAX_SEALED_BYTES}")
    if len(sealed) <= _SEALED_OVERHEAD + SIGNATURE_BYTES:
        raise TicketSealError("too short to be a sealed ticket")
    if verifier_key.verify_key.encode().hex() != request.verifier:
        raise TicketSealError("this key is not the request's verifier")
    private: PrivateKey = verifier_key.to_curve25519_private_key()
    try:
        plain = SealedBox(private).decrypt(bytes(sealed))
    except CryptoError:
        raise TicketSealError(
            "does not open with this verifier's key (tampered or not ours)"
        ) from None
    _check_statement(plain, request)
    return plain


def _check_statement(statement: bytes, request: TicketRequest) -> None:
    """The node of `request.triple` signed the ticket bytes in `statement` for `request`."""
    signature, ticket_bytes = statement[:SIGNATURE_BYTES], statement[SIGNATURE_BYTES:]
    try:
        VerifyKey(bytes.fromhex(request.triple.node)).verify(
            _ticket_sign_bytes(request, ticket_bytes), signature
        )
    except (BadSignatureError, ValueError):
        raise TicketSealError("not signed by the node for this request") from None


def open_sealed(sealed: bytes, request: TicketRequest, verifier_key: SigningKey) -> Ticket:
    """Open a sealed ticket with the verifier's ed25519 signing key, check the node's signature
    over it (bound to `request`) and parse it."""
    return decode_ticket(unseal(sealed, request, verifier_key)[SIGNATURE_BYTES:])


# ---- forwarding a node's signed ticket to another verifier ------------------------------------
# A node may answer the verifier a check is assigned to and withhold the ticket from the others.
# The finder then forwards what it holds: its own signed request and the node's signed statement
# (signature ‖ ticket bytes), sealed to one peer verifier. Both signatures check without the
# finder's help, and the ticket opens the node's commitment, so the peer judges the node's own
# bytes — the finder cannot forge or alter them.
#
#     sealed to the peer: "PFW\x01" ‖ u16 request length ‖ request (canonical JSON) ‖ statement
FORWARD_MAGIC: Final = b"PFW\x01"
MAX_FORWARDED_BYTES: Final = MAX_SEALED_BYTES + 6 + 2048  # + magic, length, request


def forward(request: TicketRequest, statement: bytes, peer: str) -> bytes:
    """The node's `statement` for `request`, with the request, sealed to verifier `peer`."""
    _check_statement(statement, request)
    try:
        public: PublicKey = _verify_key(peer).to_curve25519_public_key()
    except CryptoError:
        raise TicketRequestError("peer key is not a valid ed25519 point") from None
    encoded = request.encode()
    plain = FORWARD_MAGIC + struct.pack(">H", len(encoded)) + encoded + statement
    return SealedBox(public).encrypt(plain)


def open_forwarded(sealed: bytes, verifier_key: SigningKey) -> tuple[TicketRequest, bytes, Ticket]:
    """A forwarded ticket opened with this verifier's key: the finder's request (its signature
    checked), the node's statement (its signature checked) and the parsed ticket. Whether the
    request names the selected check is the caller's to compare."""
    if not isinstance(sealed, bytes | bytearray | memoryview):
        raise TicketSealError("forwarded ticket must be bytes")
    if len(sealed) > MAX_FORWARDED_BYTES:
        raise TicketTooLargeError(f"{len(sealed)} forwarded bytes exceed {MAX_FORWARDED_BYTES}")
    try:
        plain = SealedBox(verifier_key.to_curve25519_private_key()).decrypt(bytes(sealed))
    except CryptoError:
        raise TicketSealError("forwarded ticket does not open with this verifier's key") from None
    if len(plain) < 6 or plain[:4] != FORWARD_MAGIC:
        raise TicketMagicError("not a version-1 forwarded ticket")
    (length,) = struct.unpack_from(">H", plain, 4)
    if len(plain) < 6 + length + SIGNATURE_BYTES:
        raise TicketTruncatedError("forwarded ticket shorter than its request and signature")
    request = decode_request(plain[6 : 6 + length])
    request.verify()
    statement = plain[6 + length :]
    _check_statement(statement, request)
    return request, statement, decode_ticket(statement[SIGNATURE_BYTES:])


# ---- the request ------------------------------------------------------------------------------
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")
_REQUEST_DOMAIN = b"planet-ticket-request/v1\n"
_REQUEST_KEYS = frozenset({"node", "session", "block", "shard", "seed", "verifier", "sig"})
MAX_REQUEST_BYTES: Final = 2048


@dataclass(frozen=True)
class TicketRequest:
    """A verifier's signed request for the ticket of one selected triple under `seed` (the
    epoch seed that selected it, `0x` + 64 hex)."""

    triple: Triple
    seed: str
    verifier: str  # ed25519 key, 64 hex
    sig: str = ""  # 128 hex

    def body(self) -> dict[str, Any]:
        return {
            "block": self.triple.block,
            "node": self.triple.node,
            "seed": self.seed,
            "session": self.triple.session,
            "shard": self.triple.shard,
            "verifier": self.verifier,
        }

    def sign_bytes(self) -> bytes:
        return _REQUEST_DOMAIN + canonical_json(self.body())

    def signed(self, key: SigningKey) -> TicketRequest:
        if key.verify_key.encode().hex() != self.verifier:
            raise TicketRequestError("signing key is not the request's verifier")
        sig = key.sign(self.sign_bytes()).signature.hex()
        return TicketRequest(self.triple, self.seed, self.verifier, sig)

    def encode(self) -> bytes:
        return canonical_json({**self.body(), "sig": self.sig})

    def verify(self) -> None:
        try:
            _verify_key(self.verifier).verify(self.sign_bytes(), bytes.fromhex(self.sig))
        except (BadSignatureError, ValueError):
            raise TicketRequestError("signature does not verify under the verifier key") from None


def decode_request(raw: bytes) -> TicketRequest:
    """Parse (not verify) a ticket request: exact keys, typed fields, canonical bytes."""
    if not isinstance(raw, bytes) or len(raw) > MAX_REQUEST_BYTES:
        raise TicketRequestError(f"request must be at most {MAX_REQUEST_BYTES} bytes")
    try:
        value = parse_json(raw, max_bytes=MAX_REQUEST_BYTES, max_depth=1, max_int_digits=20)
    except JsonInputError as error:
        raise TicketRequestError(f"not a JSON object: {error.message}") from None
    if not isinstance(value, dict) or set(value) != _REQUEST_KEYS:
        raise TicketRequestError(f"keys must be exactly {sorted(_REQUEST_KEYS)}")
    for name in ("seed", "verifier", "sig"):
        if not isinstance(value[name], str):
            raise TicketRequestError(f"{name} must be a string")
    seed = value["seed"]
    if not (seed.startswith("0x") and _HEX64.match(seed[2:])):
        raise TicketRequestError("seed must be 0x + 64 lowercase hex")
    if not _HEX64.match(value["verifier"]):
        raise TicketRequestError("verifier must be 64 lowercase hex")
    if not _HEX128.match(value["sig"]):
        raise TicketRequestError("sig must be 128 lowercase hex")
    for name in ("block", "shard"):
        if type(value[name]) is not int:
            raise TicketRequestError(f"{name} must be an integer")
    try:
        triple = Triple(value["node"], value["session"], value["block"], value["shard"])
    except SelectionError as error:
        raise TicketRequestError(error.reason) from None
    request = TicketRequest(triple, seed, value["verifier"], value["sig"])
    if request.encode() != raw:
        raise TicketRequestError("not the canonical encoding")
    return request
