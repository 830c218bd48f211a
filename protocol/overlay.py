"""The overlay's wire: cells between the user's client, relays and the destination node, the
onion that sets a path up, the per-hop layers on what travels it, and the link messages that
ride it as S-IDA cloves (`protocol.sida`).

A path is client → relay 1 → … → relay l → node. Each relay knows only its predecessor and its
successor; the node sees the last relay of each path, never the client.

    cell = kind u8 ‖ path id u64 ‖ body                     one WebSocket binary message
      SETUP   1   body = onion (SETUP_BYTES)                forward only
      CREATED 2   body = empty                              backward: the path reaches the node
      DATA    3   body = payload                            both ways
      DESTROY 4   body = empty                              either way: the path is gone
      PAY     5   body = a layered pay note (PAY_BYTES max)  forward only: credits for one
                                                            relay of the path (protocol.relay_pay)

Path ids are per link (chosen at random by the sender of the SETUP on that link), so two links
of one path share no id.

Onion (set-up). The client draws a 32-byte hop key k_i per relay and builds, for relays 1..l:

    box_i   = SealedBox(relay i's X25519 key, k_i ‖ next kind u8 ‖ next URL length u8 ‖
                        next URL padded to 255 ‖ next node key (32, zeros: none))
                                                                        BOX_BYTES each
    onion   = box_1 ‖ S_1(box_2 ‖ S_2(box_3 ‖ … S_{l-1}(box_l ‖ pad)))   SETUP_BYTES in all

S_i is ChaCha20 under k_i with the set-up nonce. Relay i opens the first BOX_BYTES, decrypts the
rest with S_i, appends BOX_BYTES of random bytes and sends that on: every relay sees an onion
of the same length, and relay i + 2 sees no byte relay i saw. Next kind: 1 a relay, 2 the
destination node (the relay is the path's exit).

Layers (data). DATA forward: the client sends E_1(E_2(…E_l(clove))); relay i removes E_i.
DATA backward: the exit adds E_l to what the node sent, relay i adds E_i, the client removes
E_1 … E_l. E_i is ChaCha20-Poly1305 under k_i with nonce direction u8 ‖ 3 zero bytes ‖ the
cell's sequence number on that path and direction (u64, from 0): a replayed, dropped or
reordered cell fails its tag at the first honest relay.

Link messages. What the client and the node exchange over a set of n paths is a sequence of
messages, each dispersed into n cloves (one per path) and recovered from any k:

    message = link id (16) ‖ sequence u64 ‖ kind u8 ‖ body
      kind 1 TEXT (a control message of the stream), 2 BINARY (a frame), 3 CLOSE (body empty),
           4 ACK (node to client only: the cloves of this link the node received per clove
             index, `protocol.relay_pay.Acks`; what the client pays each path's relays for),
           5 INFO_ASK (client to node, body empty: the node's GET /info, asked over the link),
           6 INFO (node to client: that /info, a JSON object of at most MAX_INFO_BYTES;
             `parse_info` reads it)

The receiver delivers messages in sequence order (they can be recovered out of order when
paths differ in latency). Integers are big-endian; every parser here is strict.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

from protocol.errors import ProtocolError

MAX_HOPS: Final = 5
KEY_BYTES: Final = 32
URL_BYTES: Final = 255
NODE_KEY_BYTES: Final = 32  # the next hop's ed25519 node key (its TLS pin), zeros for none
_BOX_PLAIN: Final = KEY_BYTES + 1 + 1 + URL_BYTES + NODE_KEY_BYTES
BOX_BYTES: Final = _BOX_PLAIN + 48  # a sealed box adds its ephemeral key (32) and a MAC (16)
SETUP_BYTES: Final = MAX_HOPS * BOX_BYTES
TAG_BYTES: Final = 16
MAX_PAYLOAD_BYTES: Final = (1 << 20) + 4096  # the largest clove plus every layer's tag
PAY_BYTES: Final = 4096  # a pay note for the last relay of a path with every layer's marker
_CELL: Final = struct.Struct(">BQ")
_MESSAGE: Final = struct.Struct(">16sQB")
_SETUP_NONCE: Final = b"planet-overlay/1"  # ChaCha20's 16-byte nonce (counter ‖ nonce)
MAX_INFO_BYTES: Final = 64 * 1024  # an INFO answer (as a direct /info answer is read)
FORWARD: Final = 1
BACKWARD: Final = 2


class OverlayError(ProtocolError):
    """A cell, onion, layer or link message that breaks the overlay's rules."""

    code = "overlay_invalid"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class CellMalformed(OverlayError):
    code = "cell_malformed"


class OnionInvalid(OverlayError):
    code = "onion_invalid"


class LayerInvalid(OverlayError):
    """A DATA payload whose layer does not open under the path's key at its sequence number:
    altered, replayed, dropped before it or reordered."""

    code = "layer_invalid"


class InfoInvalid(OverlayError):
    """An INFO answer that is not a JSON object of at most MAX_INFO_BYTES."""

    code = "overlay_info_invalid"


class CellKind(IntEnum):
    SETUP = 1
    CREATED = 2
    DATA = 3
    DESTROY = 4
    PAY = 5


class NextKind(IntEnum):
    RELAY = 1
    NODE = 2


@dataclass(frozen=True)
class Cell:
    kind: CellKind
    path: int
    body: bytes = b""

    def to_bytes(self) -> bytes:
        return _CELL.pack(self.kind, self.path) + self.body

    @classmethod
    def from_bytes(cls, data: bytes) -> Cell:
        if len(data) < _CELL.size:
            raise CellMalformed("cell", f"{len(data)} bytes is shorter than its header")
        kind, path = _CELL.unpack_from(data)
        try:
            kind = CellKind(kind)
        except ValueError:
            raise CellMalformed("cell kind", str(kind)) from None
        body = data[_CELL.size :]
        if kind is CellKind.SETUP and len(body) != SETUP_BYTES:
            raise CellMalformed("setup", f"{len(body)} bytes, not {SETUP_BYTES}")
        if kind in (CellKind.CREATED, CellKind.DESTROY) and body:
            raise CellMalformed(kind.name.lower(), "carries a body")
        if kind is CellKind.DATA and not TAG_BYTES <= len(body) <= MAX_PAYLOAD_BYTES:
            raise CellMalformed("data", f"{len(body)} bytes is outside [{TAG_BYTES}, max]")
        if kind is CellKind.PAY and not TAG_BYTES < len(body) <= PAY_BYTES:
            raise CellMalformed("pay", f"{len(body)} bytes is outside ({TAG_BYTES}, {PAY_BYTES}]")
        return cls(kind, path, bytes(body))


def new_path_id() -> int:
    return int.from_bytes(os.urandom(8), "big")


# -- the onion --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hop:
    """One relay of a path as the client knows it: where to reach it and its X25519 key."""

    url: str
    key: bytes  # X25519 public key, 32 bytes


@dataclass(frozen=True)
class Layer:
    """What a relay learns from its box: its hop key and where the path goes next."""

    key: bytes
    next_kind: NextKind
    next_url: str
    next_key: str | None = None  # the node's key (hex) an https:// next hop must prove


def _stream(key: bytes, data: bytes) -> bytes:
    cipher = Cipher(algorithms.ChaCha20(key, _SETUP_NONCE), mode=None).encryptor()
    return cipher.update(data)


def _box(hop: Hop, layer: Layer) -> bytes:
    url = layer.next_url.encode()
    if len(url) > URL_BYTES:
        raise OnionInvalid("next url", f"{len(url)} bytes is over {URL_BYTES}")
    pin = bytes.fromhex(layer.next_key) if layer.next_key else bytes(NODE_KEY_BYTES)
    if len(pin) != NODE_KEY_BYTES:
        raise OnionInvalid("next key", f"{len(pin)} bytes, not {NODE_KEY_BYTES}")
    padded = url.ljust(URL_BYTES, b"\0")
    plain = layer.key + bytes([layer.next_kind, len(url)]) + padded + pin
    sealed = SealedBox(PublicKey(hop.key)).encrypt(plain)
    assert len(sealed) == BOX_BYTES
    return sealed


def build_onion(
    relays: list[Hop], node_url: str, node_key: str | None = None
) -> tuple[bytes, list[bytes]]:
    """The SETUP body for a path through `relays` to the node at `node_url` (pinned to
    `node_key`, hex, when it is https://), and the hop keys (relay order) the client keeps for
    the path's layers."""
    if not 1 <= len(relays) <= MAX_HOPS:
        raise OnionInvalid("path", f"{len(relays)} relays, allowed 1..{MAX_HOPS}")
    keys = [os.urandom(KEY_BYTES) for _ in relays]
    nexts = [Layer(keys[i], NextKind.RELAY, relays[i + 1].url) for i in range(len(relays) - 1)]
    nexts.append(Layer(keys[-1], NextKind.NODE, node_url, node_key))
    # From the exit inwards: O_l = box_l ‖ random, O_i = box_i ‖ S_i(O_{i+1} cut by BOX_BYTES).
    # Relay i turns its rest back into O_{i+1}'s first part and appends BOX_BYTES of junk; junk
    # moves one box forward per relay, so with at most MAX_HOPS relays it never reaches a box.
    onion = _box(relays[-1], nexts[-1]) + os.urandom(SETUP_BYTES - BOX_BYTES)
    for i in reversed(range(len(relays) - 1)):
        onion = _box(relays[i], nexts[i]) + _stream(keys[i], onion[: SETUP_BYTES - BOX_BYTES])
    return onion, keys


def peel_onion(private: PrivateKey, onion: bytes) -> tuple[Layer, bytes]:
    """A relay's layer of the onion and the onion it sends on (same length; meaningless when
    the relay is the exit)."""
    if len(onion) != SETUP_BYTES:
        raise OnionInvalid("onion", f"{len(onion)} bytes, not {SETUP_BYTES}")
    try:
        plain = SealedBox(private).decrypt(onion[:BOX_BYTES])
    except CryptoError:
        raise OnionInvalid("onion", "its first box is not sealed to this relay's key") from None
    key, kind, size = plain[:KEY_BYTES], plain[KEY_BYTES], plain[KEY_BYTES + 1]
    url_field = plain[KEY_BYTES + 2 : KEY_BYTES + 2 + URL_BYTES]
    pin = plain[KEY_BYTES + 2 + URL_BYTES :]
    try:
        next_kind = NextKind(kind)
    except ValueError:
        raise OnionInvalid("next kind", str(kind)) from None
    if size == 0 or url_field[size:].strip(b"\0"):
        raise OnionInvalid("next url", "empty, or not zero padded")
    try:
        url = url_field[:size].decode("ascii")
    except UnicodeDecodeError:
        raise OnionInvalid("next url", "not ASCII") from None
    layer = Layer(key, next_kind, url, pin.hex() if any(pin) else None)
    if next_kind is NextKind.NODE:
        return layer, b""
    return layer, _stream(key, onion[BOX_BYTES:]) + os.urandom(BOX_BYTES)


# -- layers on data ---------------------------------------------------------------------------


def _nonce(direction: int, sequence: int) -> bytes:
    return bytes([direction, 0, 0, 0]) + sequence.to_bytes(8, "big")


def seal_layer(key: bytes, direction: int, sequence: int, payload: bytes) -> bytes:
    return ChaCha20Poly1305(key).encrypt(_nonce(direction, sequence), payload, None)


def open_layer(key: bytes, direction: int, sequence: int, payload: bytes) -> bytes:
    try:
        return ChaCha20Poly1305(key).decrypt(_nonce(direction, sequence), payload, None)
    except InvalidTag:
        raise LayerInvalid("data", f"does not open at sequence {sequence}") from None


def wrap_forward(keys: list[bytes], sequence: int, clove: bytes) -> bytes:
    """The client's DATA payload: E_1(E_2(…E_l(clove)))."""
    payload = clove
    for key in reversed(keys):
        payload = seal_layer(key, FORWARD, sequence, payload)
    return payload


def unwrap_backward(keys: list[bytes], sequence: int, payload: bytes) -> bytes:
    """What the node sent, from the payload the client got: remove E_1, then E_2, …"""
    for key in keys:
        payload = open_layer(key, BACKWARD, sequence, payload)
    return payload


# -- link messages ----------------------------------------------------------------------------


class MessageKind(IntEnum):
    TEXT = 1
    BINARY = 2
    CLOSE = 3
    ACK = 4
    INFO_ASK = 5
    INFO = 6


@dataclass(frozen=True)
class LinkMessage:
    link: bytes  # 16 random bytes, chosen by the client
    sequence: int  # per link and direction, from 0
    kind: MessageKind
    body: bytes = b""

    def to_bytes(self) -> bytes:
        return _MESSAGE.pack(self.link, self.sequence, self.kind) + self.body

    @classmethod
    def from_bytes(cls, data: bytes) -> LinkMessage:
        if len(data) < _MESSAGE.size:
            raise CellMalformed("link message", f"{len(data)} bytes is shorter than its header")
        link, sequence, kind = _MESSAGE.unpack_from(data)
        try:
            kind = MessageKind(kind)
        except ValueError:
            raise CellMalformed("link message kind", str(kind)) from None
        body = bytes(data[_MESSAGE.size :])
        if kind in (MessageKind.CLOSE, MessageKind.INFO_ASK) and body:
            raise CellMalformed(kind.name.lower(), "carries a body")
        if kind is MessageKind.INFO:
            parse_info(body)
        if kind is MessageKind.TEXT:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                raise CellMalformed("text message", "not UTF-8") from None
        return cls(link, sequence, kind, body)


def parse_info(body: bytes) -> dict[str, Any]:
    """An INFO message's body as the JSON object it must be, or InfoInvalid."""
    if len(body) > MAX_INFO_BYTES:
        raise InfoInvalid("info", f"{len(body)} bytes is more than {MAX_INFO_BYTES}")
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InfoInvalid("info", "not UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise InfoInvalid("info", f"a JSON {type(value).__name__}, not an object")
    return value


class InOrder:
    """One direction of a link: its messages handed on in sequence order, each once (they can
    be recovered out of order when paths differ in latency). `add` returns the messages now in
    order (a duplicate or stale one gives none), or None once more than `limit` wait behind a
    gap that does not fill: the link is then over."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.expected = 0  # the next sequence number to hand on
        self.early: dict[int, LinkMessage] = {}

    def add(self, message: LinkMessage) -> list[LinkMessage] | None:
        if message.sequence < self.expected or message.sequence in self.early:
            return []
        self.early[message.sequence] = message
        if len(self.early) > self.limit:
            self.early.clear()
            return None
        ready = []
        while self.expected in self.early:
            ready.append(self.early.pop(self.expected))
            self.expected += 1
        return ready
