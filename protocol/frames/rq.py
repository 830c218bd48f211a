"""The "rq" activation codec: rms-scaled uniform quantization, Rice-coded (variable rate).

Each token's row of H values is divided by its own step s_t (the encoder picks
s_t = rms(row) * delta, delta = 2**(-e/4) for a quality exponent e), rounded to integers q and
entropy coded; the receiver computes q * s_t (integers times one float32 per token). No rotation:
with an entropy coder a uniform step gives every value the same error whatever its size, and the
heavy-tailed residual stream (a few huge channels) costs fewer bits unrotated than Gaussianized.

Integers are zigzag-mapped (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) to u and coded per block of
RQ_BLOCK values of a row with a Rice parameter k (0..15) chosen by the encoder: the high part
u >> k in unary (that many 0 bits, then a 1), the low k bits in a separate stream. A high part
of ESCAPE or more is sent as exactly ESCAPE zeros and a 1, no low bits, and u itself as a uint32
in the escape list. Separate streams keep decoding vectorized (the unary stream splits at its 1
bits) and let every field be checked before use.

Body (all little-endian), for a [1, T, H] frame with NB = T * ceil(H / RQ_BLOCK) blocks:

    T x float32       per-token steps s_t (finite, >= 0)
    ceil(NB/2) bytes  Rice parameters, 4 bits per block, low nibble first (pad nibble 0)
    uint32 U, U bytes unary stream (bit order little; exactly T*H 1 bits; padding 0 bits < 8)
    uint32 R, R bytes low-bit stream (sum of k over non-escaped values; padding 0 bits < 8)
    E x uint32        escaped u values (E = number of escape markers; each >= ESCAPE << k,
                      < 2**MAX_CODE_BITS)

Every decoded value is within half its token's step of the original (down to steps that
underflow float32, where the error is below 1e-37 anyway).

Canonical: a decoder rejects any body another encoder could not have produced bit for bit
(non-zero padding, a wrong count, a non-minimal escape), so one tensor has one encoding per
choice of steps and parameters. Every rejection is an RqError naming "bad_body" or
"non_finite"; protocol/frames/codecs.py turns it into its FrameError of that code. Pure
numpy.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

RQ_BLOCK: Final = 64
ESCAPE: Final = 24
MAX_K: Final = 15
MAX_CODE_BITS: Final = 24  # |q| < 2**23: exact in float32
# The default quality: delta = 2**(-29/4) = 0.0066 of the token's rms, the smallest exponent
# whose KL and top-2 gap error matched hq9's on the tuning half of the held-out text
# (bench/codec.py).
DEFAULT_EXPONENT: Final = 29
MIN_EXPONENT: Final = 0
MAX_EXPONENT: Final = 64
_U32: Final = struct.Struct("<I")
_BIT: Final = np.arange(MAX_K, dtype=np.int64)
_CHUNK: Final = 1 << 16  # values per slice of bit-plane work (bounds memory on big frames)


class RqError(ValueError):
    """A malformed rq body or an unencodable tensor; `code` is "bad_body" or "non_finite"."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> RqError:
    return RqError("bad_body", f"rq body: {message}")


def step_delta(exponent: int) -> float:
    """The step as a share of a token's rms for quality `exponent` (larger = finer)."""
    if not MIN_EXPONENT <= exponent <= MAX_EXPONENT:
        raise ValueError(f"rq exponent must be in {MIN_EXPONENT}..{MAX_EXPONENT}")
    return 2.0 ** (-exponent / 4)


def body_bounds(rows: int, width: int) -> tuple[int, int]:
    """(smallest, largest) byte size of an rq body for a [1, rows, width] tensor."""
    n = rows * width
    blocks = rows * -(-width // RQ_BLOCK)
    fixed = 4 * rows + -(-blocks // 2) + 8
    smallest = fixed + -(-n // 8)
    largest = fixed + -(-n * (ESCAPE + 1) // 8) + -(-n * MAX_K // 8) + 4 * n
    return smallest, largest


# ------------------------------------------------------------------------------------- encode
def encode(values: np.ndarray, exponent: int = DEFAULT_EXPONENT) -> bytes:
    """The rq body of a [1, T, H] (or [T, H]) float array at quality `exponent`."""
    x = np.asarray(values, dtype=np.float32)
    rows, width = int(x.shape[-2]), int(x.shape[-1])
    x = x.reshape(rows, width)
    if not np.isfinite(x).all():
        raise RqError("non_finite", "activations contain NaN or Inf")
    rms = np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=1))
    steps = (rms * step_delta(exponent)).astype(np.float32)
    if not np.isfinite(steps).all():
        raise RqError("non_finite", "activations too large for float32 steps")
    safe = np.where(steps > 0, steps, np.float32(1.0)).astype(np.float64)
    q = np.rint(x.astype(np.float64) / safe[:, None])
    if np.abs(q).max(initial=0.0) >= 2 ** (MAX_CODE_BITS - 1):
        raise RqError("non_finite", "a value is too far above its row's rms for rq")
    q = q.astype(np.int32)
    u = np.where(q >= 0, 2 * q, -2 * q - 1).ravel()  # zigzag, < 2**MAX_CODE_BITS
    del q
    per_row = -(-width // RQ_BLOCK)
    block = (
        np.arange(rows, dtype=np.int32)[:, None] * per_row
        + np.arange(width, dtype=np.int32)[None, :] // RQ_BLOCK
    ).ravel()
    k = _best_k(u, block, rows * per_row)
    kv = k[block].astype(np.int32)
    del block
    high = u >> kv
    escaped = high >= ESCAPE
    run = np.where(escaped, ESCAPE, high)
    unary = _unary_bits(run)
    widths = np.where(escaped, 0, kv)
    low = _low_bits(u & ((1 << kv) - 1), widths)
    nibbles = np.zeros(-(-k.size // 2) * 2, dtype=np.uint8)
    nibbles[: k.size] = k
    packed_k = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
    return b"".join(
        (
            steps.astype("<f4").tobytes(),
            packed_k.tobytes(),
            _U32.pack(len(unary)),
            unary,
            _U32.pack(len(low)),
            low,
            u[escaped].astype("<u4").tobytes(),
        )
    )


def _best_k(u: np.ndarray, block: np.ndarray, blocks: int) -> np.ndarray:
    """Per block, the Rice parameter with the fewest bits (escapes counted as their cost)."""
    count = np.bincount(block, minlength=blocks)
    mean = np.bincount(block, weights=u, minlength=blocks) / np.maximum(count, 1)
    # The best k sits near log2(mean): try the four around it instead of all sixteen.
    guess = np.floor(np.log2(np.maximum(mean, 1.0))).astype(np.int64) - 1
    best = np.full(blocks, np.iinfo(np.int64).max, dtype=np.int64)
    choice = np.zeros(blocks, dtype=np.int64)
    for offset in range(4):
        kb = np.clip(guess + offset, 0, MAX_K)
        k = kb[block]
        high = u >> k
        esc = high >= ESCAPE
        cost_each = np.where(esc, ESCAPE + 1 + 32, high + 1 + k)
        cost = np.bincount(block, weights=cost_each, minlength=blocks).astype(np.int64)
        better = cost < best
        best[better] = cost[better]
        choice[better] = kb[better]
    choice[count == 0] = 0
    return choice


def _unary_bits(run: np.ndarray) -> bytes:
    ends = np.cumsum(run + 1) - 1  # position of each value's terminating 1 bit
    bits = np.zeros(int(ends[-1]) + 1 if ends.size else 0, dtype=np.uint8)
    bits[ends] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def _low_bits(low: np.ndarray, widths: np.ndarray) -> bytes:
    """The low `widths[i]` bits of each `low[i]`, least significant first, concatenated."""
    parts = []
    for start in range(0, low.size, _CHUNK):  # chunks bound the [n, MAX_K] bit planes
        part, width = low[start : start + _CHUNK], widths[start : start + _CHUNK]
        planes = ((part[:, None] >> _BIT) & 1).astype(np.uint8)
        parts.append(planes[_BIT[None, :] < width[:, None]])
    bits = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return np.packbits(bits, bitorder="little").tobytes()


# ------------------------------------------------------------------------------------- decode
def decode(body: bytes | memoryview, rows: int, width: int) -> np.ndarray:
    """[rows, width] float32 from an rq body; RqError on anything malformed."""
    view = memoryview(body)
    smallest, largest = body_bounds(rows, width)
    if not smallest <= len(view) <= largest:
        raise _bad(f"{len(view)} bytes, outside {smallest}..{largest} for [{rows}, {width}]")
    n = rows * width
    per_row = -(-width // RQ_BLOCK)
    blocks = rows * per_row
    steps = np.frombuffer(view, dtype="<f4", count=rows)
    if not np.isfinite(steps).all():
        raise RqError("non_finite", "rq body: a token step is NaN or Inf")
    if (steps < 0).any():
        raise _bad("a token step is negative")
    at = 4 * rows
    k_bytes = -(-blocks // 2)
    packed_k = np.frombuffer(view, dtype=np.uint8, offset=at, count=k_bytes)
    at += k_bytes
    k = np.empty(k_bytes * 2, dtype=np.uint8)
    k[0::2] = packed_k & 0x0F
    k[1::2] = packed_k >> 4
    if blocks % 2 and k[-1] != 0:
        raise _bad("the padding nibble of the Rice parameters is not 0")
    k = k[:blocks]
    unary, at = _field(view, at, "unary stream", -(-n * (ESCAPE + 1) // 8))
    low, at = _field(view, at, "low-bit stream", -(-n * MAX_K // 8))
    run = _read_unary(unary, n)
    escaped = run == ESCAPE
    kv = np.repeat(k.reshape(rows, per_row), RQ_BLOCK, axis=1)[:, :width].ravel()
    widths = np.where(escaped, np.uint8(0), kv)
    lows = _read_low(low, widths)
    escapes = int(np.count_nonzero(escaped))
    if len(view) - at != 4 * escapes:
        raise _bad(f"{len(view) - at} bytes of escapes, expected {4 * escapes}")
    u = (run << kv.astype(np.int32)) | lows
    if escapes:
        big = np.frombuffer(view, dtype="<u4", offset=at, count=escapes).astype(np.int64)
        if (big >> kv[escaped] < ESCAPE).any():
            raise _bad("an escaped value is small enough for the unary code")
        if (big >= 1 << MAX_CODE_BITS).any():
            raise _bad(f"an escaped value is not below 2**{MAX_CODE_BITS}")
        u[escaped] = big.astype(np.int32)
    q = np.where(u & 1, -((u + 1) >> 1), u >> 1).astype(np.float32).reshape(rows, width)
    with np.errstate(over="ignore", invalid="ignore"):
        out = q * steps.astype(np.float32)[:, None]
    if not np.isfinite(out).all():
        raise RqError("non_finite", "rq body: a decoded value overflows float32")
    return out


def _field(view: memoryview, at: int, name: str, most: int) -> tuple[np.ndarray, int]:
    if len(view) - at < 4:
        raise _bad(f"truncated before the {name} length")
    (size,) = _U32.unpack_from(view, at)
    at += 4
    if size > len(view) - at:
        raise _bad(f"the {name} length {size} runs past the end")
    if size > most:
        raise _bad(f"the {name} length {size} exceeds {most} for this shape")
    data = np.frombuffer(view, dtype=np.uint8, offset=at, count=size)
    return data, at + size


def _read_unary(data: np.ndarray, n: int) -> np.ndarray:
    bits = np.unpackbits(data, bitorder="little")
    ones = int(np.count_nonzero(bits))  # counted before any index array is built
    if ones != n:
        raise _bad(f"unary stream holds {ones} values, expected {n}")
    ends = np.flatnonzero(bits)
    if (n and bits.size - int(ends[-1]) - 1 >= 8) or (n == 0 and bits.size):
        raise _bad("unary stream has a whole byte of padding")
    run = np.diff(ends, prepend=-1) - 1
    if run.max(initial=0) > ESCAPE:
        raise _bad(f"a unary run is longer than the escape ({ESCAPE})")
    return run.astype(np.int32)


def _read_low(data: np.ndarray, widths: np.ndarray) -> np.ndarray:
    total = int(widths.sum(dtype=np.int64))
    if data.size != -(-total // 8):
        raise _bad(f"low-bit stream is {data.size} bytes, expected {-(-total // 8)}")
    bits = np.unpackbits(data, bitorder="little")
    if bits[total:].any():
        raise _bad("low-bit stream padding is not 0")
    out = np.empty(widths.size, dtype=np.int32)
    at = 0
    for start in range(0, widths.size, _CHUNK):  # chunks bound the [n, MAX_K] bit planes
        width = widths[start : start + _CHUNK]
        mask = _BIT[None, :] < width[:, None]
        planes = np.zeros(mask.shape, dtype=np.int32)
        used = int(width.sum(dtype=np.int64))
        planes[mask] = bits[at : at + used]
        at += used
        out[start : start + _CHUNK] = (planes << _BIT.astype(np.int32)).sum(axis=1)
    return out
