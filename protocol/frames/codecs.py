"""How a frame's body encodes its [1, T, H] activations: the dtypes, the codecs, one dispatch.

Codec names are wire format (their index in CODECS is what a frame header carries): append new
ones, never rename or reuse one.

    raw    the tensor in the header's dtype ("float32" | "float16"), little-endian, C order
    int8   blockwise absmax int8, 26.6 % of fp32                      (protocol/frames/int8.py)
    hq9    rotated blocks, 9-bit codes, 29.7 % of fp32; `--compress`  (protocol/frames/hq9.py)
    ohq7   outlier split off, rotated 7-bit codes, 24.6 % (opt-in)    (protocol/frames/ohq.py)
    rq     rms-scaled integers, Rice-coded, variable rate, ~28 %      (protocol/frames/rq.py)

The receiver checks a body's size before decoding anything (`check_body_size`: exact for the
fixed-rate codecs, within bounds for rq), and decoding rejects NaN/Inf with NonFiniteError.
Decoded values are always a writable float32 array.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from protocol.frames import hq9, int8, ohq, rq
from protocol.frames.errors import BadBodyError, FrameError, NonFiniteError

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
    if dtype == "float16" and array.size and float(np.abs(array).max()) > _FP16_MAX:
        raise NonFiniteError("activations overflow float16; send float32 or int8")
    return np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()


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
