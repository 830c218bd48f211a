"""The rendezvous link's wire: a node that cannot accept inbound connections keeps one outbound
WebSocket to a relay, and the relay forwards the TCP connections that arrive at the node's port
on the relay over it, multiplexed (docs/overlay.md, *NAT rendezvous*).

    dialer ──TCP──► relay: the node's port ══ WebSocket /v1/rendezvous (opened by the node) ══► node
                    (TLS inside, pinned by                                         its own server
                     the dialer to the node key)                                   on loopback

Hand-shake (each a binary WebSocket message, big-endian):

    relay → node  CHALLENGE  version u8 ‖ relay X25519 key (32) ‖ nonce (32)
    node  → relay HELLO      version u8 ‖ node key (ed25519, 32) ‖ port wanted u16 (0: any) ‖
                             sealed secret (SealedBox to the relay's X25519 key: 32 + 48) ‖
                             signature (64) by the node key over
                             HELLO_CONTEXT ‖ relay key ‖ nonce ‖ port ‖ sealed secret
    relay → node  WELCOME    sealed frame 0 of the relay's direction: port u16 ‖ streams u16 ‖
                             window u32 ‖ host length u8 ‖ host (ASCII: the relay's public host)
       or         REFUSE     0xFF ‖ code u8 ‖ reason (UTF-8, ≤ 200 bytes), plaintext; the relay
                             closes

The node seals the secret to the relay key it was told (the registered one), not to the key the
challenge names: only that relay can open it, so a WELCOME that opens proves the relay; the
signature proves the node key to the relay, bound to this relay and this challenge (a HELLO is
useless to another relay and cannot be replayed). The secret keys ChaCha20-Poly1305 on every
later message, per direction, with its sequence number as the nonce: a frame altered, replayed,
dropped or reordered on the way fails (`rendezvous_frame_invalid`) and ends the link.

Frames (sealed): kind u8 ‖ stream u32 ‖ body

    OPEN   1  relay → node   a connection arrived at the node's port; body: the dialer's IP
                             address (ASCII, ≤ 45 bytes), so the node counts its sessions
                             against it as against a direct caller's
    DATA   2  both ways      1..CHUNK_BYTES bytes of that connection
    CLOSE  3  both ways      that connection is over; body empty
    CREDIT 4  both ways      u32: the receiver took that many more bytes of the stream off
                             the link (1..WINDOW_BYTES): the sender may send that much more

Each direction of each stream starts with WINDOW_BYTES of credit; a DATA past the credit is a
`rendezvous_flow` violation and ends the link, so neither side ever buffers more than
WINDOW_BYTES per stream. Stream ids are the relay's, from 1.

What the relay sees: the bytes of each connection, which are TLS 1.3 between the dialer and the
node for an https:// node (pinned to the node key: it cannot read or alter them), their sizes
and times, the dialers' addresses, and the node's address (it dialled out from there).
"""

from __future__ import annotations

import ipaddress
import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

from protocol.errors import ProtocolError

VERSION: Final = 1
HELLO_CONTEXT: Final = b"planet-rendezvous/v1 hello\x00"
KEY_BYTES: Final = 32
NONCE_BYTES: Final = 32
SEALED_BYTES: Final = KEY_BYTES + 48  # SealedBox: ephemeral key (32) and MAC (16)
SIGNATURE_BYTES: Final = 64
CHALLENGE_BYTES: Final = 1 + KEY_BYTES + NONCE_BYTES
HELLO_BYTES: Final = 1 + KEY_BYTES + 2 + SEALED_BYTES + SIGNATURE_BYTES
REFUSE_MARK: Final = 0xFF
MAX_REASON_BYTES: Final = 200
MAX_HOST_BYTES: Final = 253
MAX_ADDRESS_BYTES: Final = 45  # an IPv6 address's longest text
CHUNK_BYTES: Final = 16384  # the most one DATA frame carries
WINDOW_BYTES: Final = 262144  # credit per stream and direction: the most either side buffers
MAX_STREAMS: Final = 256  # connections at once to one fronted node
TAG_BYTES: Final = 16
_FRAME: Final = struct.Struct(">BI")
MAX_SEALED_FRAME_BYTES: Final = _FRAME.size + CHUNK_BYTES + TAG_BYTES
TO_NODE: Final = 5  # nonce directions (distinct from the overlay's 1, 2 and 3)
TO_RELAY: Final = 6


class RendezvousError(ProtocolError):
    """Root of the rendezvous link's refusals.

    RendezvousError          rendezvous_invalid
    ├── HandshakeMalformed   rendezvous_handshake_malformed  a CHALLENGE/HELLO/WELCOME of the
    │                                                         wrong shape
    ├── HelloForged          rendezvous_hello_forged    the signature or sealed secret fails
    ├── RelayNotProven       rendezvous_relay_unproven  the WELCOME does not open: not the relay
    ├── FrameInvalid         rendezvous_frame_invalid   a frame that does not open, or breaks
    │                                                   the grammar
    ├── FlowViolation        rendezvous_flow            DATA beyond the stream's credit
    └── Refused              rendezvous_refused         the relay's REFUSE (its code named)
    """

    code = "rendezvous_invalid"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class HandshakeMalformed(RendezvousError):
    code = "rendezvous_handshake_malformed"


class HelloForged(RendezvousError):
    code = "rendezvous_hello_forged"


class RelayNotProven(RendezvousError):
    code = "rendezvous_relay_unproven"


class FrameInvalid(RendezvousError):
    code = "rendezvous_frame_invalid"


class FlowViolation(RendezvousError):
    code = "rendezvous_flow"


class RefuseCode(IntEnum):
    VERSION = 1  # a HELLO of another version
    FORGED = 2  # its signature or sealed secret does not check
    FULL = 3  # the relay fronts as many nodes as it will
    PORT_TAKEN = 4  # the port asked for is another node's, or outside the relay's range
    ALREADY_FRONTED = 5  # this node key has a link up already
    TOO_MANY_FROM_ADDRESS = 6  # this address holds as many links as one address may
    NOT_REGISTERED = 7  # no staked node has this key, and no lease is left for it (per address
    # or in all: node/relay/admission.py)


class Refused(RendezvousError):
    code = "rendezvous_refused"

    def __init__(self, refusal: RefuseCode, reason: str) -> None:
        super().__init__(f"relay refused ({refusal.name.lower()})", reason)
        self.refusal = refusal


# -- the hand-shake ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Challenge:
    relay_key: bytes  # X25519, 32
    nonce: bytes  # 32 random bytes

    def to_bytes(self) -> bytes:
        return bytes([VERSION]) + self.relay_key + self.nonce

    @classmethod
    def fresh(cls, relay_key: bytes) -> Challenge:
        return cls(relay_key, os.urandom(NONCE_BYTES))

    @classmethod
    def from_bytes(cls, data: bytes) -> Challenge:
        if data[:1] == bytes([REFUSE_MARK]):
            raise refusal_from_bytes(data)
        if len(data) != CHALLENGE_BYTES:
            raise HandshakeMalformed("challenge", f"{len(data)} bytes, not {CHALLENGE_BYTES}")
        if data[0] != VERSION:
            raise HandshakeMalformed("challenge", f"version {data[0]}, not {VERSION}")
        return cls(bytes(data[1:33]), bytes(data[33:]))


@dataclass(frozen=True)
class Hello:
    node_key: bytes  # ed25519 public, 32
    port: int  # 0: any
    sealed: bytes  # the secret sealed to the relay's X25519 key
    signature: bytes

    def to_bytes(self) -> bytes:
        return (
            bytes([VERSION])
            + self.node_key
            + self.port.to_bytes(2, "big")
            + self.sealed
            + self.signature
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Hello:
        if len(data) != HELLO_BYTES:
            raise HandshakeMalformed("hello", f"{len(data)} bytes, not {HELLO_BYTES}")
        if data[0] != VERSION:
            raise HandshakeMalformed("hello", f"version {data[0]}, not {VERSION}")
        at = 1 + KEY_BYTES
        return cls(
            bytes(data[1:at]),
            int.from_bytes(data[at : at + 2], "big"),
            bytes(data[at + 2 : at + 2 + SEALED_BYTES]),
            bytes(data[at + 2 + SEALED_BYTES :]),
        )


def _signed(relay_key: bytes, nonce: bytes, port: int, sealed: bytes) -> bytes:
    return HELLO_CONTEXT + relay_key + nonce + port.to_bytes(2, "big") + sealed


def make_hello(
    node_key: SigningKey, relay_key: bytes, challenge: Challenge, port: int
) -> tuple[Hello, bytes]:
    """The node's HELLO for `challenge`, sealed to `relay_key` (the key the node pins, not the
    one the challenge names), and the link secret."""
    if not 0 <= port <= 65535:
        raise HandshakeMalformed("hello", f"port {port} is not 0..65535")
    secret = os.urandom(KEY_BYTES)
    sealed = SealedBox(PublicKey(relay_key)).encrypt(secret)
    signature = node_key.sign(_signed(relay_key, challenge.nonce, port, sealed)).signature
    return Hello(node_key.verify_key.encode(), port, sealed, signature), secret


def open_hello(private: PrivateKey, challenge: Challenge, hello: Hello) -> bytes:
    """The link secret of a HELLO answering `challenge`, sent to the relay holding `private`;
    HelloForged when its signature or its sealed secret does not check."""
    relay_key = bytes(private.public_key)
    try:
        VerifyKey(hello.node_key).verify(
            _signed(relay_key, challenge.nonce, hello.port, hello.sealed), hello.signature
        )
    except (BadSignatureError, ValueError):
        raise HelloForged(
            "hello", "its signature is not the node key's over this challenge"
        ) from None
    try:
        secret = SealedBox(private).decrypt(hello.sealed)
    except CryptoError:
        raise HelloForged("hello", "its secret is not sealed to this relay's key") from None
    if len(secret) != KEY_BYTES:
        raise HelloForged("hello", f"a secret of {len(secret)} bytes")
    return secret


@dataclass(frozen=True)
class Welcome:
    port: int  # the node's port on the relay
    streams: int  # connections the relay forwards at once
    window: int  # credit per stream and direction
    host: str  # the relay's public host (where dialers reach `port`)

    def to_plain(self) -> bytes:
        host = self.host.encode("ascii")
        return struct.pack(">HHIB", self.port, self.streams, self.window, len(host)) + host

    @classmethod
    def from_plain(cls, data: bytes) -> Welcome:
        if len(data) < 9:
            raise HandshakeMalformed("welcome", f"{len(data)} bytes is shorter than its header")
        port, streams, window, size = struct.unpack_from(">HHIB", data)
        host = data[9:]
        if len(host) != size or not 0 < size <= MAX_HOST_BYTES:
            raise HandshakeMalformed("welcome", "its host length does not match")
        if port == 0 or not 0 < streams <= MAX_STREAMS or not 0 < window <= WINDOW_BYTES:
            raise HandshakeMalformed("welcome", f"port {port}, {streams} streams, window {window}")
        try:
            text = host.decode("ascii")
        except UnicodeDecodeError:
            raise HandshakeMalformed("welcome", "its host is not ASCII") from None
        if not text.isprintable() or any(c in text for c in " /?#@"):
            raise HandshakeMalformed("welcome", f"host {text!r} is not a host")
        return cls(port, streams, window, text)


def refusal_bytes(code: RefuseCode, reason: str) -> bytes:
    return bytes([REFUSE_MARK, code]) + reason.encode()[:MAX_REASON_BYTES]


def refusal_from_bytes(data: bytes) -> RendezvousError:
    """The named error a REFUSE message carries (HandshakeMalformed if it is not one)."""
    if len(data) < 2 or data[0] != REFUSE_MARK or len(data) > 2 + MAX_REASON_BYTES:
        return HandshakeMalformed("refuse", f"{len(data)} bytes")
    try:
        code = RefuseCode(data[1])
    except ValueError:
        return HandshakeMalformed("refuse", f"code {data[1]}")
    return Refused(code, bytes(data[2:]).decode("utf-8", "replace"))


# -- sealed frames ----------------------------------------------------------------------------


class FrameKind(IntEnum):
    OPEN = 1
    DATA = 2
    CLOSE = 3
    CREDIT = 4


@dataclass(frozen=True)
class Frame:
    kind: FrameKind
    stream: int
    body: bytes = b""

    def to_bytes(self) -> bytes:
        return _FRAME.pack(self.kind, self.stream) + self.body

    @classmethod
    def from_bytes(cls, data: bytes) -> Frame:
        if len(data) < _FRAME.size:
            raise FrameInvalid("frame", f"{len(data)} bytes is shorter than its header")
        kind, stream = _FRAME.unpack_from(data)
        try:
            kind = FrameKind(kind)
        except ValueError:
            raise FrameInvalid("frame kind", str(kind)) from None
        if stream == 0:
            raise FrameInvalid("frame", "stream 0")
        body = bytes(data[_FRAME.size :])
        if kind is FrameKind.CLOSE and body:
            raise FrameInvalid("close", "carries a body")
        if kind is FrameKind.OPEN:
            _address(body)
        if kind is FrameKind.DATA and not 0 < len(body) <= CHUNK_BYTES:
            raise FrameInvalid("data", f"{len(body)} bytes is outside 1..{CHUNK_BYTES}")
        if kind is FrameKind.CREDIT:
            if len(body) != 4:
                raise FrameInvalid("credit", f"{len(body)} bytes, not 4")
            if not 0 < int.from_bytes(body, "big") <= WINDOW_BYTES:
                raise FrameInvalid("credit", f"{int.from_bytes(body, 'big')} is outside the window")
        return cls(kind, stream, body)

    @classmethod
    def open(cls, stream: int, dialer: str) -> Frame:
        return cls(FrameKind.OPEN, stream, dialer.encode("ascii"))

    @property
    def dialer(self) -> str:
        """An OPEN's dialer address (checked at parse)."""
        return self.body.decode("ascii")

    @classmethod
    def credit(cls, stream: int, size: int) -> Frame:
        return cls(FrameKind.CREDIT, stream, size.to_bytes(4, "big"))

    @property
    def granted(self) -> int:
        return int.from_bytes(self.body, "big")


def _address(body: bytes) -> str:
    if not 0 < len(body) <= MAX_ADDRESS_BYTES:
        raise FrameInvalid("open", f"a dialer address of {len(body)} bytes")
    try:
        text = body.decode("ascii")
        address = ipaddress.ip_address(text)
    except (UnicodeDecodeError, ValueError):
        raise FrameInvalid("open", "its dialer is not an IP address") from None
    if str(address) != text:
        raise FrameInvalid("open", f"dialer {text!r} is not in its canonical form")
    return text


class Sealer:
    """One direction of a link's frames: ChaCha20-Poly1305 under the link secret, the frame's
    sequence number (from 0) in the nonce."""

    def __init__(self, secret: bytes, direction: int) -> None:
        self._aead = ChaCha20Poly1305(secret)
        self._direction = direction
        self.sequence = 0

    def _nonce(self) -> bytes:
        return bytes([self._direction, 0, 0, 0]) + self.sequence.to_bytes(8, "big")

    def seal(self, plain: bytes) -> bytes:
        sealed = self._aead.encrypt(self._nonce(), plain, None)
        self.sequence += 1
        return sealed

    def open(self, data: bytes) -> bytes:
        if not TAG_BYTES <= len(data) <= MAX_SEALED_FRAME_BYTES + 512:
            raise FrameInvalid("sealed frame", f"{len(data)} bytes")
        try:
            plain = self._aead.decrypt(self._nonce(), data, None)
        except InvalidTag:
            raise FrameInvalid(
                "sealed frame", f"does not open at sequence {self.sequence}"
            ) from None
        self.sequence += 1
        return plain


class Window:
    """The credit of one stream and direction: `spend` what is sent (the receiver refuses a DATA
    past it: `take`), `grant` what the other side took off the link."""

    def __init__(self, size: int = WINDOW_BYTES) -> None:
        self.size = size
        self.left = size

    def take(self, count: int) -> None:
        if count > self.left:
            raise FlowViolation("data", f"{count} bytes with {self.left} bytes of credit left")
        self.left -= count

    def grant(self, count: int) -> None:
        if self.left + count > self.size:
            raise FlowViolation("credit", f"{count} bytes would exceed the window")
        self.left += count
