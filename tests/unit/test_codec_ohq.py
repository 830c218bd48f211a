"""The ohq7 wire codec (outlier split + Hadamard 7-bit): round trip, size, accuracy against hq9,
and every malformed body rejected with a named FrameError before anything large is allocated."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.frames import ohq
from protocol.frames.blocks import BLOCK
from protocol.frames.codecs import (
    CODECS,
    COMPRESSED_CODEC,
    body_size,
    decode_values,
    encode_body,
)
from protocol.frames.errors import BadBodyError, NonFiniteError, TooLargeError
from protocol.frames.header import FrameHeader, pack_frame, parse_frame

pytestmark = pytest.mark.unit

H = 576


def _hidden(t: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, t, H)).astype(np.float32) * 3
    x[0, 0, 5] = 22_500.0  # the token-0 outlier of real hidden states
    x[0, 1:, 507] = 70.0  # and an outlier channel on every other token
    return x


def _frame(rows: int, body: bytes, start: int = 0) -> bytes:
    """An ohq7 frame announcing `rows` positions, with `body` as it is."""
    return pack_frame(FrameHeader(1, start, rows, "float32", "ohq7"), body)


def make_frame(x: np.ndarray, *, start: int = 0, codec: str = "ohq7") -> bytes:
    header = FrameHeader(1, start, int(x.shape[1]), "float32", codec)
    return pack_frame(header, encode_body(x, "float32", codec))


def decode_frame(data: bytes, hidden: int = 64, max_tokens: int = 8192):
    """Parse (the one header parser) and decode a frame for a model of `hidden` values a row."""
    header, body = parse_frame(data, hidden, max_tokens)
    return header, decode_values(header.dtype, header.codec, (1, header.count, hidden), body)


def _body(x: np.ndarray) -> bytearray:
    return bytearray(encode_body(x, "float32", "ohq7"))


def test_ohq7_is_registered_appended_and_compress_is_not_ohq7():
    assert CODECS[:4] == ("raw", "int8", "hq9", "ohq7")  # wire names keep their places
    assert COMPRESSED_CODEC == "hq9"


def test_ohq7_roundtrip_shape_dtype_outlier_exact_and_error_bound():
    x = _hidden(9)
    header, y = decode_frame(make_frame(x, start=4), H)
    assert header.codec == "ohq7" and (header.start, header.count) == (4, 9)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert y[0, 0, 5] == x[0, 0, 5] and (y[0, 1:, 507] == 70.0).all()  # split off: exact
    # per block: the rest is rotated (orthonormal) and rounded to steps of <= |rest|_2 / 63,
    # so the error vector's L2 norm is <= 8 * step / 2 (fp16 scale rounding adds < 0.1 %)
    blocks = x.reshape(-1, BLOCK)
    rest = blocks.copy()
    rest[np.arange(len(rest)), np.abs(rest).argmax(axis=1)] = 0.0
    bound = 4 * np.linalg.norm(rest, axis=1) / 63 * 1.001 + 1e-6
    error = np.linalg.norm(y.reshape(-1, BLOCK) - blocks, axis=1)
    assert (error <= bound).all()
    rel = np.linalg.norm(y[0, 1:] - x[0, 1:]) / np.linalg.norm(x[0, 1:])
    assert rel < 0.02


def test_ohq7_body_is_under_a_quarter_of_fp32_and_smaller_than_hq9():
    x = _hidden(294)
    body = _body(x)
    assert len(body) == body_size("float32", "ohq7", x.size) == x.size // 64 * 63
    assert len(body) / (x.size * 4) <= 0.25
    assert len(body) < body_size("float32", "hq9", x.size)


def test_ohq7_beats_hq9_on_the_ordinary_values_beside_an_outlier_channel():
    x = np.random.default_rng(3).standard_normal((1, 16, H)).astype(np.float32)
    x[..., 7] = 140.0
    beside = [c for c in range(BLOCK) if c != 7]  # the outlier's block, outlier excluded

    def error(codec: str) -> float:
        _, y = decode_frame(make_frame(x, codec=codec), H)
        return float(np.linalg.norm((y - x)[..., beside]) / np.linalg.norm(x[..., beside]))

    # hq9 spreads the 140 over its rotated block, so its 9-bit step is ~8x coarser there
    assert error("ohq7") < error("hq9") / 1.5


def test_ohq7_zeros_and_odd_lengths_round_trip():
    zeros = np.zeros((1, 2, 64), dtype=np.float32)
    assert (decode_frame(make_frame(zeros))[1] == 0).all()
    odd = np.linspace(-1, 1, 3 * 50, dtype=np.float32).reshape(1, 3, 50)
    _, y = decode_frame(make_frame(odd), 50)
    assert y.shape == odd.shape and np.abs(y - odd).max() < 8 / 63


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_ohq_probe_widths_round_trip_with_error_falling_as_bits_grow(bits: int):
    x = _hidden(4)
    y = ohq.decode(ohq.encode(x, bits), x.size, bits).reshape(x.shape)
    rel = np.linalg.norm(y[0, 1:] - x[0, 1:]) / np.linalg.norm(x[0, 1:])
    assert rel < 2.0 ** -(bits - 3)


def test_ohq7_encoder_names_a_scale_overflow():
    x = np.zeros((1, 1, 64), dtype=np.float32)
    x[0, 0, :2] = 1e30  # two huge values in one block: the rest's scale overflows float16
    with pytest.raises(NonFiniteError):
        make_frame(x)


# ------------------------------------------------------------------------------- malformed
def _one_block() -> bytearray:
    return _body(np.random.default_rng(1).standard_normal((1, 1, 64)).astype(np.float32))


@pytest.mark.parametrize("cut", [1, 7, 62])
def test_ohq7_truncated_body_is_bad_body(cut: int):
    body = _one_block()
    with pytest.raises(BadBodyError):
        decode_frame(_frame(1, bytes(body[:-cut])))
    with pytest.raises(BadBodyError):
        decode_frame(_frame(1, bytes(body) + b"\0"))


def test_ohq7_wrong_size_for_the_shape_is_bad_body():
    body = _one_block()  # one block, but the header claims two rows of 64
    with pytest.raises(BadBodyError):
        decode_frame(_frame(2, bytes(body)))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_ohq7_non_finite_scale_or_outlier_is_non_finite(value: float):
    body = _one_block()
    scale = bytearray(body)
    scale[5:7] = np.array([value], dtype="<f2").tobytes()
    with pytest.raises(NonFiniteError):
        decode_frame(_frame(1, bytes(scale)))
    outlier = bytearray(body)
    outlier[1:5] = np.array([value], dtype="<f4").tobytes()
    with pytest.raises(NonFiniteError):
        decode_frame(_frame(1, bytes(outlier)))


@pytest.mark.parametrize("index", [64, 200, 255])
def test_ohq7_outlier_index_outside_the_block_is_bad_body(index: int):
    body = _one_block()
    body[0] = index
    with pytest.raises(BadBodyError):
        decode_frame(_frame(1, bytes(body)))


def test_ohq7_code_127_is_out_of_range():
    body = _one_block()
    body[7:] = b"\xff" * (len(body) - 7)  # every 7-bit code = 127 > 2 * 63
    with pytest.raises(BadBodyError):
        decode_frame(_frame(1, bytes(body)))


def test_ohq7_huge_dims_rejected_from_sizes_before_allocating():
    body = bytes(_one_block())
    huge = _frame(2**31 - 1, body)
    with pytest.raises(TooLargeError):
        parse_frame(huge, 2**31 - 1, 8192)
    with pytest.raises(BadBodyError):
        parse_frame(huge, 2**31 - 1, 2**31)
    # decode straight from a shape: the size check comes before any array is made
    with pytest.raises(BadBodyError):
        decode_values("float32", "ohq7", (1, 2**31 - 1, 2**31 - 1), body)
