"""Activation frames: round trips for every dtype/codec and every rejection path."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from protocol.canonical import canonical_json
from protocol.codec_rq import DEFAULT_EXPONENT, step_delta
from protocol.errors import ProtocolError
from protocol.frames import (
    CODECS,
    DTYPES,
    INT8_BLOCK,
    MAGIC,
    BadBodyError,
    BadCodecError,
    BadDtypeError,
    BadHeaderError,
    BadMagicError,
    BadPositionsError,
    BadSessionIdError,
    BadShapeError,
    BadVersionError,
    FrameLimits,
    NonFiniteError,
    TooLargeError,
    body_size,
    decode_frame,
    make_frame,
    parse_frame,
    with_header,
)

pytestmark = pytest.mark.unit

SESSION = "abcdEFGH1234_-xy-capability"
H = 576


def _hidden(t: int, h: int = H, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, t, h)).astype(np.float32) * 3
    x[0, 0, 5] = 22_500.0  # the token-0 outlier real hidden states carry
    return x


def _raw_frame(header: dict, body: bytes, *, magic: bytes = MAGIC, version: int = 1) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">4sHI", magic, version, len(head)) + head + body


def _header(**over: object) -> dict:
    base = {
        "session": SESSION,
        "step": 0,
        "positions": {"start": 0, "count": 2},
        "dtype": "float32",
        "shape": [1, 2, 4],
        "codec": "raw",
        "shard": 0,
    }
    base.update(over)
    return base


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("codec", CODECS)
def test_frame_roundtrip_each_dtype_codec_preserves_header_and_values(dtype: str, codec: str):
    x = _hidden(7)
    data = make_frame(x, session=SESSION, step=3, start=11, shard=2, dtype=dtype, codec=codec)
    header, y = decode_frame(data, FrameLimits(hidden_size=H))
    assert (header.session, header.step, header.start, header.count) == (SESSION, 3, 11, 7)
    assert header.shape == (1, 7, H) and header.shard == 2
    assert header.dtype == dtype and header.codec == codec
    assert y.dtype == np.float32 and y.shape == x.shape
    if codec == "raw" and dtype == "float32":
        np.testing.assert_array_equal(y, x)
    elif codec == "hq9":
        # rotated blocks: error bounded by the block's L2 norm / 255 per value (orthonormal)
        blocks = x.reshape(-1, INT8_BLOCK)
        bound = np.linalg.norm(blocks, axis=1, keepdims=True) / 255 + 1e-5
        assert (np.abs(y.reshape(-1, INT8_BLOCK) - blocks) <= bound).all()
        rel = np.linalg.norm(y[0, 1:] - x[0, 1:]) / np.linalg.norm(x[0, 1:])
        assert rel < 0.004
    elif codec == "ohq7":
        # largest value per block exact; the rest rotated, steps <= its L2 norm / 63
        blocks = x.reshape(-1, INT8_BLOCK)
        bound = 4 * np.linalg.norm(blocks, axis=1, keepdims=True) / 63 * 1.001 + 1e-5
        assert (np.abs(y.reshape(-1, INT8_BLOCK) - blocks) <= bound).all()
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
        blocks = x.reshape(-1, INT8_BLOCK)
        bound = np.abs(blocks).max(axis=1, keepdims=True) / 254 + 1e-6
        if codec == "raw":
            bound = np.abs(blocks) * 2.0**-11 + 1e-6
        assert (np.abs(y.reshape(-1, INT8_BLOCK) - blocks) <= bound * 1.001).all()


def test_frame_int8_size_is_under_30_percent_of_fp32():
    x = _hidden(294)
    raw = make_frame(x, session=SESSION, step=0, start=0, shard=0)
    packed = make_frame(x, session=SESSION, step=0, start=0, shard=0, codec="int8")
    assert body_size("float32", "int8", x.size) / (x.size * 4) < 0.27
    assert len(packed) / len(raw) <= 0.30


def test_frame_hq9_size_is_under_30_percent_of_fp32_body():
    x = _hidden(294)
    assert body_size("float32", "hq9", x.size) / (x.size * 4) <= 0.30
    body = parse_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec="hq9")).body
    assert len(body) == body_size("float32", "hq9", x.size)


def test_frame_hq9_more_accurate_than_int8_with_outlier_channel():
    x = np.random.default_rng(3).standard_normal((1, 16, 576)).astype(np.float32)
    x[..., 7] = 140.0  # an outlier channel, as real hidden states have

    def error(codec: str) -> float:
        _, y = decode_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec=codec))
        return float(np.linalg.norm(y - x) / np.linalg.norm(x))

    assert error("hq9") < error("int8") / 3


def test_frame_hq9_out_of_range_code_is_bad_body():
    n = 64
    body = np.ones(1, dtype="<f4").tobytes() + bytes([0xFF]) * n + bytes([0xFF]) * (n // 8)
    data = _raw_frame(
        _header(codec="hq9", shape=[1, 16, 4], positions={"start": 0, "count": 16}), body
    )
    with pytest.raises(BadBodyError):
        decode_frame(data)


@pytest.mark.parametrize("codec", ["int8", "hq9"])
def test_frame_compressed_odd_length_pads_last_block(codec: str):
    x = np.linspace(-1, 1, 1 * 3 * 50, dtype=np.float32).reshape(1, 3, 50)
    _, y = decode_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec=codec))
    assert np.abs(y - x).max() <= 8 / 254 + 1e-6


def test_frame_int8_odd_length_pads_last_block():
    x = np.linspace(-1, 1, 1 * 3 * 50, dtype=np.float32).reshape(1, 3, 50)
    _, y = decode_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec="int8"))
    assert np.abs(y - x).max() <= 1 / 254 + 1e-6


def test_frame_int8_all_zero_block_decodes_to_zero():
    x = np.zeros((1, 1, 128), dtype=np.float32)
    _, y = decode_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec="int8"))
    np.testing.assert_array_equal(y, x)


def test_frame_header_is_canonical_json():
    data = make_frame(_hidden(1), session=SESSION, step=1, start=4, shard=1)
    (length,) = struct.unpack_from(">I", data, 6)
    head = json.loads(data[10 : 10 + length])
    assert data[10 : 10 + length] == canonical_json(head)
    assert head["positions"] == {"start": 4, "count": 1} and "last_only" not in head


def test_frame_with_header_relays_body_unchanged():
    x = _hidden(3)
    frame = parse_frame(make_frame(x, session=SESSION, step=0, start=0, shard=0, codec="int8"))
    moved = parse_frame(with_header(frame, shard=1, last_only=True))
    assert moved.header.shard == 1 and moved.header.last_only
    assert bytes(moved.body) == bytes(frame.body)


def test_frame_positions_list_form_accepted_when_contiguous():
    frame = parse_frame(_raw_frame(_header(positions=[5, 6]), bytes(32)))
    assert frame.header.positions == range(5, 7)


def test_frame_float16_overflow_refused_at_sender():
    x = np.full((1, 1, 4), 70_000.0, dtype=np.float32)
    with pytest.raises(NonFiniteError):
        make_frame(x, session=SESSION, step=0, start=0, shard=0, dtype="float16")


@pytest.mark.parametrize(
    ("data", "error", "code"),
    [
        (b"PLA", BadMagicError, "bad_magic"),
        (_raw_frame(_header(), bytes(32), magic=b"XXXX"), BadMagicError, "bad_magic"),
        (_raw_frame(_header(), bytes(32), version=9), BadVersionError, "bad_version"),
        (struct.pack(">4sHI", MAGIC, 1, 10_000) + b"{}", BadHeaderError, "bad_header"),
        (struct.pack(">4sHI", MAGIC, 1, 3) + b"{x}", BadHeaderError, "bad_header"),
        (struct.pack(">4sHI", MAGIC, 1, 2) + b"[]", BadHeaderError, "bad_header"),
        (_raw_frame({"session": SESSION}, b""), BadHeaderError, "bad_header"),
        (_raw_frame(_header(extra=1), bytes(32)), BadHeaderError, "bad_header"),
        (_raw_frame(_header(step=-1), bytes(32)), BadHeaderError, "bad_header"),
        (_raw_frame(_header(step=True), bytes(32)), BadHeaderError, "bad_header"),
        (_raw_frame(_header(last_only="yes"), bytes(32)), BadHeaderError, "bad_header"),
        (_raw_frame(_header(session="short"), bytes(32)), BadSessionIdError, "bad_session_id"),
        (
            _raw_frame(_header(session="a-good-id\n"), bytes(32)),
            BadSessionIdError,
            "bad_session_id",
        ),
        (
            _raw_frame(_header(session="../../etc/pw"), bytes(32)),
            BadSessionIdError,
            "bad_session_id",
        ),
        (_raw_frame(_header(dtype="float64"), bytes(64)), BadDtypeError, "bad_dtype"),
        (_raw_frame(_header(dtype="bfloat16"), bytes(16)), BadDtypeError, "bad_dtype"),
        (_raw_frame(_header(codec="zstd"), bytes(32)), BadCodecError, "bad_codec"),
        (_raw_frame(_header(shape=[2, 2, 4]), bytes(64)), BadShapeError, "bad_shape"),
        (_raw_frame(_header(shape=[1, 8]), bytes(32)), BadShapeError, "bad_shape"),
        (_raw_frame(_header(shape=[1, 3, 4]), bytes(48)), BadShapeError, "bad_shape"),
        (_raw_frame(_header(shape=[1, 2, 0]), b""), BadShapeError, "bad_shape"),
        (
            _raw_frame(_header(positions={"start": -1, "count": 2}), bytes(32)),
            BadPositionsError,
            "bad_positions",
        ),
        (
            _raw_frame(_header(positions={"start": 0, "count": 0}), bytes(32)),
            BadPositionsError,
            "bad_positions",
        ),
        (
            _raw_frame(_header(positions={"start": 0}), bytes(32)),
            BadPositionsError,
            "bad_positions",
        ),
        (_raw_frame(_header(positions=[3, 5]), bytes(32)), BadPositionsError, "bad_positions"),
        (_raw_frame(_header(positions=[]), bytes(32)), BadPositionsError, "bad_positions"),
        (_raw_frame(_header(), bytes(31)), BadBodyError, "bad_body"),
        (_raw_frame(_header(), bytes(33)), BadBodyError, "bad_body"),
        (_raw_frame(_header(codec="int8"), bytes(32)), BadBodyError, "bad_body"),
    ],
)
def test_parse_frame_malformed_raises_named_code(data: bytes, error: type, code: str):
    with pytest.raises(error) as caught:
        parse_frame(data)
    assert caught.value.code == code
    assert isinstance(caught.value, ProtocolError) and caught.value.http_status == 400


def test_parse_frame_hidden_size_mismatch_is_bad_shape():
    data = make_frame(_hidden(2, h=64), session=SESSION, step=0, start=0, shard=0)
    with pytest.raises(BadShapeError):
        parse_frame(data, FrameLimits(hidden_size=576))


def test_parse_frame_too_many_positions_is_too_large():
    data = make_frame(_hidden(9, h=8), session=SESSION, step=0, start=0, shard=0)
    with pytest.raises(TooLargeError) as caught:
        parse_frame(data, FrameLimits(max_tokens=8))
    assert caught.value.http_status == 413


def test_parse_frame_body_over_cap_is_too_large():
    data = make_frame(_hidden(4, h=64), session=SESSION, step=0, start=0, shard=0)
    with pytest.raises(TooLargeError):
        parse_frame(data, FrameLimits(max_body_bytes=512))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decode_frame_non_finite_values_rejected(bad: float, dtype: str):
    x = np.zeros((1, 2, 8), dtype=np.float32)
    x[0, 1, 3] = bad
    body = x.astype(DTYPES[dtype]).tobytes()
    data = _raw_frame(_header(shape=[1, 2, 8], dtype=dtype), body)
    with pytest.raises(NonFiniteError) as caught:
        decode_frame(data)
    assert caught.value.code == "non_finite"


def test_decode_frame_int8_non_finite_scale_rejected():
    body = np.array([np.nan], dtype="<f4").tobytes() + bytes(8)
    data = _raw_frame(_header(codec="int8", shape=[1, 2, 4]), body)
    with pytest.raises(NonFiniteError):
        decode_frame(data)
