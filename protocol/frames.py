"""Binary activation frames: the bytes that carry hidden states between a client and shard nodes.

Layout (all integers big-endian):

    offset  size  field
    0       4     magic  b"PLAF"
    4       2     version (1)
    6       4     header length L (bytes, <= MAX_HEADER_BYTES)
    10      L     header: canonical JSON (protocol.canonical), see FrameHeader
    10+L    ...   body: the tensor, encoded by the header's codec

Header fields: session (the hop's session capability: a random secret the client drew for this
node alone; the node keys the session by `session_tag(capability)` and never learns another
hop's capability; never a user or query id), step (the client's step counter),
positions {"start", "count"} (absolute positions of the T rows; a list form [s, s+1, ...] is
accepted when contiguous), dtype ("float32" | "float16": what the receiver gets back),
shape [1, T, H], codec, shard (the shard this frame is for / came from), last_only (ask the node
to return only the last position).

Codecs (the body):
- "raw": the tensor in `dtype`, little-endian, C order.
- "hq9" (what `--compress` used until "rq"): each block of 64 values is rotated by the orthonormal
  Walsh-Hadamard matrix (spreads outlier channels over the block), then quantized absmax to
  9-bit signed codes [-255, 255]: body = scales (n_blocks x float32 LE) + low bytes of the
  codes + 1 packed bit per value (bit 8). 76 bytes per 64 values = 29.7 % of fp32; relative
  error ~0.25 % per hop, measured to keep greedy tokens unchanged where plain int8 did not.
- "ohq7" (opt-in): per block of 64 values, the largest-magnitude
  value is split off and sent exactly (uint8 index in the block + float32 value), the rest is
  rotated by the Walsh-Hadamard matrix and quantized absmax to 7-bit signed codes [-63, 63]
  with a float16 scale (rounded up, so no code clips). body = indices (n_blocks x uint8) +
  outlier values (n_blocks x float32 LE) + scales (n_blocks x float16 LE) + codes (7 bits per
  value, offset +63, packed little-endian bit order). 63 bytes per 64 values = 24.6 % of fp32.
  Splitting the outlier off first keeps the residual stream's few huge channels (and token
  0's ~22,500) from inflating the step of the 63 ordinary values sharing their block.
- "rq" (what `--compress` uses; variable rate, protocol/codec_rq.py): each token's values
  rounded to integer multiples of one step (its rms x 2**(-29/4)) and Rice-coded; the receiver
  multiplies integers by the token's float32 step. ~28 % of fp32 on SmolLM2 residual streams,
  closer to the uncompressed chain than hq9 (docs/compute.md).
  parse_frame checks its body against bounds (codec_rq.body_bounds), the decoder the rest.
- "int8": blockwise absmax int8 (Nesa sec. 4). The flattened tensor is cut in blocks of
  INT8_BLOCK values; each block stores one float32 scale (absmax / 127) and one int8 per value:
  body = scales (n_blocks x float32 LE) + codes (N x int8). 68 bytes per 64 values = 26.6 % of
  fp32. Blocks never mix large and small rows much because H (576) is a multiple of the block.

Validation is strict and every rejection is a typed `FrameError` with a stable `code`, so a node
answers a 4xx JSON `{code, message}` and keeps serving. Pure numpy; no torch, no aiohttp here.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

from protocol import codec_rq
from protocol.canonical import canonical_json
from protocol.errors import ProtocolError

MAGIC: Final = b"PLAF"
VERSION: Final = 1
_PREFIX = struct.Struct(">4sHI")
PREFIX_BYTES: Final = _PREFIX.size  # 10
MAX_HEADER_BYTES: Final = 4096
INT8_BLOCK: Final = 64
_FP16_MAX: Final = 65504.0

DTYPES: Final[dict[str, np.dtype]] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
}
# Codec names are wire format: append new ones, never rename or reuse one.
CODECS: Final = ("raw", "int8", "hq9", "ohq7", "rq")
# Codecs whose body size depends on the values (checked against bounds, not one size).
VARIABLE_CODECS: Final = frozenset({"rq"})
# What clients use when asked to compress: hq9 (29.7 % of fp32). rq is 1.6 points smaller and a
# little closer to the uncompressed chain teacher-forced, but costs 6-25x hq9's CPU per token
# (up to ~10 ms per generated token over 3 hops), so it stays opt-in (docs/compute.md).
COMPRESSED_CODEC: Final = "hq9"
SESSION_MIN_CHARS: Final = 22  # 22 base64url characters carry >= 128 bits
SESSION_MAX_CHARS: Final = 64
_SESSION_RE = re.compile(rf"[A-Za-z0-9_-]{{{SESSION_MIN_CHARS},{SESSION_MAX_CHARS}}}")
_SESSION_TAG_DOMAIN: Final = b"planet/session-tag/v1\x00"
MAX_HEADER_DEPTH: Final = 3  # {header: {positions: ...}, shape: [...]} nests 2 deep
_MAX_STEP: Final = 2**53
_MAX_POSITION: Final = 2**31 - 1
_MAX_SHARD: Final = 2**16
_HEADER_KEYS: Final = frozenset(
    {"session", "step", "positions", "dtype", "shape", "codec", "shard", "last_only"}
)


# --------------------------------------------------------------------------------------- errors
class FrameError(ProtocolError):
    """A frame (or the session it names) was rejected. `code` names the reason."""

    code = "bad_frame"
    http_status = 400


class BadMagicError(FrameError):
    code = "bad_magic"


class BadVersionError(FrameError):
    code = "bad_version"


class BadHeaderError(FrameError):
    code = "bad_header"


class BadSessionIdError(FrameError):
    code = "bad_session_id"


class BadDtypeError(FrameError):
    code = "bad_dtype"


class BadCodecError(FrameError):
    code = "bad_codec"


class BadShapeError(FrameError):
    code = "bad_shape"


class BadPositionsError(FrameError):
    code = "bad_positions"


class BadBodyError(FrameError):
    code = "bad_body"


class NonFiniteError(FrameError):
    code = "non_finite"


class TooLargeError(FrameError):
    code = "too_large"
    http_status = 413


class UnknownSessionError(FrameError):
    code = "unknown_session"
    http_status = 404

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session} is not open on this node; start it at position 0",
            hint="open a new session (positions.start = 0)",
        )


class SessionExpiredError(FrameError):
    code = "session_expired"
    http_status = 410

    def __init__(self, session: str) -> None:
        super().__init__(
            f"session {session} was evicted (idle too long or deleted); its KV cache is gone",
            hint="start a new session from position 0",
        )


class WrongShardError(FrameError):
    code = "wrong_shard"
    http_status = 409

    def __init__(self, got: int, served: int) -> None:
        super().__init__(f"frame is for shard {got} but this node serves shard {served}")


# --------------------------------------------------------------------------------------- types
@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What a receiver accepts. hidden_size None = any; sizes in tokens and bytes."""

    hidden_size: int | None = None
    max_tokens: int = 8192
    max_body_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FrameHeader:
    session: str
    step: int
    start: int
    count: int
    dtype: str
    shape: tuple[int, int, int]
    codec: str
    shard: int
    last_only: bool = False

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.count)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "session": self.session,
            "step": self.step,
            "positions": {"start": self.start, "count": self.count},
            "dtype": self.dtype,
            "shape": list(self.shape),
            "codec": self.codec,
            "shard": self.shard,
        }
        if self.last_only:
            body["last_only"] = True
        return body


@dataclass(frozen=True, slots=True)
class Frame:
    """A parsed frame: header plus the encoded body (kept for zero-copy relaying)."""

    header: FrameHeader
    body: memoryview

    def array(self) -> np.ndarray:
        """The tensor as a writable float32 array of `header.shape`."""
        return decode_body(self.header, self.body)


# --------------------------------------------------------------------------------------- codecs
def _encode_int8(values: np.ndarray) -> bytes:
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n = flat.size
    n_blocks = -(-n // INT8_BLOCK)
    padded = np.zeros(n_blocks * INT8_BLOCK, dtype=np.float32)
    padded[:n] = flat
    blocks = padded.reshape(n_blocks, INT8_BLOCK)
    absmax = np.abs(blocks).max(axis=1)
    scales = (absmax / 127.0).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    codes = np.rint(blocks / safe[:, None]).clip(-127, 127).astype(np.int8).reshape(-1)[:n]
    return scales.astype("<f4").tobytes() + codes.tobytes()


def _decode_int8(body: memoryview, n: int) -> np.ndarray:
    n_blocks = -(-n // INT8_BLOCK)
    expected = n_blocks * 4 + n
    if len(body) != expected:
        raise BadBodyError(f"int8 body is {len(body)} bytes, expected {expected}")
    scales = np.frombuffer(body, dtype="<f4", count=n_blocks)
    if not np.isfinite(scales).all():
        raise NonFiniteError("int8 block scales contain NaN or Inf")
    codes = np.frombuffer(body, dtype=np.int8, offset=n_blocks * 4, count=n)
    padded = np.zeros(n_blocks * INT8_BLOCK, dtype=np.float32)
    padded[:n] = codes
    out = padded.reshape(n_blocks, INT8_BLOCK) * scales.astype(np.float32)[:, None]
    return out.reshape(-1)[:n]


def _hadamard(n: int) -> np.ndarray:
    """Orthonormal, symmetric Walsh-Hadamard matrix (n a power of two): H @ H = I."""
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


_H64: Final = _hadamard(INT8_BLOCK)
_HQ9_MAX: Final = 255


def _encode_hq9(values: np.ndarray) -> bytes:
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n = flat.size
    n_blocks = -(-n // INT8_BLOCK)
    padded = np.zeros(n_blocks * INT8_BLOCK, dtype=np.float32)
    padded[:n] = flat
    rotated = padded.reshape(n_blocks, INT8_BLOCK) @ _H64
    scales = (np.abs(rotated).max(axis=1) / _HQ9_MAX).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1.0))
    codes = np.rint(rotated / safe[:, None]).clip(-_HQ9_MAX, _HQ9_MAX).astype(np.int16)
    unsigned = (codes.reshape(-1) + _HQ9_MAX).astype(np.uint16)  # [0, 510]
    low = (unsigned & 0xFF).astype(np.uint8)
    high = np.packbits((unsigned >> 8).astype(np.uint8), bitorder="little")
    return scales.astype("<f4").tobytes() + low.tobytes() + high.tobytes()


def _decode_hq9(body: memoryview, n: int) -> np.ndarray:
    n_blocks = -(-n // INT8_BLOCK)
    padded_n = n_blocks * INT8_BLOCK
    expected = body_size("float32", "hq9", n)
    if len(body) != expected:
        raise BadBodyError(f"hq9 body is {len(body)} bytes, expected {expected}")
    scales = np.frombuffer(body, dtype="<f4", count=n_blocks)
    if not np.isfinite(scales).all():
        raise NonFiniteError("hq9 block scales contain NaN or Inf")
    low = np.frombuffer(body, dtype=np.uint8, offset=n_blocks * 4, count=padded_n)
    high = np.unpackbits(
        np.frombuffer(body, dtype=np.uint8, offset=n_blocks * 4 + padded_n),
        count=padded_n,
        bitorder="little",
    )
    unsigned = low.astype(np.int32) | (high.astype(np.int32) << 8)
    if unsigned.max(initial=0) > 2 * _HQ9_MAX:
        raise BadBodyError("hq9 code out of range")
    codes = (unsigned - _HQ9_MAX).astype(np.float32).reshape(n_blocks, INT8_BLOCK)
    out = (codes * scales.astype(np.float32)[:, None]) @ _H64
    return out.reshape(-1)[:n]


_OHQ_BITS: Final = 7  # the registered "ohq7"; other widths exist only for measurements


def ohq_block_bytes(bits: int = _OHQ_BITS) -> int:
    """Bytes per block of 64 values: outlier index, outlier value, scale, packed codes."""
    return 1 + 4 + 2 + INT8_BLOCK * bits // 8


def _pack_bits(codes: np.ndarray, bits: int) -> bytes:
    """uint8 codes < 2**bits → their low `bits` bits, concatenated (little-endian bit order)."""
    unpacked = np.unpackbits(codes.reshape(-1, 1), axis=1, bitorder="little")[:, :bits]
    return np.packbits(unpacked.reshape(-1), bitorder="little").tobytes()


def _unpack_bits(data: memoryview, count: int, bits: int) -> np.ndarray:
    """Inverse of _pack_bits: `count` uint8 codes (the caller checked len(data))."""
    flat = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=count * bits, bitorder="little")
    wide = np.zeros((count, 8), dtype=np.uint8)
    wide[:, :bits] = flat.reshape(count, bits)
    return np.packbits(wide, axis=1, bitorder="little").reshape(-1)


def encode_ohq(values: np.ndarray, bits: int = _OHQ_BITS) -> bytes:
    """The ohq body of `values` with `bits`-bit codes (2..8; the wire codec "ohq7" is 7)."""
    qmax = 2 ** (bits - 1) - 1
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n = flat.size
    n_blocks = -(-n // INT8_BLOCK)
    padded = np.zeros(n_blocks * INT8_BLOCK, dtype=np.float32)
    padded[:n] = flat
    blocks = padded.reshape(n_blocks, INT8_BLOCK)
    rows = np.arange(n_blocks)
    index = np.abs(blocks).argmax(axis=1)
    outlier = blocks[rows, index].astype("<f4")
    rest = blocks.copy()
    rest[rows, index] = 0.0
    rotated = rest @ _H64
    exact = np.abs(rotated).max(axis=1) / qmax
    if not (np.isfinite(exact).all() and np.isfinite(outlier).all()) or (
        exact.max(initial=0.0) > _FP16_MAX
    ):
        raise NonFiniteError(
            f"activations are not finite or too large for ohq{bits} (scale overflows float16)"
        )
    scales = exact.astype(np.float16)
    low = scales.astype(np.float32) < exact
    scales[low] = np.nextafter(scales[low], np.float16(np.inf))  # round up: no code clips
    if not np.isfinite(scales).all():
        raise NonFiniteError(f"activations too large for ohq{bits} (scale overflows float16)")
    safe = np.where(scales > 0, scales.astype(np.float32), np.float32(1.0))
    codes = np.rint(rotated / safe[:, None]).clip(-qmax, qmax) + qmax
    return b"".join(
        (
            index.astype(np.uint8).tobytes(),
            outlier.tobytes(),
            scales.astype("<f2").tobytes(),
            _pack_bits(codes.astype(np.uint8), bits),
        )
    )


def decode_ohq(body: memoryview | bytes, n: int, bits: int = _OHQ_BITS) -> np.ndarray:
    """`n` float32 values from an ohq body (size, indices, scales and codes checked first)."""
    body = memoryview(body)
    qmax = 2 ** (bits - 1) - 1
    n_blocks = -(-n // INT8_BLOCK)
    expected = n_blocks * ohq_block_bytes(bits)
    if len(body) != expected:
        raise BadBodyError(f"ohq{bits} body is {len(body)} bytes, expected {expected}")
    index = np.frombuffer(body, dtype=np.uint8, count=n_blocks)
    if index.max(initial=0) >= INT8_BLOCK:
        raise BadBodyError(f"ohq{bits} outlier index out of range (>= {INT8_BLOCK})")
    outlier = np.frombuffer(body, dtype="<f4", offset=n_blocks, count=n_blocks)
    scales = np.frombuffer(body, dtype="<f2", offset=5 * n_blocks, count=n_blocks)
    if not (np.isfinite(outlier).all() and np.isfinite(scales).all()):
        raise NonFiniteError(f"ohq{bits} outlier values or block scales contain NaN or Inf")
    codes = _unpack_bits(body[7 * n_blocks :], n_blocks * INT8_BLOCK, bits)
    if codes.max(initial=0) > 2 * qmax:
        raise BadBodyError(f"ohq{bits} code out of range")
    centred = codes.astype(np.float32).reshape(n_blocks, INT8_BLOCK) - qmax
    out = (centred * scales.astype(np.float32)[:, None]) @ _H64
    out[np.arange(n_blocks), index] = outlier
    return out.reshape(-1)[:n]


def body_size(dtype: str, codec: str, n_values: int, width: int | None = None) -> int:
    """Bytes of a body holding `n_values` values (for a variable-rate codec, the most it may
    take: rows of `width` values, or one value per row when `width` is None)."""
    if codec in VARIABLE_CODECS:
        rows = n_values // width if width else n_values
        return codec_rq.body_bounds(rows, n_values // max(rows, 1))[1]
    if codec == "ohq7":
        return -(-n_values // INT8_BLOCK) * ohq_block_bytes()
    if codec == "int8":
        return -(-n_values // INT8_BLOCK) * 4 + n_values
    if codec == "hq9":
        n_blocks = -(-n_values // INT8_BLOCK)
        return n_blocks * 4 + n_blocks * INT8_BLOCK + n_blocks * INT8_BLOCK // 8
    return n_values * DTYPES[dtype].itemsize


def _rq_error(error: codec_rq.RqError) -> FrameError:
    return (NonFiniteError if error.code == "non_finite" else BadBodyError)(error.message)


def encode_body(array: np.ndarray, dtype: str, codec: str) -> bytes:
    if codec == "rq":
        try:
            return codec_rq.encode(array)
        except codec_rq.RqError as error:
            raise _rq_error(error) from None
    if codec == "int8":
        return _encode_int8(array)
    if codec == "hq9":
        return _encode_hq9(array)
    if codec == "ohq7":
        return encode_ohq(array)
    if dtype == "float16" and array.size and float(np.abs(array).max()) > _FP16_MAX:
        raise NonFiniteError("activations overflow float16; send float32 or int8")
    return np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()


def decode_body(header: FrameHeader, body: memoryview | bytes) -> np.ndarray:
    """Decode `body` to a writable float32 array of `header.shape` (checks NaN/Inf)."""
    return decode_values(header.dtype, header.codec, header.shape, body)


def decode_values(
    dtype: str, codec: str, shape: tuple[int, ...], body: memoryview | bytes
) -> np.ndarray:
    """Decode a body of `codec` to a writable float32 array of `shape` (checks NaN/Inf)."""
    n = int(np.prod(shape))
    view = memoryview(body)
    if codec == "int8":
        out = _decode_int8(view, n)
    elif codec == "hq9":
        out = _decode_hq9(view, n)
    elif codec == "ohq7":
        out = decode_ohq(view, n)
    elif codec == "rq":
        try:
            out = codec_rq.decode(view, shape[1], shape[2])
        except codec_rq.RqError as error:
            raise _rq_error(error) from None
    else:
        dt = DTYPES[dtype]
        if len(view) != n * dt.itemsize:
            raise BadBodyError(f"body is {len(view)} bytes, expected {n * dt.itemsize}")
        out = np.frombuffer(view, dtype=dt, count=n).astype(np.float32)
        if not np.isfinite(out).all():
            raise NonFiniteError("activations contain NaN or Inf")
    return out.reshape(shape)


# --------------------------------------------------------------------------------------- encode
def encode_frame(header: FrameHeader, body: bytes | memoryview) -> bytes:
    """Frame bytes from a header and an already-encoded body."""
    head = canonical_json(header.to_json())
    return b"".join((_PREFIX.pack(MAGIC, VERSION, len(head)), head, body))


def make_frame(
    array: np.ndarray,
    *,
    session: str,
    step: int,
    start: int,
    shard: int,
    dtype: str = "float32",
    codec: str = "raw",
    last_only: bool = False,
) -> bytes:
    """Encode a [1, T, H] float array as a frame (validates what the sender controls)."""
    if dtype not in DTYPES:
        raise BadDtypeError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPES)}")
    if codec not in CODECS:
        raise BadCodecError(f"unsupported codec {codec!r}; use one of {list(CODECS)}")
    if array.ndim != 3 or array.shape[0] != 1 or array.shape[1] < 1:
        raise BadShapeError(f"activations must be [1, T, H], got {list(array.shape)}")
    shape = (1, int(array.shape[1]), int(array.shape[2]))
    header = FrameHeader(
        session=session,
        step=step,
        start=start,
        count=shape[1],
        dtype=dtype,
        shape=shape,
        codec=codec,
        shard=shard,
        last_only=last_only,
    )
    return encode_frame(header, encode_body(array, dtype, codec))


def with_header(frame: Frame, **changes: Any) -> bytes:
    """Re-frame an existing body under a changed header (no decode, no re-quantization)."""
    return encode_frame(replace(frame.header, **changes), frame.body)


# --------------------------------------------------------------------------------------- decode
def _int(
    value: Any,
    name: str,
    error: type[FrameError],
    minimum: int = 0,
    maximum: int = _MAX_POSITION,
) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise error(f"{name} must be an integer in {minimum}..{maximum}, got {_short(value)}")
    return value


def _short(value: Any, limit: int = 60) -> str:
    """repr of an untrusted value, cut to `limit` characters (messages stay small)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "<huge int>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_positions(raw: Any) -> tuple[int, int]:
    if isinstance(raw, dict):
        if set(raw) != {"start", "count"}:
            raise BadPositionsError(
                f"positions needs exactly start and count, got {_short(sorted(raw))}"
            )
        start = _int(raw["start"], "positions.start", BadPositionsError)
        count = _int(raw["count"], "positions.count", BadPositionsError, minimum=1)
        return start, count
    if isinstance(raw, list) and 0 < len(raw) <= _MAX_POSITION:
        items = [_int(v, "positions[i]", BadPositionsError) for v in raw]
        if items != list(range(items[0], items[0] + len(items))):
            raise BadPositionsError("positions must be contiguous and increasing")
        return items[0], len(items)
    raise BadPositionsError("positions must be {start, count} or a non-empty list")


def _parse_header(raw: Any) -> FrameHeader:
    if not isinstance(raw, dict):
        raise BadHeaderError("frame header must be a JSON object")
    missing = _HEADER_KEYS - {"last_only"} - set(raw)
    if missing:
        raise BadHeaderError(f"frame header misses {_short(sorted(missing))}")
    extra = set(raw) - _HEADER_KEYS
    if extra:
        raise BadHeaderError(f"frame header has unknown fields {_short(sorted(extra))}")
    session = check_session_id(raw["session"])
    step = _int(raw["step"], "step", BadHeaderError, maximum=_MAX_STEP)
    start, count = _parse_positions(raw["positions"])
    dtype = raw["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise BadDtypeError(f"unsupported dtype {_short(dtype)}; accepted: {sorted(DTYPES)}")
    codec = raw["codec"]
    if not isinstance(codec, str) or codec not in CODECS:
        raise BadCodecError(f"unsupported codec {_short(codec)}; accepted: {list(CODECS)}")
    shape = raw["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= _MAX_POSITION
            for d in shape
        )
        or shape[0] != 1
    ):
        raise BadShapeError(f"shape must be [1, T, H] of positive integers, got {_short(shape)}")
    if shape[1] != count:
        raise BadShapeError(f"shape has {shape[1]} rows but positions count is {count}")
    shard = _int(raw["shard"], "shard", BadHeaderError, maximum=_MAX_SHARD)
    last_only = raw.get("last_only", False)
    if not isinstance(last_only, bool):
        raise BadHeaderError("last_only must be a boolean")
    return FrameHeader(
        session=session,
        step=step,
        start=start,
        count=count,
        dtype=dtype,
        shape=(1, shape[1], shape[2]),
        codec=codec,
        shard=shard,
        last_only=last_only,
    )


def check_session_id(value: object) -> str:
    """`value` if it is a session capability (22-64 characters of [A-Za-z0-9_-]), else
    BadSessionIdError."""
    if not isinstance(value, str) or not _SESSION_RE.fullmatch(value):
        raise BadSessionIdError(
            f"session must be {SESSION_MIN_CHARS}-{SESSION_MAX_CHARS} characters of [A-Za-z0-9_-]"
        )
    return value


def session_tag(capability: str) -> str:
    """The public name of a hop's session: sha256 over a domain prefix and the capability, hex.

    A node keys its sessions by the tag and logs only the tag; the tag can be shown to a third
    party (a verifier, a commitment) without giving it the power to act on the session, and no
    tag reveals its capability or any other hop's."""
    return hashlib.sha256(_SESSION_TAG_DOMAIN + check_session_id(capability).encode()).hexdigest()


def _check_depth(text: bytes) -> None:
    """BadHeaderError if JSON `text` nests arrays/objects deeper than MAX_HEADER_DEPTH (checked
    before json.loads, so a deeply nested header costs no recursion)."""
    if text.count(b"[") + text.count(b"{") <= MAX_HEADER_DEPTH:
        return  # depth is at most the number of opening brackets
    depth = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_HEADER_DEPTH:
                raise BadHeaderError(f"frame header nests deeper than {MAX_HEADER_DEPTH} levels")
        elif byte in (0x5D, 0x7D):
            depth -= 1


def _reject_constant(name: str) -> Any:
    raise BadHeaderError(f"frame header contains {name}, which is not JSON")


def parse_frame(data: bytes | bytearray | memoryview, limits: FrameLimits | None = None) -> Frame:
    """Parse and validate a frame's envelope, header and body size (not the values).

    Call `Frame.array()` to decode the body, which also rejects NaN/Inf.
    """
    limits = limits or FrameLimits()
    view = memoryview(data)
    if len(view) < PREFIX_BYTES:
        raise BadMagicError(
            f"frame is {len(view)} bytes, shorter than its {PREFIX_BYTES}-byte prefix"
        )
    magic, version, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BadMagicError(f"not an activation frame (magic {bytes(magic)!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise BadVersionError(
            f"frame version {version} is not supported (this node speaks {VERSION})"
        )
    if header_len > MAX_HEADER_BYTES or PREFIX_BYTES + header_len > len(view):
        raise BadHeaderError(f"header length {header_len} is out of bounds")
    text = bytes(view[PREFIX_BYTES : PREFIX_BYTES + header_len])
    _check_depth(text)
    try:
        raw = json.loads(text.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadHeaderError(f"frame header is not JSON: {error}") from None
    header = _parse_header(raw)
    if limits.hidden_size is not None and header.shape[2] != limits.hidden_size:
        raise BadShapeError(
            f"hidden size {header.shape[2]} does not match this model's {limits.hidden_size}"
        )
    if header.count > limits.max_tokens:
        raise TooLargeError(f"{header.count} positions exceed the limit of {limits.max_tokens}")
    body = view[PREFIX_BYTES + header_len :]
    if len(body) > limits.max_body_bytes:
        raise TooLargeError(f"body of {len(body)} bytes exceeds {limits.max_body_bytes}")
    check_body_size(header.dtype, header.codec, header.count, header.shape[2], len(body))
    return Frame(header=header, body=body)


def check_body_size(dtype: str, codec: str, rows: int, width: int, size: int) -> None:
    """A body of `size` bytes must be exactly what `rows` x `width` values take in `codec`, or,
    for a variable-rate codec (rq), lie within its bounds; else BadBodyError. One rule for HTTP
    frames and stream data messages."""
    if codec in VARIABLE_CODECS:
        smallest, largest = codec_rq.body_bounds(rows, width)
        if not smallest <= size <= largest:
            raise BadBodyError(
                f"body is {size} bytes, outside {smallest}..{largest} for {rows} x {width}"
            )
        return
    expected = body_size(dtype, codec, rows * width)
    if size != expected:
        raise BadBodyError(f"body is {size} bytes, expected {expected} for {rows} x {width}")


def decode_frame(
    data: bytes | bytearray | memoryview, limits: FrameLimits | None = None
) -> tuple[FrameHeader, np.ndarray]:
    """Parse, validate and decode a frame to (header, float32 array)."""
    frame = parse_frame(data, limits)
    return frame.header, frame.array()
