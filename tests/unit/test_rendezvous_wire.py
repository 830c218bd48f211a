"""The rendezvous link's wire (protocol/rendezvous.py): the hand-shake proves the node key to the
relay and the relay's X25519 key to the node; sealed frames refuse alteration, replay and
reordering; every parser refuses hostile bytes by name."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from protocol.errors import ProtocolError
from protocol.rendezvous import (
    CHUNK_BYTES,
    HELLO_BYTES,
    TO_NODE,
    TO_RELAY,
    WINDOW_BYTES,
    Challenge,
    FlowViolation,
    Frame,
    FrameInvalid,
    FrameKind,
    HandshakeMalformed,
    Hello,
    HelloForged,
    RefuseCode,
    Refused,
    Sealer,
    Welcome,
    Window,
    make_hello,
    open_hello,
    refusal_bytes,
    refusal_from_bytes,
)

pytestmark = pytest.mark.unit


def _pair() -> tuple[PrivateKey, SigningKey, Challenge]:
    relay = PrivateKey.generate()
    return relay, SigningKey.generate(), Challenge.fresh(bytes(relay.public_key))


def test_hello_opens_for_its_relay_and_challenge() -> None:
    relay, node, challenge = _pair()
    hello, secret = make_hello(node, bytes(relay.public_key), challenge, 44001)
    parsed = Hello.from_bytes(hello.to_bytes())
    assert parsed == hello and len(hello.to_bytes()) == HELLO_BYTES
    assert open_hello(relay, challenge, parsed) == secret
    assert parsed.node_key == node.verify_key.encode() and parsed.port == 44001


def test_hello_for_another_challenge_is_forged() -> None:
    relay, node, challenge = _pair()
    hello, _ = make_hello(node, bytes(relay.public_key), challenge, 0)
    with pytest.raises(HelloForged) as refused:
        open_hello(relay, Challenge.fresh(bytes(relay.public_key)), hello)  # a replay
    assert refused.value.code == "rendezvous_hello_forged"


def test_hello_sealed_to_another_relay_is_refused_by_that_relay() -> None:
    """The node seals to the key it pins: an impostor answering the challenge with its own key
    gets a HELLO it cannot open (nor check: it is signed over the pinned key)."""
    relay, node, _ = _pair()
    impostor = PrivateKey.generate()
    challenge = Challenge.fresh(bytes(impostor.public_key))  # the impostor's own key
    hello, _ = make_hello(node, bytes(relay.public_key), challenge, 0)
    with pytest.raises(HelloForged):
        open_hello(impostor, challenge, hello)


def test_hello_with_a_swapped_node_key_or_port_is_forged() -> None:
    relay, node, challenge = _pair()
    hello, _ = make_hello(node, bytes(relay.public_key), challenge, 44001)
    other = SigningKey.generate().verify_key.encode()
    for forged in (
        Hello(other, hello.port, hello.sealed, hello.signature),
        Hello(hello.node_key, 44002, hello.sealed, hello.signature),
        Hello(hello.node_key, hello.port, os.urandom(len(hello.sealed)), hello.signature),
    ):
        with pytest.raises(HelloForged):
            open_hello(relay, challenge, forged)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x01" * (HELLO_BYTES - 1), b"\x01" * (HELLO_BYTES + 1), b"\x02" * HELLO_BYTES],
)
def test_hello_of_the_wrong_shape_is_malformed(data: bytes) -> None:
    with pytest.raises(HandshakeMalformed):
        Hello.from_bytes(data)


def test_challenge_refusal_and_wrong_shapes() -> None:
    key = os.urandom(32)
    assert Challenge.from_bytes(Challenge(key, b"n" * 32).to_bytes()) == Challenge(key, b"n" * 32)
    for bad in (b"", b"\x01" * 64, b"\x02" + b"\x00" * 64):
        with pytest.raises(HandshakeMalformed):
            Challenge.from_bytes(bad)
    with pytest.raises(Refused) as refused:
        Challenge.from_bytes(refusal_bytes(RefuseCode.FULL, "full"))
    assert refused.value.refusal is RefuseCode.FULL
    assert isinstance(refusal_from_bytes(b"\xff\x63oops"), HandshakeMalformed)
    assert isinstance(refusal_from_bytes(b"\xff\x03" + b"x" * 300), HandshakeMalformed)


def test_welcome_round_trip_and_refusals() -> None:
    welcome = Welcome(44001, 256, WINDOW_BYTES, "203.0.113.7")
    assert Welcome.from_plain(welcome.to_plain()) == welcome
    plain = welcome.to_plain()
    for bad in (
        plain[:8],
        plain + b"x",  # host longer than its length
        Welcome(0, 256, WINDOW_BYTES, "h").to_plain(),
        Welcome(1, 0, WINDOW_BYTES, "h").to_plain(),
        Welcome(1, 1, WINDOW_BYTES + 1, "h").to_plain(),
        Welcome(1, 1, 1, "a/b").to_plain(),
        Welcome(1, 1, 1, "a b").to_plain(),
    ):
        with pytest.raises(HandshakeMalformed):
            Welcome.from_plain(bad)


def test_sealed_frames_refuse_alteration_replay_and_reordering() -> None:
    secret = os.urandom(32)
    sender, receiver = Sealer(secret, TO_RELAY), Sealer(secret, TO_RELAY)
    first = sender.seal(Frame(FrameKind.DATA, 1, b"hello").to_bytes())
    second = sender.seal(Frame(FrameKind.CLOSE, 1).to_bytes())
    with pytest.raises(FrameInvalid):  # reordered: the second does not open at sequence 0
        Sealer(secret, TO_RELAY).open(second)
    altered = bytearray(first)
    altered[3] ^= 1
    with pytest.raises(FrameInvalid):
        Sealer(secret, TO_RELAY).open(bytes(altered))
    with pytest.raises(FrameInvalid):  # the other direction's key stream
        Sealer(secret, TO_NODE).open(first)
    assert Frame.from_bytes(receiver.open(first)) == Frame(FrameKind.DATA, 1, b"hello")
    with pytest.raises(FrameInvalid):  # replayed
        receiver.open(first)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"\x02\x00\x00", "frame"),
        (b"\x09\x00\x00\x00\x01", "frame kind"),
        (b"\x02\x00\x00\x00\x00x", "frame"),  # stream 0
        (b"\x01\x00\x00\x00\x01x", "open"),
        (b"\x01\x00\x00\x00\x01", "open"),  # no dialer
        (b"\x01\x00\x00\x00\x01127.000.0.1", "open"),  # not canonical
        (b"\x01\x00\x00\x00\x01" + b"1" * 46, "open"),
        (b"\x03\x00\x00\x00\x01x", "close"),
        (b"\x02\x00\x00\x00\x01", "data"),
        (b"\x02\x00\x00\x00\x01" + b"x" * (CHUNK_BYTES + 1), "data"),
        (b"\x04\x00\x00\x00\x01\x00\x00", "credit"),
        (b"\x04\x00\x00\x00\x01\x00\x00\x00\x00", "credit"),
        (b"\x04\x00\x00\x00\x01" + (WINDOW_BYTES + 1).to_bytes(4, "big"), "credit"),
    ],
)
def test_frames_break_the_grammar_by_name(data: bytes, what: str) -> None:
    with pytest.raises(FrameInvalid) as refused:
        Frame.from_bytes(data)
    assert refused.value.what == what and refused.value.code == "rendezvous_frame_invalid"


def test_open_carries_the_dialers_address() -> None:
    for dialer in ("203.0.113.7", "2001:db8::1"):
        frame = Frame.from_bytes(Frame.open(7, dialer).to_bytes())
        assert frame.kind is FrameKind.OPEN and frame.dialer == dialer


def test_window_refuses_data_past_its_credit_and_credit_past_its_size() -> None:
    window = Window(100)
    window.take(60)
    with pytest.raises(FlowViolation):
        window.take(41)
    window.grant(60)
    with pytest.raises(FlowViolation):
        window.grant(1)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_are_refused_by_name(data: bytes) -> None:
    for parse in (Frame.from_bytes, Hello.from_bytes, Challenge.from_bytes, Welcome.from_plain):
        try:
            parse(data)
        except ProtocolError as error:
            assert error.code.startswith("rendezvous_")
