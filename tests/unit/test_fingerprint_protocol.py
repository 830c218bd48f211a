"""protocol.fingerprint: field arithmetic, the byte format, hostile bytes, the integer compare."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest

from protocol.fingerprint import (
    BLOCK_POSITIONS,
    FIELD,
    MAX_BLOCK_BYTES,
    TOPK,
    BlockFingerprint,
    FingerprintError,
    Tolerance,
    compare_block,
    decode_block,
    decode_blocks,
    encode_block,
    evaluate,
    fp16_ordinal,
    interpolate,
    ulp_distance,
)

pytestmark = pytest.mark.unit

EXACT = Tolerance(max_ulp=0, min_match_per_mille=1000, max_mean_ulp_milli=0)
LOOSE = Tolerance(max_ulp=4, min_match_per_mille=900, max_mean_ulp_milli=2000)


def _fp16(value: float) -> int:
    return struct.unpack("<H", struct.pack("<e", value))[0]


def _rows(rng: random.Random, positions: int, hidden: int = 576) -> list[list[tuple[int, int]]]:
    rows = []
    for _ in range(positions):
        channels = rng.sample(range(hidden), TOPK)
        rows.append([(c, _fp16(rng.uniform(-200.0, 200.0))) for c in channels])
    return rows


def test_interpolate_polynomial_passes_through_every_point() -> None:
    rng = random.Random(1)
    for _ in range(200):
        points = [(x, rng.randrange(FIELD)) for x in rng.sample(range(FIELD), TOPK)]
        coefficients = interpolate(points)
        assert len(coefficients) == TOPK
        assert all(evaluate(coefficients, x) == y for x, y in points)


def test_interpolate_repeated_channel_is_rejected() -> None:
    with pytest.raises(FingerprintError):
        interpolate([(3, 1), (3, 2), (4, 5), (9, 9)])


def test_block_full_size_is_258_bytes() -> None:
    data = encode_block(_rows(random.Random(2), BLOCK_POSITIONS))
    assert len(data) == MAX_BLOCK_BYTES == 258


def test_block_roundtrip_recovers_every_value_at_its_channel() -> None:
    rows = _rows(random.Random(3), 17)
    block, used = decode_block(encode_block(rows))
    assert used == 2 + 17 * 2 * TOPK
    assert block.positions == 17
    for index, row in enumerate(rows):
        for channel, bits in row:
            assert block.value_at(index, channel) == bits


def test_decode_blocks_splits_a_concatenation() -> None:
    rng = random.Random(4)
    first, second = _rows(rng, 32), _rows(rng, 5)
    blocks = decode_blocks(encode_block(first) + encode_block(second))
    assert [b.positions for b in blocks] == [32, 5]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x01",
        b"\x02\x01" + b"\x00" * 8,  # unknown version
        b"\x01\x00",  # zero positions
        b"\x01\x21" + b"\x00" * 8 * 33,  # 33 positions
        b"\x01\x02" + b"\x00" * 15,  # truncated body
        b"\x01\x01" + b"\xff\xff" + b"\x00" * 6,  # coefficient >= FIELD
    ],
)
def test_decode_hostile_bytes_raise_named_error(data: bytes) -> None:
    with pytest.raises(FingerprintError):
        decode_blocks(data)


def test_decode_random_bytes_never_raise_anything_else() -> None:
    rng = random.Random(5)
    for _ in range(500):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        if rng.random() < 0.5 and data:
            data = bytes((1, min(32, max(1, data[0] % 33)))) + data
        with contextlib.suppress(FingerprintError):
            decode_blocks(data)


@pytest.mark.parametrize(
    "row",
    [
        [(1, 0), (2, 0), (3, 0)],  # too few
        [(1, 0), (2, 0), (3, 0), (FIELD, 0)],  # channel outside field
        [(1, 0), (2, 0), (3, 0), (4, 0x7C00)],  # +inf
        [(1, 0), (2, 0), (3, 0), (4, 0x7E01)],  # NaN
        [(1, 0), (2, 0), (3, 0), (-1, 0)],
    ],
)
def test_encode_bad_rows_raise_named_error(row: list[tuple[int, int]]) -> None:
    with pytest.raises(FingerprintError):
        encode_block([row])


def test_fp16_ordinal_orders_values_and_joins_zeros() -> None:
    values = [-3.5, -1.0, -0.0009765625, 0.0, 0.0009765625, 1.0, 1.0009765625, 3.5]
    ordinals = [fp16_ordinal(_fp16(v)) for v in values]
    assert ordinals == sorted(ordinals)
    assert fp16_ordinal(_fp16(-0.0)) == fp16_ordinal(_fp16(0.0)) == 0
    assert ulp_distance(_fp16(1.0), _fp16(1.0009765625)) == 1
    assert ulp_distance(_fp16(-1.0), _fp16(1.0)) == 2 * fp16_ordinal(_fp16(1.0))


def test_compare_same_rows_pass_exactly() -> None:
    rows = _rows(random.Random(6), 32)
    block, _ = decode_block(encode_block(rows))
    check = compare_block(block, rows, EXACT)
    assert check.passed and check.matched == check.values == 32 * TOPK
    assert check.ulp_sum_matched == 0


def _shift(rows: list[list[tuple[int, int]]], ulps: int, every: int = 1) -> list:
    """Move every `every`-th value by `ulps` ULPs away from zero."""
    out = []
    count = 0
    for row in rows:
        new = []
        for channel, bits in row:
            new.append((channel, bits + (ulps if count % every == 0 else 0)))
            count += 1
        out.append(new)
    return out


def test_compare_small_drift_passes_loose_fails_exact() -> None:
    rows = _rows(random.Random(7), 32)
    block, _ = decode_block(encode_block(rows))
    drifted = _shift(rows, 1, every=3)
    assert compare_block(block, drifted, LOOSE).passed
    assert not compare_block(block, drifted, EXACT).passed


def test_compare_large_drift_fails_loose() -> None:
    rows = _rows(random.Random(8), 32)
    block, _ = decode_block(encode_block(rows))
    check = compare_block(block, _shift(rows, 40), LOOSE)
    assert not check.passed and check.matched == 0


def test_compare_mean_ulp_bound_fails_uniform_drift_within_max() -> None:
    rows = _rows(random.Random(9), 32)
    block, _ = decode_block(encode_block(rows))
    check = compare_block(block, _shift(rows, 3), LOOSE)  # every value 3 ULPs off, mean 3 > 2
    assert check.matched == check.values and not check.passed


def test_compare_other_channels_do_not_match() -> None:
    rng = random.Random(10)
    rows = _rows(rng, 32)
    block, _ = decode_block(encode_block(rows))
    # the verifier's top-k landed on other channels (a different computation)
    other = [[(c + 1 if c + 1 < 576 else 0, b) for c, b in row] for row in rows]
    other = [row if len({c for c, _ in row}) == TOPK else rows[0] for row in other]
    check = compare_block(block, other, LOOSE)
    assert not check.passed
    assert check.match_per_mille < 100


def test_compare_position_count_mismatch_is_named_error() -> None:
    rows = _rows(random.Random(11), 4)
    block, _ = decode_block(encode_block(rows))
    with pytest.raises(FingerprintError):
        compare_block(block, rows[:3], LOOSE)


def test_tolerance_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        Tolerance(max_ulp=-1, min_match_per_mille=900, max_mean_ulp_milli=0)
    with pytest.raises(ValueError):
        Tolerance(max_ulp=1, min_match_per_mille=1001, max_mean_ulp_milli=0)


def test_block_fingerprint_value_at_uses_the_right_position() -> None:
    block = BlockFingerprint(((5, 0, 0, 0), (7, 1, 0, 0)))
    assert block.value_at(0, 100) == 5
    assert block.value_at(1, 3) == 10
