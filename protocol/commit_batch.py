"""Compact binary batches of commit and reveal records: one session per batch, fixed-width fields.

The JSON `commit`/`reveal` txs (`protocol.committee`) spend ~184 bytes and a JSON parse per
commitment; a node commits one record per 32 positions it serves, so the committee chain's
throughput in commitment records is what this format is for. One CometBFT tx:

    offset       size   field
    0            4      magic   b"\\x01PCB"  (a JSON tx starts with `{`, the vote-extension tx
                                            with `\\x00`: the first byte tells the three apart)
    4            1      kind    0x01 commit | 0x02 reveal
    5            32     signer  ed25519 public key (the account, as in JSON txs)
    37           8      nonce   uint64 big-endian, 1 … 2^63 − 1 (the same per-signer counter)
    45           32     session
    77           2      count   uint16 big-endian, 1 … MAX_RECORDS[kind]
    79           n × R  records, strictly ascending by (step, shard):
                          commit (R = 44): step u64 ‖ shard u32 ‖ commitment (32 B)
                          reveal (R = 76): step u64 ‖ shard u32 ‖ output_hash (32 B) ‖ salt (32 B)
    79 + n·R     64     sig     ed25519 over BINARY_SIGN_DOMAIN ‖ bytes[0 : 79 + n·R]

Every field is fixed-width and the records are strictly ordered, so one set of records has
exactly one encoding (the tx hash is not malleable) and duplicates cannot occur without an
order error. A commit batch of 1 024 records is 45 199 bytes (44.1 B per record, against ~184 B
in JSON); a reveal batch holds at most 800 records (60 943 bytes, under `MAX_TX_BYTES`).

`decode_batch(raw)` parses the bytes once into the same typed bodies the JSON txs use
(`CommitBatch` / `RevealBatch` of `CommitmentRecord` / `RevealRecord`, 0x-hex strings), so the
ABCI handlers and their state effects are the same for both encodings. Every malformed input
raises a named `TxDecodeError` subclass (never another exception):

    TxDecodeError (protocol.committee.grammar)
    ├── BatchMagicError           not a binary batch (wrong magic)
    ├── BatchKindError            unknown kind byte
    ├── BatchTruncatedError       fewer bytes than the header/count/signature need
    ├── BatchTrailingBytesError   bytes after the signature
    ├── BatchCountError           count 0 or over the kind's limit
    ├── BatchNonceError           nonce 0 or ≥ 2^63
    ├── BatchOrderError           records not strictly ascending by (step, shard)
    ├── BatchDuplicateError       two records for the same (step, shard)
    └── BatchSizeError            the tx is over MAX_TX_BYTES

`BatchTx.verify()` checks the signature (`TxSignatureError`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.envelope import MAX_TX_BYTES, TxSignatureError, decode
from protocol.committee.grammar import MAX_NONCE, TxDecodeError
from protocol.errors import ProtocolError

MAGIC = b"\x01PCB"
BINARY_SIGN_DOMAIN = b"planet-committee-batch/v1\n"
KIND_COMMIT = 0x01
KIND_REVEAL = 0x02
HEADER = struct.Struct(">4sB32sQ32sH")  # magic, kind, signer, nonce, session, count
HEADER_BYTES = HEADER.size  # 79
SIG_BYTES = 64
COMMIT_RECORD = struct.Struct(">QI32s")  # step, shard, commitment
REVEAL_RECORD = struct.Struct(">QI32s32s")  # step, shard, output_hash, salt
RECORD_BYTES = {KIND_COMMIT: COMMIT_RECORD.size, KIND_REVEAL: REVEAL_RECORD.size}  # 44, 76
MAX_RECORDS = {KIND_COMMIT: 1024, KIND_REVEAL: 800}
KIND_NAMES = {KIND_COMMIT: "commit", KIND_REVEAL: "reveal"}


# --- named errors -------------------------------------------------------------------------------


class BatchMagicError(TxDecodeError):
    def __init__(self, magic: bytes) -> None:
        super().__init__(f"binary batch: magic {magic.hex()} is not {MAGIC.hex()}")
        self.magic = magic


class BatchKindError(TxDecodeError):
    def __init__(self, kind: int) -> None:
        super().__init__(f"binary batch: unknown kind 0x{kind:02x}")
        self.kind = kind


class BatchTruncatedError(TxDecodeError):
    def __init__(self, needed: int, got: int, what: str) -> None:
        super().__init__(f"binary batch: truncated {what}: needs {needed} bytes, got {got}")
        self.needed, self.got = needed, got


class BatchTrailingBytesError(TxDecodeError):
    def __init__(self, extra: int) -> None:
        super().__init__(f"binary batch: {extra} bytes after the signature")
        self.extra = extra


class BatchCountError(TxDecodeError):
    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"binary batch: count {count} outside 1..{limit}")
        self.count, self.limit = count, limit


class BatchNonceError(TxDecodeError):
    def __init__(self, nonce: int) -> None:
        super().__init__(f"binary batch: nonce {nonce} outside 1..{MAX_NONCE}")
        self.nonce = nonce


class BatchOrderError(TxDecodeError):
    def __init__(self, index: int) -> None:
        super().__init__(f"binary batch: record {index} is not after record {index - 1}")
        self.index = index


class BatchDuplicateError(TxDecodeError):
    def __init__(self, index: int, step: int, shard: int) -> None:
        super().__init__(f"binary batch: record {index} repeats (step {step}, shard {shard})")
        self.index, self.step, self.shard = index, step, shard


class BatchSizeError(TxDecodeError):
    def __init__(self, size: int) -> None:
        super().__init__(f"binary batch: {size} bytes, over the {MAX_TX_BYTES}-byte limit")
        self.size = size


# --- the envelope -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchTx:
    """A decoded (or freshly signed) binary batch. Duck-compatible with `SignedTx` where the
    ABCI app uses it: `signer` (hex), `nonce`, `type`, `body`, `raw`, `verify()`, `encode()`."""

    body: CommitBatch | RevealBatch
    signer: str
    nonce: int
    sig: str
    raw: bytes = field(compare=False, repr=False)

    @property
    def type(self) -> str:
        return self.body.TYPE

    @property
    def session(self) -> str:
        first = self.body.commitments if isinstance(self.body, CommitBatch) else self.body.reveals
        return first[0].session

    def sign_bytes(self) -> bytes:
        return BINARY_SIGN_DOMAIN + self.raw[:-SIG_BYTES]

    def encode(self) -> bytes:
        return self.raw

    def verify(self) -> None:
        try:
            VerifyKey(self.raw[5:37]).verify(self.sign_bytes(), self.raw[-SIG_BYTES:])
        except (BadSignatureError, ValueError):
            raise TxSignatureError(self.signer) from None


def is_batch(raw: bytes) -> bool:
    """Whether `raw` claims to be a binary batch (its first byte; `decode_batch` decides)."""
    return raw[:1] == MAGIC[:1]


# --- decode -------------------------------------------------------------------------------------


def decode_batch(raw: bytes) -> BatchTx:
    """Parse a binary batch into typed values (no signature check: call `.verify()`); raises a
    `TxDecodeError` subclass naming the first rule the bytes break."""
    if not isinstance(raw, bytes | bytearray):
        raise TxDecodeError("expected bytes")
    raw = bytes(raw)
    size = len(raw)
    if size > MAX_TX_BYTES:
        raise BatchSizeError(size)
    if size < HEADER_BYTES:
        if raw[: len(MAGIC)] != MAGIC[:size]:
            raise BatchMagicError(raw[: len(MAGIC)])
        raise BatchTruncatedError(HEADER_BYTES, size, "header")
    magic, kind, signer, nonce, session, count = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise BatchMagicError(magic)
    record = RECORD_BYTES.get(kind)
    if record is None:
        raise BatchKindError(kind)
    limit = MAX_RECORDS[kind]
    if not 1 <= count <= limit:
        raise BatchCountError(count, limit)
    if not 1 <= nonce <= MAX_NONCE:
        raise BatchNonceError(nonce)
    end = HEADER_BYTES + count * record
    if size < end + SIG_BYTES:
        raise BatchTruncatedError(end + SIG_BYTES, size, f"{count} records and signature")
    if size > end + SIG_BYTES:
        raise BatchTrailingBytesError(size - end - SIG_BYTES)
    session_hex = "0x" + session.hex()
    body: CommitBatch | RevealBatch
    if kind == KIND_COMMIT:
        rows = list(COMMIT_RECORD.iter_unpack(raw[HEADER_BYTES:end]))
        _check_order([(step, shard) for step, shard, _ in rows])
        body = CommitBatch(
            tuple(
                CommitmentRecord(session_hex, step, shard, "0x" + value.hex())
                for step, shard, value in rows
            )
        )
    else:
        reveal_rows = list(REVEAL_RECORD.iter_unpack(raw[HEADER_BYTES:end]))
        _check_order([(step, shard) for step, shard, _, _ in reveal_rows])
        body = RevealBatch(
            tuple(
                RevealRecord(session_hex, step, shard, "0x" + output.hex(), "0x" + salt.hex())
                for step, shard, output, salt in reveal_rows
            )
        )
    return BatchTx(body=body, signer=signer.hex(), nonce=nonce, sig=raw[end:].hex(), raw=raw)


def _check_order(keys: Sequence[tuple[int, int]]) -> None:
    previous = keys[0]
    for index in range(1, len(keys)):
        current = keys[index]
        if current <= previous:
            if current == previous:
                raise BatchDuplicateError(index, *current)
            raise BatchOrderError(index)
        previous = current


# --- encode -------------------------------------------------------------------------------------


def _b32(value: bytes | str, what: str) -> bytes:
    if isinstance(value, str):
        text = value[2:] if value.startswith("0x") else value
        try:
            value = bytes.fromhex(text)
        except ValueError:
            raise ProtocolError(f"{what}: not hex") from None
    if not isinstance(value, bytes) or len(value) != 32:
        raise ProtocolError(f"{what}: expected 32 bytes")
    return value


def encode_batch(
    kind: int,
    session: bytes | str,
    records: Iterable[tuple[Any, ...]],
    key: SigningKey,
    nonce: int,
) -> bytes:
    """Sign a batch. `records`: (step, shard, commitment) for commits, (step, shard,
    output_hash, salt) for reveals (32-byte values as bytes or 0x-hex); sorted here by
    (step, shard). Raises `ProtocolError` for values the format cannot carry."""
    if kind not in RECORD_BYTES:
        raise ProtocolError(f"unknown batch kind {kind!r}")
    rows = sorted(records, key=lambda r: (r[0], r[1]))
    if not 1 <= len(rows) <= MAX_RECORDS[kind]:
        raise ProtocolError(f"a {KIND_NAMES[kind]} batch holds 1..{MAX_RECORDS[kind]} records")
    if isinstance(nonce, bool) or not isinstance(nonce, int) or not 1 <= nonce <= MAX_NONCE:
        raise ProtocolError(f"nonce {nonce!r} outside 1..{MAX_NONCE}")
    out = bytearray(
        HEADER.pack(
            MAGIC, kind, key.verify_key.encode(), nonce, _b32(session, "session"), len(rows)
        )
    )
    previous: tuple[int, int] | None = None
    for row in rows:
        step, shard = row[0], row[1]
        if not (type(step) is int and type(shard) is int):
            raise ProtocolError("step and shard must be integers")
        if not (0 <= step < 1 << 64 and 0 <= shard < 1 << 32):
            raise ProtocolError(f"step {step} or shard {shard} out of range")
        if previous == (step, shard):
            raise ProtocolError(f"two records for (step {step}, shard {shard})")
        previous = (step, shard)
        if kind == KIND_COMMIT:
            out += COMMIT_RECORD.pack(step, shard, _b32(row[2], "commitment"))
        else:
            out += REVEAL_RECORD.pack(
                step, shard, _b32(row[2], "output_hash"), _b32(row[3], "salt")
            )
    signature = key.sign(BINARY_SIGN_DOMAIN + bytes(out)).signature
    return bytes(out) + signature


def sign_batch(body: CommitBatch | RevealBatch, key: SigningKey, nonce: int) -> BatchTx:
    """The binary form of a JSON-style body whose records share one session."""
    if isinstance(body, CommitBatch):
        kind, items = KIND_COMMIT, body.commitments
        rows = [(c.step, c.shard, c.commitment) for c in items]
    elif isinstance(body, RevealBatch):
        kind, items = KIND_REVEAL, body.reveals
        rows = [(r.step, r.shard, r.output_hash, r.salt) for r in items]
    else:
        raise ProtocolError(f"sign_batch: {type(body).__name__} has no binary form")
    sessions = {item.session for item in items}
    if len(sessions) != 1:
        raise ProtocolError("a binary batch carries one session")
    return decode_batch(encode_batch(kind, sessions.pop(), rows, key, nonce))


def decode_tx(raw: bytes) -> Any:
    """Any committee tx: a binary batch (`decode_batch`) or a JSON tx (`committee.decode`)."""
    if isinstance(raw, bytes | bytearray) and is_batch(raw):
        return decode_batch(raw)
    return decode(raw)
