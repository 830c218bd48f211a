"""Tickets (protocol/tickets.py): round trip, sealing to one verifier, the node's signature
bound to the request, and a named error for every malformed byte."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey

from protocol.fingerprint import encode_block
from protocol.spotcheck import Triple
from protocol.tickets import (
    HEADER_SIZE,
    MAX_TICKET_BYTES,
    TicketError,
    TicketFieldError,
    TicketFingerprintError,
    TicketMagicError,
    TicketNonFiniteError,
    TicketRequest,
    TicketRequestError,
    TicketSealError,
    TicketTooLargeError,
    TicketTrailingBytesError,
    TicketTruncatedError,
    decode_request,
    decode_ticket,
    encode_ticket,
    open_sealed,
    seal,
)

NODE = SigningKey(b"\x01" * 32)
VERIFIER = SigningKey(b"\x02" * 32)
OTHER = SigningKey(b"\x03" * 32)
HIDDEN = 8


def _fp(positions: int) -> bytes:
    return encode_block([[(1, 0x3C00), (2, 0x4000), (3, 0x4200), (4, 0x4400)]] * positions)


def _ticket(block: int = 1, count: int = 40) -> tuple[bytes, np.ndarray]:
    inputs = np.random.default_rng(0).standard_normal((1, count, HIDDEN)).astype("f4")
    return encode_ticket(block, b"\x07" * 32, _fp(count - 32 * block), inputs), inputs


def _request(node: SigningKey = NODE, verifier: SigningKey = VERIFIER) -> TicketRequest:
    triple = Triple(node.verify_key.encode().hex(), "0x" + "aa" * 32, 1, 2)
    return TicketRequest(triple, "0x" + "bb" * 32, verifier.verify_key.encode().hex()).signed(
        verifier
    )


def test_ticket_round_trip_keeps_every_field() -> None:
    data, inputs = _ticket()
    ticket = decode_ticket(data)
    assert (ticket.block, ticket.count, ticket.hidden, ticket.start) == (1, 40, HIDDEN, 32)
    assert ticket.salt == b"\x07" * 32 and ticket.fingerprint == _fp(8)
    assert np.array_equal(ticket.inputs, inputs)
    assert encode_ticket(1, ticket.salt, ticket.fingerprint, ticket.inputs) == data


@settings(max_examples=60, deadline=None)
@given(block=st.integers(0, 4), extra=st.integers(1, 32), hidden=st.integers(1, 16))
def test_ticket_round_trip_any_shape(block: int, extra: int, hidden: int) -> None:
    count = 32 * block + extra
    inputs = np.arange(count * hidden, dtype="f4").reshape(1, count, hidden)
    data = encode_ticket(block, b"\x00" * 32, _fp(extra), inputs)
    ticket = decode_ticket(data)
    assert np.array_equal(ticket.inputs, inputs) and ticket.block == block


def test_ticket_carries_no_session_or_request_identity() -> None:
    data, _ = _ticket()
    for needle in (
        bytes.fromhex("aa" * 32),
        bytes.fromhex("bb" * 32),
        VERIFIER.verify_key.encode(),
    ):
        assert needle not in data


def test_seal_opens_only_for_the_requested_verifier_and_checks_the_node() -> None:
    data, inputs = _ticket()
    request = _request()
    sealed = seal(data, request, NODE)
    assert np.array_equal(open_sealed(sealed, request, VERIFIER).inputs, inputs)
    with pytest.raises(TicketSealError):  # another verifier's key
        open_sealed(sealed, request, OTHER)
    tampered = bytearray(sealed)
    tampered[60] ^= 1
    with pytest.raises(TicketSealError):
        open_sealed(bytes(tampered), request, VERIFIER)
    # a stranger can seal bytes to the verifier, but cannot sign as the node
    forged = SealedBox(VERIFIER.verify_key.to_curve25519_public_key()).encrypt(
        OTHER.sign(data).signature + data
    )
    with pytest.raises(TicketSealError, match="not signed by the node"):
        open_sealed(forged, request, VERIFIER)
    # the node's signature is bound to the request: not reusable for another triple
    other_request = TicketRequest(
        Triple(request.triple.node, request.triple.session, 2, 2), request.seed, request.verifier
    ).signed(VERIFIER)
    with pytest.raises(TicketSealError):
        open_sealed(sealed, other_request, VERIFIER)
    with pytest.raises(TicketRequestError):  # a node sealing for a request naming another node
        seal(data, request, OTHER)


@pytest.mark.parametrize("size", [0, 10, 48, 112])
def test_open_short_sealed_named_error(size: int) -> None:
    with pytest.raises(TicketSealError):
        open_sealed(b"\x00" * size, _request(), VERIFIER)


def _header(**changes: int | bytes) -> bytes:
    fields = {"magic": b"PTK\x01", "dtype": 1, "hidden": HIDDEN, "block": 1, "count": 40}
    fields |= {"salt": b"\x07" * 32, "fplen": 2 + 8 * 8}
    fields |= changes
    return struct.pack(">4sBHII32sH", *fields.values())


def _body(count: int = 40, hidden: int = HIDDEN, checked: int = 8) -> bytes:
    return _fp(checked) + np.zeros(count * hidden, dtype="<f4").tobytes()


HOSTILE: list[tuple[str, bytes, type[TicketError]]] = [
    ("empty", b"", TicketMagicError),
    ("other magic", b"PLAF" + _header()[4:] + _body(), TicketMagicError),
    ("version 2", b"PTK\x02" + _header()[4:] + _body(), TicketMagicError),
    ("header cut", _header()[:20], TicketTruncatedError),
    ("dtype 2", _header(dtype=2) + _body(), TicketFieldError),
    ("hidden 0", _header(hidden=0) + _body(), TicketFieldError),
    ("hidden too big", _header(hidden=20_000) + _body(), TicketFieldError),
    ("count 0", _header(count=0, block=0) + _body(), TicketFieldError),
    ("count before block", _header(count=32) + _body(), TicketFieldError),
    ("count after block", _header(count=65) + _body(), TicketFieldError),
    ("count over max", _header(count=9000, block=281) + _body(), TicketFieldError),
    ("block huge", _header(block=2**32 - 1) + _body(), TicketFieldError),
    ("fplen wrong", _header(fplen=64) + _body(), TicketFingerprintError),
    ("inputs cut", _header() + _body()[:-1], TicketTruncatedError),
    ("trailing byte", _header() + _body() + b"\x00", TicketTrailingBytesError),
    (
        "fingerprint version",
        _header() + b"\x09" + _body()[1:],
        TicketFingerprintError,
    ),
    (
        "fingerprint positions",
        _header() + bytes([1, 7]) + _body()[2:],
        TicketFingerprintError,
    ),
    (
        "coefficient out of field",
        _header() + _fp(8)[:2] + b"\xff\xff" + _body()[4:],
        TicketFingerprintError,
    ),
    (
        "NaN input",
        _header() + _fp(8) + np.full(40 * HIDDEN, np.nan, dtype="<f4").tobytes(),
        TicketNonFiniteError,
    ),
    (
        "inf input",
        _header() + _fp(8) + np.full(40 * HIDDEN, np.inf, dtype="<f4").tobytes(),
        TicketNonFiniteError,
    ),
]


@pytest.mark.parametrize(("case", "data", "error"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_decode_ticket_hostile_named_error(case: str, data: bytes, error: type) -> None:
    with pytest.raises(error):
        decode_ticket(data)


def test_decode_ticket_too_large_before_parsing() -> None:
    with pytest.raises(TicketTooLargeError):
        decode_ticket(b"PTK\x01" + b"\x00" * MAX_TICKET_BYTES)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=HEADER_SIZE + 400))
def test_decode_ticket_random_bytes_only_named_errors(data: bytes) -> None:
    with contextlib.suppress(TicketError):
        decode_ticket(b"PTK\x01" + data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20), st.integers(0, 255))
def test_decode_ticket_one_flipped_byte_in_header_named_error_or_valid(
    index: int, value: int
) -> None:
    data = bytearray(_ticket()[0])
    data[index] = value
    with contextlib.suppress(TicketError):
        decode_ticket(bytes(data))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block": 1, "count": 32},  # block not covered
        {"block": -1, "count": 5},
        {"block": 0, "count": 0},
    ],
)
def test_encode_ticket_refuses_bad_shapes(kwargs: dict) -> None:
    inputs = np.zeros((1, kwargs["count"], HIDDEN), dtype="f4")
    with pytest.raises(TicketError):
        encode_ticket(kwargs["block"], b"\x00" * 32, _fp(1), inputs)


def test_encode_ticket_refuses_nonfinite_and_mismatched_fingerprint() -> None:
    inputs = np.zeros((1, 40, HIDDEN), dtype="f4")
    with pytest.raises(TicketFingerprintError):
        encode_ticket(1, b"\x00" * 32, _fp(7), inputs)
    inputs[0, 3, 1] = np.nan
    with pytest.raises(TicketNonFiniteError):
        encode_ticket(1, b"\x00" * 32, _fp(8), inputs)


def test_request_round_trip_and_signature() -> None:
    request = _request()
    parsed = decode_request(request.encode())
    assert parsed == request
    parsed.verify()
    forged = TicketRequest(
        request.triple, request.seed, request.verifier, OTHER.sign(b"x").signature.hex()
    )
    with pytest.raises(TicketRequestError):
        forged.verify()
    with pytest.raises(TicketRequestError):
        TicketRequest(request.triple, request.seed, request.verifier).signed(OTHER)


def _raw(**changes: object) -> bytes:
    import json

    body = json.loads(_request().encode())
    body.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del body[key]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b"{" * 50,
        _raw(block="1"),
        _raw(block=1.0),
        _raw(block=2**64),
        _raw(shard=-1),
        _raw(node="AB" * 32),
        _raw(session="aa" * 32),
        _raw(seed="bb" * 32),
        _raw(verifier=1),
        _raw(sig="00"),
        _raw(extra=1),
        _raw(sig=None),
        _request().encode().replace(b'"block":1', b'"block":01'),
        _request().encode().replace(b",", b", "),
        b'{"block":1,"block":1}',
        b"\xff" * 10,
        b"{" + b" " * 3000 + b"}",
    ],
)
def test_decode_request_hostile_named_error(raw: bytes) -> None:
    with pytest.raises(TicketRequestError):
        decode_request(raw)


def test_seal_refuses_a_verifier_key_that_is_not_a_point() -> None:
    request = _request()
    bad = TicketRequest(request.triple, request.seed, "00" * 32, request.sig)
    with pytest.raises(TicketError):
        seal(_ticket()[0], bad, NODE)


def test_sealed_box_is_not_openable_by_a_plain_x25519_stranger() -> None:
    sealed = seal(_ticket()[0], _request(), NODE)
    with pytest.raises(Exception):  # noqa: B017 - libsodium's own error, any stranger key
        SealedBox(PrivateKey.generate()).decrypt(sealed)
