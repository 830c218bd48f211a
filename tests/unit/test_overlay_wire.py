"""The overlay's wire (protocol.overlay): onions each relay opens one box of, layers that
refuse what was altered, replayed or reordered, and strict cells and link messages."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.public import PrivateKey

from protocol import overlay
from protocol.overlay import (
    BACKWARD,
    FORWARD,
    SETUP_BYTES,
    Cell,
    CellKind,
    CellMalformed,
    Hop,
    LayerInvalid,
    LinkMessage,
    MessageKind,
    NextKind,
    OnionInvalid,
)

pytestmark = pytest.mark.unit


def relays(count: int) -> tuple[list[PrivateKey], list[Hop]]:
    keys = [PrivateKey.generate() for _ in range(count)]
    return keys, [
        Hop(f"http://203.0.113.{i}:9100", bytes(k.public_key)) for i, k in enumerate(keys)
    ]


@pytest.mark.parametrize("length", range(1, overlay.MAX_HOPS + 1))
def test_each_relay_opens_its_box_and_learns_one_step(length: int) -> None:
    private, hops = relays(length)
    onion, keys = overlay.build_onion(hops, "https://198.51.100.7:443")
    seen = []
    for i in range(length):
        assert len(onion) == SETUP_BYTES  # every relay sees the same length: no position leak
        seen.append(onion)
        layer, onion = overlay.peel_onion(private[i], onion)
        assert layer.key == keys[i]
        if i < length - 1:
            assert (layer.next_kind, layer.next_url) == (NextKind.RELAY, hops[i + 1].url)
        else:
            assert (layer.next_kind, layer.next_url) == (NextKind.NODE, "https://198.51.100.7:443")
    # relay i + 2 sees no run of 32 bytes relay i saw: colluding non-neighbours cannot match
    for i in range(len(seen) - 2):
        windows = {seen[i][j : j + 32] for j in range(0, SETUP_BYTES - 32)}
        later = seen[i + 2]
        assert not any(later[j : j + 32] in windows for j in range(0, SETUP_BYTES - 32, 7))


def test_an_onion_opens_only_for_its_relay() -> None:
    private, hops = relays(2)
    onion, _ = overlay.build_onion(hops, "http://198.51.100.7:1")
    with pytest.raises(OnionInvalid, match="not sealed to this relay"):
        overlay.peel_onion(private[1], onion)
    with pytest.raises(OnionInvalid, match="bytes"):
        overlay.peel_onion(private[0], onion[:-1])
    flipped = bytes([onion[0] ^ 1]) + onion[1:]
    with pytest.raises(OnionInvalid):
        overlay.peel_onion(private[0], flipped)


def test_paths_are_bounded_and_urls_fit() -> None:
    _, hops = relays(overlay.MAX_HOPS + 1)
    with pytest.raises(OnionInvalid, match="relays"):
        overlay.build_onion(hops, "http://198.51.100.7:1")
    with pytest.raises(OnionInvalid, match="relays"):
        overlay.build_onion([], "http://198.51.100.7:1")
    with pytest.raises(OnionInvalid, match="over 255"):
        overlay.build_onion(hops[:1], "http://" + "a" * 300)


def test_layers_round_trip_and_refuse_what_was_changed() -> None:
    keys = [os.urandom(32) for _ in range(3)]
    clove = b"a clove's bytes"
    payload = overlay.wrap_forward(keys, 0, clove)
    for key in keys:  # each relay removes its layer, in path order
        payload = overlay.open_layer(key, FORWARD, 0, payload)
    assert payload == clove
    back = clove
    for key in reversed(keys):  # the exit adds first, the first relay last
        back = overlay.seal_layer(key, BACKWARD, 5, back)
    assert overlay.unwrap_backward(keys, 5, back) == clove
    wrapped = overlay.wrap_forward(keys, 1, clove)
    with pytest.raises(LayerInvalid):  # replayed at another sequence number
        overlay.open_layer(keys[0], FORWARD, 2, wrapped)
    with pytest.raises(LayerInvalid):  # altered
        overlay.open_layer(keys[0], FORWARD, 1, bytes([wrapped[0] ^ 1]) + wrapped[1:])
    with pytest.raises(LayerInvalid):  # a forward cell sent back as if backward
        overlay.open_layer(keys[0], BACKWARD, 1, wrapped)


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"\x01", "shorter"),
        (b"\x07" + bytes(8), "kind"),
        (b"\x01" + bytes(8) + bytes(10), "setup"),
        (b"\x02" + bytes(8) + b"x", "carries a body"),
        (b"\x04" + bytes(8) + b"x", "carries a body"),
        (b"\x03" + bytes(8) + bytes(3), "outside"),
    ],
)
def test_malformed_cells_are_refused_by_name(raw: bytes, what: str) -> None:
    with pytest.raises(CellMalformed, match=what):
        Cell.from_bytes(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_are_a_cell_or_refused(data: bytes) -> None:
    try:
        cell = Cell.from_bytes(data)
    except CellMalformed:
        return
    assert cell.to_bytes() == data


def test_link_messages_are_strict() -> None:
    message = LinkMessage(os.urandom(16), 7, MessageKind.TEXT, b'{"op":"open"}')
    assert LinkMessage.from_bytes(message.to_bytes()) == message
    with pytest.raises(CellMalformed, match="UTF-8"):
        LinkMessage.from_bytes(LinkMessage(b"x" * 16, 0, MessageKind.TEXT, b"\xff").to_bytes())
    with pytest.raises(CellMalformed, match="body"):
        LinkMessage.from_bytes(LinkMessage(b"x" * 16, 0, MessageKind.CLOSE, b"x").to_bytes())
    with pytest.raises(CellMalformed, match="kind"):
        LinkMessage.from_bytes(b"x" * 16 + bytes(8) + b"\x09")
    with pytest.raises(CellMalformed, match="shorter"):
        LinkMessage.from_bytes(b"short")
    assert Cell(CellKind.DESTROY, 3).to_bytes() == b"\x04" + (3).to_bytes(8, "big")


def test_link_messages_are_handed_on_in_order_once() -> None:
    order = overlay.InOrder(limit=3)
    message = [LinkMessage(b"l" * 16, i, MessageKind.BINARY, bytes([i])) for i in range(6)]
    assert order.add(message[1]) == [] and order.add(message[2]) == []  # waiting on 0
    assert order.add(message[0]) == message[:3]
    assert order.add(message[1]) == [] and order.add(message[0]) == []  # stale: dropped
    assert order.add(message[3]) == [message[3]]
    gap = overlay.InOrder(limit=2)
    assert gap.add(message[2]) == [] and gap.add(message[3]) == []
    assert gap.add(message[4]) is None  # three behind a gap that does not fill: over
