"""Frames: round trips for every dtype/codec through the one header parser, and every rejection
path of the header and the body."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from protocol.errors import ProtocolError
from protocol.frames.blocks import BLOCK
from protocol.frames.codecs import CODECS, DTYPES, body_size, decode_values, encode_body
from protocol.frames.errors import (
    BadBodyError,
    BadCodecError,
    BadDtypeError,
    BadHeaderError,
    BadPositionsError,
    BadSessionIdError,
    NonFiniteError,
    TooLargeError,
)
from protocol.frames.header import FRAME_HEADER_BYTES, FrameHeader, pack_frame, parse_frame
from protocol.frames.rq import DEFAULT_EXPONENT, step_delta
from protocol.frames.sessions import check_session_id, session_tag

pytestmark = pytest.mark.unit

H = 576


def _hidden(t: int, h: int = H, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, t, h)).astype(np.float32) * 3
    x[0, 0, 5] = 22_500.0  # the token-0 outlier real hidden states carry
    return x


def _frame(
    x: np.ndarray, *, start: int = 0, dtype: str = "float32", codec: str = "raw", sid: int = 7
) -> bytes:
    header = FrameHeader(sid, start, int(x.shape[1]), dtype, codec)
    return pack_frame(header, encode_body(x, dtype, codec))


def _decode(data: bytes, hidden: int = H, max_tokens: int = 8192):
    header, body = parse_frame(data, hidden, max_tokens)
    return header, decode_values(header.dtype, header.codec, (1, header.count, hidden), body)


def _raw(
    body: bytes, *, count: int = 2, dtype: int = 0, codec: int = 0, flags: int = 0, **over: int
) -> bytes:
    """A frame of hidden size 4 with any header field values."""
    fields = {"kind": 1, "version": 1, "sid": 1, "start": 0, **over}
    head = struct.pack(
        ">BBIIIBBB",
        fields["kind"],
        fields["version"],
        fields["sid"],
        fields["start"],
        count,
        dtype,
        codec,
        flags,
    )
    return head + body


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("codec", CODECS)
def test_frame_roundtrip_each_dtype_codec_preserves_header_and_values(dtype: str, codec: str):
    x = _hidden(7)
    header, y = _decode(_frame(x, start=11, dtype=dtype, codec=codec, sid=3))
    assert (header.sid, header.start, header.count, header.last_only) == (3, 11, 7, False)
    assert header.dtype == dtype and header.codec == codec
    assert y.dtype == np.float32 and y.shape == x.shape
    if codec == "raw" and dtype == "float32":
        np.testing.assert_array_equal(y, x)
    elif codec == "hq9":
        # rotated blocks: error bounded by the block's L2 norm / 255 per value (orthonormal)
        blocks = x.reshape(-1, BLOCK)
        bound = np.linalg.norm(blocks, axis=1, keepdims=True) / 255 + 1e-5
        assert (np.abs(y.reshape(-1, BLOCK) - blocks) <= bound).all()
        rel = np.linalg.norm(y[0, 1:] - x[0, 1:]) / np.linalg.norm(x[0, 1:])
        assert rel < 0.004
    elif codec == "ohq7":
        # largest value per block exact; the rest rotated, steps <= its L2 norm / 63
        blocks = x.reshape(-1, BLOCK)
        bound = 4 * np.linalg.norm(blocks, axis=1, keepdims=True) / 63 * 1.001 + 1e-5
        assert (np.abs(y.reshape(-1, BLOCK) - blocks) <= bound).all()
        assert y[0, 0, 5] == x[0, 0, 5]
        rel = np.linalg.norm(y[0, 1:] - x[0, 1:]) / np.linalg.norm(x[0, 1:])
        assert rel < 0.02
    elif codec == "rq":
        # uniform step per token: its rms x 2**(-exponent/4); error at most half a step
        rms = np.sqrt(np.mean(np.square(x[0], dtype=np.float64), axis=1, keepdims=True))
        step = rms * step_delta(DEFAULT_EXPONENT)
        assert (np.abs(y[0] - x[0]) <= step / 2 * 1.0001).all()
    else:
        # error bounded per block: int8 → absmax/254, fp16 → 2^-11 relative
        blocks = x.reshape(-1, BLOCK)
        bound = np.abs(blocks).max(axis=1, keepdims=True) / 254 + 1e-6
        if codec == "raw":
            bound = np.abs(blocks) * 2.0**-11 + 1e-6
        assert (np.abs(y.reshape(-1, BLOCK) - blocks) <= bound * 1.001).all()


def test_frame_header_is_17_bytes_and_last_only_is_flag_bit_0():
    x = _hidden(1)
    data = pack_frame(FrameHeader(2**32 - 1, 4, 1, "float16", "int8", True), b"")
    assert len(data) == FRAME_HEADER_BYTES == 17
    assert data == bytes([1, 1]) + struct.pack(">III", 2**32 - 1, 4, 1) + bytes([1, 1, 1])
    header, _ = parse_frame(data + encode_body(x, "float16", "int8"), H, 8)
    assert header == FrameHeader(2**32 - 1, 4, 1, "float16", "int8", True)


def test_frame_int8_size_is_under_30_percent_of_fp32():
    x = _hidden(294)
    raw = _frame(x)
    packed = _frame(x, codec="int8")
    assert body_size("float32", "int8", x.size) / (x.size * 4) < 0.27
    assert len(packed) / len(raw) <= 0.30


def test_frame_hq9_size_is_under_30_percent_of_fp32_body():
    x = _hidden(294)
    assert body_size("float32", "hq9", x.size) / (x.size * 4) <= 0.30
    _, body = parse_frame(_frame(x, codec="hq9"), H, 8192)
    assert len(body) == body_size("float32", "hq9", x.size)


def test_frame_hq9_more_accurate_than_int8_with_outlier_channel():
    x = np.random.default_rng(3).standard_normal((1, 16, 576)).astype(np.float32)
    x[..., 7] = 140.0  # an outlier channel, as real hidden states have

    def error(codec: str) -> float:
        _, y = _decode(_frame(x, codec=codec))
        return float(np.linalg.norm(y - x) / np.linalg.norm(x))

    assert error("hq9") < error("int8") / 3


def test_frame_hq9_out_of_range_code_is_bad_body():
    n = 64
    body = np.ones(1, dtype="<f4").tobytes() + bytes([0xFF]) * n + bytes([0xFF]) * (n // 8)
    with pytest.raises(BadBodyError):
        _decode(_raw(body, count=16, codec=2), hidden=4)


@pytest.mark.parametrize("codec", ["int8", "hq9"])
def test_frame_compressed_odd_length_pads_last_block(codec: str):
    x = np.linspace(-1, 1, 1 * 3 * 50, dtype=np.float32).reshape(1, 3, 50)
    _, y = _decode(_frame(x, codec=codec), hidden=50)
    assert np.abs(y - x).max() <= 8 / 254 + 1e-6


def test_frame_int8_odd_length_pads_last_block():
    x = np.linspace(-1, 1, 1 * 3 * 50, dtype=np.float32).reshape(1, 3, 50)
    _, y = _decode(_frame(x, codec="int8"), hidden=50)
    assert np.abs(y - x).max() <= 1 / 254 + 1e-6


def test_frame_int8_all_zero_block_decodes_to_zero():
    x = np.zeros((1, 1, 128), dtype=np.float32)
    _, y = _decode(_frame(x, codec="int8"), hidden=128)
    np.testing.assert_array_equal(y, x)


def test_frame_float16_overflow_refused_at_sender():
    x = np.full((1, 1, 4), 70_000.0, dtype=np.float32)
    with pytest.raises(NonFiniteError):
        encode_body(x, "float16", "raw")


@pytest.mark.parametrize(
    ("data", "error", "code"),
    [
        (b"", BadHeaderError, "bad_header"),
        (b"\x01\x01" + bytes(14), BadHeaderError, "bad_header"),
        (_raw(bytes(32), kind=2), BadHeaderError, "bad_header"),
        (_raw(bytes(32), version=9), BadHeaderError, "bad_header"),
        (_raw(bytes(32), flags=0x04), BadHeaderError, "bad_header"),
        (_raw(bytes(32), flags=0x81), BadHeaderError, "bad_header"),
        (_raw(bytes(64), dtype=2), BadDtypeError, "bad_dtype"),
        (_raw(bytes(16), dtype=255), BadDtypeError, "bad_dtype"),
        (_raw(bytes(32), codec=5), BadCodecError, "bad_codec"),
        (_raw(b"", count=0), BadPositionsError, "bad_positions"),
        (_raw(bytes(32), start=2**31 - 2), BadPositionsError, "bad_positions"),
        (_raw(bytes(32), start=2**32 - 1), BadPositionsError, "bad_positions"),
        (_raw(bytes(31)), BadBodyError, "bad_body"),
        (_raw(bytes(33)), BadBodyError, "bad_body"),
        (_raw(bytes(32), dtype=1), BadBodyError, "bad_body"),  # float16: 16 bytes
        (_raw(bytes(32), codec=1), BadBodyError, "bad_body"),  # int8: 4 + 8 bytes
        (_raw(bytes(8), codec=4), BadBodyError, "bad_body"),  # rq: below its smallest body
    ],
)
def test_parse_frame_malformed_raises_named_code(data: bytes, error: type, code: str):
    with pytest.raises(error) as caught:
        parse_frame(data, 4, 64)
    assert caught.value.code == code
    assert isinstance(caught.value, ProtocolError) and caught.value.http_status == 400


def test_parse_frame_hidden_size_mismatch_is_bad_body():
    data = _frame(_hidden(2, h=64))
    with pytest.raises(BadBodyError):
        parse_frame(data, 576, 64)


def test_parse_frame_too_many_positions_is_too_large():
    data = _frame(_hidden(9, h=8))
    with pytest.raises(TooLargeError) as caught:
        parse_frame(data, 8, 8)
    assert caught.value.http_status == 413


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decode_non_finite_values_rejected(bad: float, dtype: str):
    x = np.zeros((1, 2, 8), dtype=np.float32)
    x[0, 1, 3] = bad
    body = x.astype(DTYPES[dtype]).tobytes()
    with pytest.raises(NonFiniteError) as caught:
        _decode(_raw(body, dtype=list(DTYPES).index(dtype)), hidden=8)
    assert caught.value.code == "non_finite"


def test_decode_int8_non_finite_scale_rejected():
    body = np.array([np.nan], dtype="<f4").tobytes() + bytes(8)
    with pytest.raises(NonFiniteError):
        _decode(_raw(body, codec=1), hidden=4)


@pytest.mark.parametrize(
    "value", ["short", "a-good-id\n" * 3, "../../etc/pw-long-enough-x", "é" * 30, None, 7]
)
def test_session_capability_malformed_is_bad_session_id(value: object):
    with pytest.raises(BadSessionIdError):
        check_session_id(value)


def test_session_tag_is_sha256_hex_and_hides_the_capability():
    capability = "abcdEFGH1234_-xy-capability"
    tag = session_tag(capability)
    assert len(tag) == 64 and int(tag, 16) >= 0 and capability not in tag
    assert session_tag(capability) == tag != session_tag(capability + "2")
