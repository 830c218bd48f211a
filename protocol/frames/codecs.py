"""How a frame's body encodes its [1, T, H] activations: the dtypes, the codecs, one dispatch.

Codec names are wire format (their index in CODECS is what a frame header carries): append new
ones, never rename or reuse one.

    raw    the tensor in the header's dtype ("float32" | "float16"), little-endian, C order
    int8   blockwise absmax int8, 26.6 % of fp32                      (protocol/frames/int8.py)
    hq9    rotated blocks, 9-bit codes, 29.7 % of fp32; `--compress`  (protocol/frames/hq9.py)
    ohq7   outlier split off, rotated 7-bit codes, 24.6 % (opt-in)    (protocol/frames/ohq.py)
    rq     rms-scaled integers, Rice-coded, variable rate, ~28 %      (protocol/frames/rq.py)

Clients send raw frames of `protocol.frames.dtypes.WIRE_DTYPE` (float16) unless asked otherwise
(`--wire-dtype float32`): half the bytes of fp32, activations rounded to fp16 at every hop
(docs/compute.md has what that does to greedy tokens). A node answers in the dtype and codec of
the frame it received. A value beyond fp16's range (|x| > 65504) is never saturated or sent as
inf: `encode_body` raises `Fp16OverflowError` (a NonFiniteError, code `non_finite`), a node
refuses the frame by that name and closes the session, and the client may ask again in float32.

The receiver checks a body's size before decoding anything (`check_body_size`: exact for the
fixed-rate codecs, within bounds for rq), and decoding rejects NaN/Inf with NonFiniteError.
Decoded values are always a writable float32 array.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from protocol.frames import hq9, int8, ohq, rq
from protocol.frames.errors import BadBodyError, Fp16OverflowError, FrameError, NonFiniteError

# Keyed by protocol.frames.dtypes.WIRE_DTYPES, in its order (a unit test holds them equal).
DTYPES: Final[dict[str, np.dtype]] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
}
CODECS: Final = ("raw", "int8", "hq9", "ohq7", "rq")
# Codecs whose body size depends on the values (checked against bounds, not one size).
VARIABLE_CODECS: Final = frozenset({"rq"})
# What clients use when asked to compress: hq9 (29.7 % of fp32). rq is 1.6 points smaller and a
# little closer to the uncompressed circuit teacher-forced, but costs 6-25x hq9's CPU per token
# (up to ~10 ms per generated token over 3 hops), so it stays opt-in (docs/compute.md).
COMPRESSED_CODEC: Final = "hq9"
_FP16_MAX: Final = 65504.0


def body_size(dtype: str, codec: str, n_values: int, width: int | None = None) -> int:
    """Bytes of a body holding `n_values` values (for a variable-rate codec, the most it may
    take: rows of `width` values, or one value per row when `width` is None)."""
    if codec in VARIABLE_CODECS:
        rows = n_values // width if width else n_values
        return rq.body_bounds(rows, n_values // max(rows, 1))[1]
    if codec == "ohq7":
        return ohq.body_size(n_values)
    if codec == "int8":
        return int8.body_size(n_values)
    if codec == "hq9":
        return hq9.body_size(n_values)
    return n_values * DTYPES[dtype].itemsize


def check_body_size(dtype: str, codec: str, rows: int, width: int, size: int) -> None:
    """A body of `size` bytes must be exactly what `rows` x `width` values take in `codec`, or,
    for a variable-rate codec (rq), lie within its bounds; else BadBodyError."""
    if codec in VARIABLE_CODECS:
        smallest, largest = rq.body_bounds(rows, width)
        if not smallest <= size <= largest:
            raise BadBodyError(
                f"body is {size} bytes, outside {smallest}..{largest} for {rows} x {width}"
            )
        return
    expected = body_size(dtype, codec, rows * width)
    if size != expected:
        raise BadBodyError(f"body is {size} bytes, expected {expected} for {rows} x {width}")


def _rq_error(error: rq.RqError) -> FrameError:
    return (NonFiniteError if error.code == "non_finite" else BadBodyError)(error.message)


def encode_body(array: np.ndarray, dtype: str, codec: str) -> bytes:
    """The body of a [1, T, H] float array in `codec` (raw: in `dtype`)."""
    if codec == "rq":
        try:
            return rq.encode(array)
        except rq.RqError as error:
            raise _rq_error(error) from None
    if codec == "int8":
        return int8.encode(array)
    if codec == "hq9":
        return hq9.encode(array)
    if codec == "ohq7":
        return ohq.encode(array)
    if dtype == "float16":
        _check_fp16_range(array)
    return np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()


def _check_fp16_range(array: np.ndarray) -> None:
    if array.size and float(np.abs(array).max()) > _FP16_MAX:
        raise Fp16OverflowError(
            f"activations overflow float16 (|x| up to {float(np.abs(array).max()):.6g} > "
            f"{_FP16_MAX:g}); send float32 (--wire-dtype float32) or int8"
        )


def wire_values(array: np.ndarray, dtype: str, codec: str) -> np.ndarray:
    """What a receiver decodes from `encode_body(array, dtype, "raw")`: the values rounded to
    `dtype` (float32: `array` itself), without the bytes. Lossy codecs: `array` as it is (use
    encode_body and decode_values). Raises Fp16OverflowError as `encode_body` does."""
    if codec != "raw" or dtype == "float32":
        return array
    _check_fp16_range(array)
    return np.asarray(array, dtype=DTYPES[dtype]).astype(np.float32)


def decode_values(
    dtype: str, codec: str, shape: tuple[int, ...], body: memoryview | bytes
) -> np.ndarray:
    """Decode a body of `codec` to a writable float32 array of `shape` (checks NaN/Inf)."""
    n = int(np.prod(shape))
    view = memoryview(body)
    if codec == "int8":
        out = int8.decode(view, n)
    elif codec == "hq9":
        out = hq9.decode(view, n)
    elif codec == "ohq7":
        out = ohq.decode(view, n)
    elif codec == "rq":
        try:
            out = rq.decode(view, shape[1], shape[2])
        except rq.RqError as error:
            raise _rq_error(error) from None
    else:
        dt = DTYPES[dtype]
        if len(view) != n * dt.itemsize:
            raise BadBodyError(f"body is {len(view)} bytes, expected {n * dt.itemsize}")
        out = np.frombuffer(view, dtype=dt, count=n).astype(np.float32)
        if not np.isfinite(out).all():
            raise NonFiniteError("activations contain NaN or Inf")
    return out.reshape(shape)
