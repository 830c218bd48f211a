"""The "ohq7" codec (opt-in): outlier split off, the rest rotated and quantized to 7 bits.

Per block of 64 values, the largest-magnitude value is split off and sent exactly (uint8 index
in the block + float32 value), the rest is rotated by the Walsh-Hadamard matrix and quantized
absmax to 7-bit signed codes [-63, 63] with a float16 scale (rounded up, so no code clips).
body = indices (n_blocks x uint8) + outlier values (n_blocks x float32 LE) + scales
(n_blocks x float16 LE) + codes (7 bits per value, offset +63, packed little-endian bit order).
63 bytes per 64 values = 24.6 % of fp32. Splitting the outlier off first keeps the residual
stream's few huge channels (and token 0's ~22,500) from inflating the step of the 63 ordinary
values sharing their block. Other code widths (2..8 bits) exist only for measurements
(bench/codec.py); the wire knows "ohq7".
"""

from __future__ import annotations

from typing import Final

import numpy as np

from protocol.frames.blocks import BLOCK, H64, block_count, padded_blocks
from protocol.frames.errors import BadBodyError, NonFiniteError

BITS: Final = 7  # the registered "ohq7"
_FP16_MAX: Final = 65504.0


def block_bytes(bits: int = BITS) -> int:
    """Bytes per block of 64 values: outlier index, outlier value, scale, packed codes."""
    return 1 + 4 + 2 + BLOCK * bits // 8


def body_size(n_values: int, bits: int = BITS) -> int:
    return block_count(n_values) * block_bytes(bits)


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


def encode(values: np.ndarray, bits: int = BITS) -> bytes:
    """The ohq body of `values` with `bits`-bit codes (2..8)."""
    qmax = 2 ** (bits - 1) - 1
    blocks = padded_blocks(values)
    n_blocks = blocks.shape[0]
    rows = np.arange(n_blocks)
    index = np.abs(blocks).argmax(axis=1)
    outlier = blocks[rows, index].astype("<f4")
    rest = blocks.copy()
    rest[rows, index] = 0.0
    rotated = rest @ H64
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


def decode(body: memoryview | bytes, n: int, bits: int = BITS) -> np.ndarray:
    """`n` float32 values from an ohq body (size, indices, scales and codes checked first)."""
    body = memoryview(body)
    qmax = 2 ** (bits - 1) - 1
    n_blocks = block_count(n)
    expected = body_size(n, bits)
    if len(body) != expected:
        raise BadBodyError(f"ohq{bits} body is {len(body)} bytes, expected {expected}")
    index = np.frombuffer(body, dtype=np.uint8, count=n_blocks)
    if index.max(initial=0) >= BLOCK:
        raise BadBodyError(f"ohq{bits} outlier index out of range (>= {BLOCK})")
    outlier = np.frombuffer(body, dtype="<f4", offset=n_blocks, count=n_blocks)
    scales = np.frombuffer(body, dtype="<f2", offset=5 * n_blocks, count=n_blocks)
    if not (np.isfinite(outlier).all() and np.isfinite(scales).all()):
        raise NonFiniteError(f"ohq{bits} outlier values or block scales contain NaN or Inf")
    codes = _unpack_bits(body[7 * n_blocks :], n_blocks * BLOCK, bits)
    if codes.max(initial=0) > 2 * qmax:
        raise BadBodyError(f"ohq{bits} code out of range")
    centred = codes.astype(np.float32).reshape(n_blocks, BLOCK) - qmax
    out = (centred * scales.astype(np.float32)[:, None]) @ H64
    out[np.arange(n_blocks), index] = outlier
    return out.reshape(-1)[:n]
