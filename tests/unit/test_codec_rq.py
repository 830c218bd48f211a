"""The rq wire codec (rms-scaled uniform quantization, Rice-coded): error bound, determinism,
sizes against hq9, and a hostile grammar: every malformed body is refused with a named
FrameError (bad_body / non_finite), never another exception."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from protocol.frames import rq
from protocol.frames.codecs import CODECS, body_size, decode_values, encode_body
from protocol.frames.errors import BadBodyError, FrameError, NonFiniteError
from protocol.frames.header import FrameHeader, pack_frame, parse_frame

pytestmark = pytest.mark.unit

H = 576


def _hidden(t: int, h: int = H, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, t, h)).astype(np.float32) * 3
    x[0, 0, 5] = 22_500.0  # the token-0 outlier of real hidden states
    if h > 507:
        x[0, 1:, 507] = 70.0  # and an outlier channel on every other token
    return x


def _steps(x: np.ndarray, exponent: int = rq.DEFAULT_EXPONENT) -> np.ndarray:
    rms = np.sqrt(np.mean(np.square(x.reshape(-1, x.shape[-1]), dtype=np.float64), axis=1))
    return rms * rq.step_delta(exponent)


def _header(rows: int, width: int) -> tuple[int, int, int]:
    """The shape a frame header of `rows` positions announces, for a model of `width`."""
    return (1, rows, width)


def decode_body(shape: tuple[int, int, int], body: bytes) -> np.ndarray:
    return decode_values("float32", "rq", shape, body)


def _body(
    steps: list[float],
    ks: list[int],
    runs: list[int],
    lows: list[tuple[int, int]],
    escapes: list[int] = (),
    *,
    unary_pad: int = 0,
    low_pad: int = 0,
) -> bytes:
    """A hand-made rq body: `runs` unary high parts, `lows` (value, width) low-bit fields."""
    nib = list(ks) + [0] * (len(ks) % 2)
    packed_k = bytes(nib[i] | (nib[i + 1] << 4) for i in range(0, len(nib), 2))
    ubits = []
    for run in runs:
        ubits += [0] * run + [1]
    ubits += [0] * unary_pad
    lbits = []
    for value, width in lows:
        lbits += [(value >> j) & 1 for j in range(width)]
    lbits += [1] * low_pad  # non-zero padding when low_pad > 0
    unary = np.packbits(np.array(ubits, dtype=np.uint8), bitorder="little").tobytes()
    low = np.packbits(np.array(lbits, dtype=np.uint8), bitorder="little").tobytes()
    return b"".join(
        (
            np.array(steps, dtype="<f4").tobytes(),
            packed_k,
            struct.pack("<I", len(unary)),
            unary,
            struct.pack("<I", len(low)),
            low,
            np.array(escapes, dtype="<u4").tobytes(),
        )
    )


# ----------------------------------------------------------------------------- round trips
def test_rq_is_a_registered_variable_rate_codec():
    assert "rq" in CODECS
    assert body_size("float32", "rq", 294 * H, width=H) == rq.body_bounds(294, H)[1]


@pytest.mark.parametrize("shape", [(1, 1, H), (1, 294, H), (1, 3, 100), (1, 2, 64), (1, 5, 7)])
def test_rq_error_is_at_most_half_a_token_step(shape: tuple[int, int, int]):
    x = _hidden(shape[1], shape[2])
    y = rq.decode(rq.encode(x), shape[1], shape[2])
    bound = _steps(x)[:, None] / 2 * 1.0001
    assert y.dtype == np.float32 and y.shape == shape[1:]
    assert (np.abs(y - x[0]) <= bound).all()


def test_rq_decodes_the_same_bytes_to_the_same_values_and_encodes_deterministically():
    x = _hidden(40)
    body = rq.encode(x)
    assert rq.encode(x.copy()) == body
    np.testing.assert_array_equal(rq.decode(body, 40, H), rq.decode(bytes(body), 40, H))


def test_rq_zero_rows_and_huge_outliers_take_the_escape_path():
    x = np.zeros((1, 3, H), dtype=np.float32)
    x[0, 1, 9] = 1e6  # one value far above its row's rms: escaped, not a 3,000-bit unary run
    x[0, 2] = np.linspace(-1, 1, H)
    body = rq.encode(x)
    y = rq.decode(body, 3, H)
    assert (y[0] == 0).all()
    assert abs(y[1, 9] - 1e6) <= _steps(x)[1] / 2 * 1.0001
    assert len(body) < rq.body_bounds(3, H)[1] // 4


def test_rq_finer_exponent_gives_smaller_error_and_bigger_body():
    x = _hidden(64)
    sizes, errors = [], []
    for exponent in (16, 24, 29, 36):
        body = rq.encode(x, exponent)
        sizes.append(len(body))
        errors.append(float(np.abs(rq.decode(body, 64, H) - x[0]).max()))
    assert sizes == sorted(sizes) and errors == sorted(errors, reverse=True)


def test_rq_default_is_smaller_than_hq9_on_gaussian_rows_with_outlier_channels():
    x = _hidden(294)
    ratio = len(rq.encode(x)) / (x.size * 4)
    assert ratio < body_size("float32", "hq9", x.size) / (x.size * 4)
    one = len(rq.encode(x[:, 5:6])) / (H * 4)  # a decode step: one row and its own overhead
    assert one < 0.30


def test_rq_refuses_to_encode_non_finite_values():
    x = _hidden(2)
    x[0, 1, 3] = np.nan
    with pytest.raises(NonFiniteError):
        encode_body(x, "float32", "rq")


def test_rq_frame_parses_with_its_variable_body_and_rejects_sizes_outside_bounds():
    x = _hidden(4)
    header = FrameHeader(1, 0, 4, "float32", "rq")
    data = pack_frame(header, encode_body(x, "float32", "rq"))
    parsed, body = parse_frame(data, H, 64)
    y = decode_values(parsed.dtype, parsed.codec, (1, 4, H), body)
    assert parsed.codec == "rq" and y.shape == x.shape
    smallest, largest = rq.body_bounds(4, H)
    for size in (0, smallest - 1, largest + 1):
        with pytest.raises(BadBodyError):
            parse_frame(pack_frame(header, bytes(size)), H, 64)


# ----------------------------------------------------------------------------- hostile bodies
def test_rq_hand_made_body_decodes():
    # one row of 3 values, k = 1: u = 5 (q = -3), 0 (q = 0), 2 (q = 1)
    body = _body([0.5], [1], [2, 0, 1], [(1, 1), (0, 1), (0, 1)])
    np.testing.assert_array_equal(rq.decode(body, 1, 3), [[-1.5, 0.0, 0.5]])


@pytest.mark.parametrize(
    "body, error, words",
    [
        (_body([np.nan], [0], [0, 0, 0], []), NonFiniteError, "NaN"),
        (_body([np.inf], [0], [0, 0, 0], []), NonFiniteError, "NaN or Inf"),
        (_body([-1.0], [0], [0, 0, 0], []), BadBodyError, "negative"),
        (_body([1.0], [0], [0, 0], []), BadBodyError, "holds 2 values"),
        (_body([1.0], [0], [0, 0, 0, 0], []), BadBodyError, "holds 4 values"),
        (_body([1.0], [0], [0, 0, 0], [], unary_pad=9), BadBodyError, "padding"),
        (_body([1.0], [1], [0, 0, 0], [(0, 1), (0, 1), (0, 1)], low_pad=1), BadBodyError, "0"),
        (_body([1.0], [3], [0, 0, 0], [(0, 3), (0, 3)]), BadBodyError, "low-bit stream"),
        (_body([1.0], [0], [0, 25, 0], []), BadBodyError, "longer than the escape"),
        (_body([1.0], [0], [0, 24, 0], [], [5]), BadBodyError, "small enough"),
        (_body([1.0], [0], [0, 24, 0], [], [1 << 24]), BadBodyError, "2**24"),
        (_body([1.0], [0], [0, 24, 0], [], []), BadBodyError, "escapes"),
        (_body([1.0], [0], [0, 0, 0], [], [99]), BadBodyError, "escapes"),
        (_body([3e38], [0], [0, 24, 0], [], [1 << 23]), NonFiniteError, "overflows"),
        (_body([1.0], [0], [0, 0, 0], [], unary_pad=85), BadBodyError, "exceeds 10"),
    ],
    ids=[
        "nan-step",
        "inf-step",
        "negative-step",
        "too-few-values",
        "too-many-values",
        "unary-padding-byte",
        "low-padding-not-zero",
        "low-stream-short",
        "run-past-escape",
        "non-minimal-escape",
        "escape-too-big",
        "escape-missing",
        "escape-extra",
        "overflow",
        "unary-longer-than-shape-allows",
    ],
)
def test_rq_malformed_bodies_are_named(body: bytes, error: type[FrameError], words: str):
    with pytest.raises(error) as caught:
        decode_body(_header(1, 3), body)
    assert words in caught.value.message


def test_rq_non_zero_padding_nibble_and_lengths_past_the_end_are_named():
    # 1 row of 64 + 1 = 2 blocks: even; 1 row of 65 values has 2 blocks, 3 rows of 3 have 3
    good = _body([1.0, 1.0, 1.0], [0, 0, 0], [0] * 9, [])
    decode_body(_header(3, 3), good)
    bad = bytearray(good)
    bad[12 + 1] |= 0x10  # the pad nibble after 3 Rice parameters
    with pytest.raises(BadBodyError, match="padding nibble"):
        decode_body(_header(3, 3), bytes(bad))
    bad = bytearray(good)
    struct.pack_into("<I", bad, 14, 1000)  # unary length runs past the end
    with pytest.raises(BadBodyError, match="runs past the end"):
        decode_body(_header(3, 3), bytes(bad))


def test_rq_hostile_unary_stream_of_ones_is_refused_before_indexing_it():
    rows, width = 64, 576
    n = rows * width
    size = -(-n * (rq.ESCAPE + 1) // 8)  # the longest unary stream this shape allows
    blocks = rows * -(-width // rq.RQ_BLOCK)
    body = b"".join(
        (
            bytes(4 * rows),
            bytes(-(-blocks // 2)),
            struct.pack("<I", size),
            b"\xff" * size,
            struct.pack("<I", 0),
        )
    )
    with pytest.raises(BadBodyError, match=f"holds {size * 8} values, expected {n}"):
        decode_body(_header(rows, width), body)


def test_rq_fuzzed_bodies_only_ever_raise_frame_errors():
    rng = np.random.default_rng(7)
    x = _hidden(3, 100)
    x[0, 2, 50] = 1e5  # so the escape list is not empty
    good = rq.encode(x)
    header = _header(3, 100)
    outcomes = {"decoded": 0, "refused": 0}
    for trial in range(1500):
        data = bytearray(good)
        kind = trial % 4
        if kind == 0:  # flip 1-3 bits
            for _ in range(int(rng.integers(1, 4))):
                i = int(rng.integers(len(data)))
                data[i] ^= 1 << int(rng.integers(8))
        elif kind == 1:  # truncate
            data = data[: int(rng.integers(len(data)))]
        elif kind == 2:  # append junk
            data += rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
        else:  # overwrite a span with random bytes
            i = int(rng.integers(len(data)))
            span = rng.integers(0, 256, int(rng.integers(1, 12)), dtype=np.uint8).tobytes()
            data[i : i + len(span)] = span
        try:
            y = decode_body(header, bytes(data))
        except FrameError as error:
            assert error.code in {"bad_body", "non_finite"}
            outcomes["refused"] += 1
        else:
            assert y.shape == (1, 3, 100) and np.isfinite(y).all()
            outcomes["decoded"] += 1
    assert outcomes["refused"] > 1000 and outcomes["decoded"] > 0


def test_rq_frame_with_a_hostile_header_shape_is_refused_before_decoding():
    body = rq.encode(_hidden(2, 8))
    data = pack_frame(FrameHeader(1, 0, 3, "float32", "rq"), body)  # 3 rows claimed, 2 sent
    with pytest.raises(FrameError) as caught:
        header, view = parse_frame(data, 8, 64)
        decode_values(header.dtype, header.codec, (1, 3, 8), view)
    assert caught.value.code == "bad_body"
