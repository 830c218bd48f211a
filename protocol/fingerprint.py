"""Activation fingerprints: the byte format nodes commit to, and how a verifier compares them.

A compute node's output activations for every block of `BLOCK_POSITIONS` (32) consecutive
positions are summarised in at most `MAX_BLOCK_BYTES` (258) bytes, in the spirit of TOPLOC
(top-k values of the activations, checked by one prefill), with our own encoding:

* For each position t of the block the node takes the `TOPK` (4) channels with the largest
  |activation| (ties: lower channel first) and the IEEE fp16 bit pattern of each value
  (`value16`, overflow saturated to ±65504).
* Those 4 points (x = channel, y = value16) define one polynomial of degree ≤ 3 over the prime
  field GF(`FIELD` = 65521); its 4 coefficients (each < 65521, so 2 bytes) are what is sent.
  The channels are implied: a verifier evaluates the polynomial at the channels of ITS OWN top-4
  and gets the node's value there, or an unrelated number where the node's top-4 differed.
* Bytes of a block: `version (1 byte) ‖ n (1 byte, positions, 1…32) ‖ n × 4 × uint16 big-endian
  coefficients (c0, c1, c2, c3 per position, position order)`: 2 + 8·n bytes, 258 for a full
  block. Blocks cover absolute positions [32·b, 32·b + n) of a session; a node's sequence of
  blocks is the concatenation of their bytes (each block says its own length).

Comparison (`compare_block`) is integer-only, so every verifier reaches the same verdict on the
same inputs: a value matches when the ULP distance between the claimed and the recomputed fp16
(both mapped to a signed ordinal, so ±0 coincide and adjacent floats differ by 1) is at most
`Tolerance.max_ulp`; a block passes when at least `min_match_per_mille` ‰ of its values match
and the mean ULP distance over the matched values is at most `max_mean_ulp`. Tolerances are
calibrated per quant mode on measured data (`node/verifier/calibration.json`).

Nothing here imports torch: extraction of top-k from tensors lives in `node.verifier`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.errors import ProtocolError

VERSION = 1
FIELD = 65521  # largest prime below 2**16: every coefficient fits in two bytes
BLOCK_POSITIONS = 32
TOPK = 4
HEADER_BYTES = 2
BYTES_PER_POSITION = 2 * TOPK
MAX_BLOCK_BYTES = HEADER_BYTES + BLOCK_POSITIONS * BYTES_PER_POSITION  # 258
FP16_EXPONENT_MASK = 0x7C00  # exponent bits all ones: inf or NaN

# One position's points: (channel, fp16 bit pattern), exactly TOPK of them, distinct channels.
Row = Sequence[tuple[int, int]]


class FingerprintError(ProtocolError):
    """Fingerprint bytes or rows that break the format."""

    code = "fingerprint_format"

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad fingerprint: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BlockFingerprint:
    """A decoded block: per position the polynomial's coefficients (low degree first)."""

    polys: tuple[tuple[int, ...], ...]

    @property
    def positions(self) -> int:
        return len(self.polys)

    def value_at(self, position: int, channel: int) -> int:
        """The polynomial of `position` evaluated at x = `channel` (an element of the field)."""
        return evaluate(self.polys[position], channel)


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a recomputation may drift from a committed block and still pass (integers)."""

    max_ulp: int  # a value matches when |ordinal(claimed) - ordinal(own)| <= max_ulp
    min_match_per_mille: int  # ‰ of a block's values that must match
    max_mean_ulp_milli: int  # mean ULP distance over matched values, x1000, at most this

    def __post_init__(self) -> None:
        for name in ("max_ulp", "min_match_per_mille", "max_mean_ulp_milli"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"tolerance.{name}: expected a non-negative integer")
        if self.min_match_per_mille > 1000:
            raise ValueError("tolerance.min_match_per_mille: at most 1000")


@dataclass(frozen=True, slots=True)
class BlockCheck:
    """The outcome of comparing one committed block with a recomputation."""

    values: int  # values compared (positions x TOPK)
    matched: int  # values within max_ulp
    ulp_sum_matched: int  # sum of ULP distances over matched values
    passed: bool

    @property
    def match_per_mille(self) -> int:
        return self.matched * 1000 // self.values if self.values else 0


# ---- field arithmetic -----------------------------------------------------------------------
def evaluate(coefficients: Sequence[int], x: int) -> int:
    """Horner evaluation over GF(FIELD); coefficients low degree first."""
    result = 0
    for coefficient in reversed(coefficients):
        result = (result * x + coefficient) % FIELD
    return result


def interpolate(points: Row) -> tuple[int, ...]:
    """Coefficients (low degree first, len == len(points)) of the unique polynomial of degree
    < len(points) through `points` over GF(FIELD). x values must be distinct in the field."""
    xs = [x % FIELD for x, _ in points]
    if len(set(xs)) != len(xs):
        raise FingerprintError("channels repeat within a position")
    size = len(points)
    coefficients = [0] * size
    for i, (x_i, y_i) in enumerate(zip(xs, (y for _, y in points), strict=True)):
        # basis polynomial prod_{j != i} (x - x_j), built low degree first
        basis = [1]
        denominator = 1
        for j, x_j in enumerate(xs):
            if j == i:
                continue
            basis = [
                ((basis[k - 1] if k > 0 else 0) - x_j * (basis[k] if k < len(basis) else 0)) % FIELD
                for k in range(len(basis) + 1)
            ]
            denominator = denominator * (x_i - x_j) % FIELD
        scale = y_i * pow(denominator, FIELD - 2, FIELD) % FIELD
        for k in range(size):
            coefficients[k] = (coefficients[k] + scale * basis[k]) % FIELD
    return tuple(coefficients)


# ---- fp16 values ----------------------------------------------------------------------------
def is_finite_fp16(bits: int) -> bool:
    return 0 <= bits <= 0xFFFF and (bits & FP16_EXPONENT_MASK) != FP16_EXPONENT_MASK


def fp16_ordinal(bits: int) -> int:
    """A signed integer that orders fp16 values: adjacent finite values differ by 1, ±0 are 0."""
    magnitude = bits & 0x7FFF
    return -magnitude if bits & 0x8000 else magnitude


def ulp_distance(a: int, b: int) -> int:
    return abs(fp16_ordinal(a) - fp16_ordinal(b))


# ---- bytes ----------------------------------------------------------------------------------
def _check_row(row: Row) -> None:
    if len(row) != TOPK:
        raise FingerprintError(f"a position needs exactly {TOPK} values, got {len(row)}")
    for channel, bits in row:
        if isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel < FIELD:
            raise FingerprintError(f"channel {channel!r} outside [0, {FIELD})")
        if isinstance(bits, bool) or not isinstance(bits, int) or not is_finite_fp16(bits):
            raise FingerprintError(f"value {bits!r} is not a finite fp16 bit pattern")


def encode_block(rows: Sequence[Row]) -> bytes:
    """The bytes of one block from per-position top-k (channel, fp16 bits) points."""
    if not 1 <= len(rows) <= BLOCK_POSITIONS:
        raise FingerprintError(f"a block holds 1…{BLOCK_POSITIONS} positions, got {len(rows)}")
    out = bytearray((VERSION, len(rows)))
    for row in rows:
        _check_row(row)
        out += struct.pack(f">{TOPK}H", *interpolate(row))
    return bytes(out)


def decode_block(data: bytes) -> tuple[BlockFingerprint, int]:
    """Parse one block at the start of `data`; returns it and the bytes it used."""
    if len(data) < HEADER_BYTES:
        raise FingerprintError("truncated header")
    version, positions = data[0], data[1]
    if version != VERSION:
        raise FingerprintError(f"unknown version {version}")
    if not 1 <= positions <= BLOCK_POSITIONS:
        raise FingerprintError(f"block of {positions} positions")
    size = HEADER_BYTES + positions * BYTES_PER_POSITION
    if len(data) < size:
        raise FingerprintError(f"block needs {size} bytes, got {len(data)}")
    polys = []
    for index in range(positions):
        offset = HEADER_BYTES + index * BYTES_PER_POSITION
        coefficients = struct.unpack_from(f">{TOPK}H", data, offset)
        if any(c >= FIELD for c in coefficients):
            raise FingerprintError("coefficient outside the field")
        polys.append(tuple(coefficients))
    return BlockFingerprint(tuple(polys)), size


def decode_blocks(data: bytes, *, max_blocks: int = 4096) -> list[BlockFingerprint]:
    """Parse a concatenation of one or more blocks (every byte must belong to one)."""
    if not data:
        raise FingerprintError("no blocks")
    blocks: list[BlockFingerprint] = []
    offset = 0
    while offset < len(data):
        if len(blocks) >= max_blocks:
            raise FingerprintError(f"more than {max_blocks} blocks")
        block, used = decode_block(data[offset:])
        blocks.append(block)
        offset += used
    return blocks


# ---- comparison -----------------------------------------------------------------------------
def compare_block(
    block: BlockFingerprint, own_rows: Sequence[Row], tolerance: Tolerance
) -> BlockCheck:
    """Compare a committed block with the verifier's own top-k rows for the same positions."""
    if len(own_rows) != block.positions:
        raise FingerprintError(
            f"block has {block.positions} positions, the recomputation {len(own_rows)}"
        )
    values = matched = ulp_sum = 0
    for poly, row in zip(block.polys, own_rows, strict=True):
        _check_row(row)
        for channel, own_bits in row:
            values += 1
            claimed = evaluate(poly, channel)
            if not is_finite_fp16(claimed):
                continue
            distance = ulp_distance(claimed, own_bits)
            if distance <= tolerance.max_ulp:
                matched += 1
                ulp_sum += distance
    passed = (
        matched * 1000 >= tolerance.min_match_per_mille * values
        and matched > 0
        and ulp_sum * 1000 <= tolerance.max_mean_ulp_milli * matched
    )
    return BlockCheck(values=values, matched=matched, ulp_sum_matched=ulp_sum, passed=passed)
