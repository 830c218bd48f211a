"""(n, k) secure information dispersal (S-IDA): a message cut into n cloves, any k of which
give it back and any fewer of which reveal nothing but its padded length.

    disperse(message, n, k) → n cloves                       the sender
      1. pad the message to a length bucket (`padded_length`: 64, 256 bytes, then steps of a
         quarter of a power of two from 1 KiB to 1 MiB): cloves of messages in one bucket are the
         same size
      2. encrypt it with a fresh AES-256-GCM key K (used for this message only)
      3. cut the ciphertext into k blocks and extend them to n with a systematic Reed–Solomon
         code (Rabin's IDA; `zfec`): any k blocks give the ciphertext back
      4. share K byte-wise over GF(2^8) (Shamir, threshold k; `protocol.gf256`)
      5. clove i = header ‖ digests ‖ K_i ‖ block_i

    Collector.add(clove) → message once k consistent cloves are in    the receiver

Integrity: every clove carries the digests of all n clove bodies (K_i ‖ block_i), bound to the
message id, and the AEAD's associated data is the header shared by all cloves plus that digest
list. A relay that alters a clove's body is caught by the digest list the other cloves carry
(`CloveAltered`, naming the clove); one that alters its clove's digest list only makes its clove
disagree with the others; and a ciphertext put together from any mix that is not the sender's
fails the AEAD tag (`CloveUndecryptable`). Cloves of two messages never combine: the message id
(16 random bytes) is in every header and digest. A clove of a message already recovered is
refused (`CloveReplayed`) by the collector, which remembers a bounded window of ids.

Wire format of a clove (integers big-endian; `Clove.from_bytes` refuses any other shape):

    version u8 (1) ‖ n u8 ‖ k u8 ‖ index u8 (0..n-1) ‖ message id (16) ‖ ciphertext length u32
    ‖ n × digest (16: SHA-256, first half) ‖ key share (32) ‖ block (⌈ciphertext length ÷ k⌉)

The clove reveals n, k, its index and the padded length; nothing about the user, the path or
the plaintext. Paths, relays and what they forward are the overlay's business, not this
module's.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import zfec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from protocol import gf256
from protocol.errors import ProtocolError

VERSION: Final = 1
MAX_CLOVES: Final = 16
KEY_BYTES: Final = 32
ID_BYTES: Final = 16
DIGEST_BYTES: Final = 16  # SHA-256 cut to 128 bits: a second preimage costs 2^128
TAG_BYTES: Final = 16
MAX_MESSAGE_BYTES: Final = 1 << 20
# Padded plaintext sizes: a message's clove size says only which bucket it fell into. Control
# messages share two coarse buckets; from 1 KiB on (one token's activations are ~2.3 KB for
# SmolLM2, prefill frames more) steps of a quarter of a power of two waste at most 25 %.
BUCKETS: Final = tuple(
    [64, 256]
    + [p * q // 4 for p in (1 << e for e in range(10, 20)) for q in (4, 5, 6, 7)]
    + [MAX_MESSAGE_BYTES + 4]
)
_HEADER: Final = struct.Struct(">BBBB16sI")
_NONCE: Final = bytes(12)  # each key encrypts exactly one message, so one fixed nonce is safe


class CloveError(ProtocolError):
    """A clove or a set of cloves that cannot give a message back."""

    code = "clove_invalid"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class CloveMalformed(CloveError):
    code = "clove_malformed"


class CloveAltered(CloveError):
    """A clove whose body does not match the digest the other cloves of its message carry."""

    code = "clove_altered"


class CloveReplayed(CloveError):
    code = "clove_replayed"


class CloveUndecryptable(CloveError):
    """k cloves that agree but do not decrypt: not what the sender dispersed."""

    code = "clove_undecryptable"


def _check_shape(n: int, k: int) -> None:
    if not 2 <= k <= n <= MAX_CLOVES:
        raise CloveMalformed("clove count", f"need 2 ≤ k ≤ n ≤ {MAX_CLOVES}, got n={n} k={k}")


def padded_length(size: int) -> int:
    """The plaintext length a message of `size` bytes is padded to (a 4-byte length prefix
    included)."""
    if not 0 <= size <= MAX_MESSAGE_BYTES:
        raise CloveMalformed("message", f"{size} bytes is over {MAX_MESSAGE_BYTES}")
    return next(bucket for bucket in BUCKETS if bucket >= size + 4)


def block_bytes(ciphertext_length: int, k: int) -> int:
    return -(-ciphertext_length // k)


@dataclass(frozen=True)
class Clove:
    n: int
    k: int
    index: int
    message_id: bytes
    ciphertext_length: int
    digests: tuple[bytes, ...]
    key_share: bytes
    block: bytes

    @property
    def body(self) -> bytes:
        return self.key_share + self.block

    def intact(self) -> bool:
        """Whether the body matches this clove's own digest (of the digests it carries)."""
        return _digest(self.message_id, self.index, self.body) == self.digests[self.index]

    def header(self) -> bytes:
        """What every clove of the message shares (the AEAD's associated data with the digests)."""
        return _HEADER.pack(VERSION, self.n, self.k, 0, self.message_id, self.ciphertext_length)

    def to_bytes(self) -> bytes:
        head = _HEADER.pack(
            VERSION, self.n, self.k, self.index, self.message_id, self.ciphertext_length
        )
        return head + b"".join(self.digests) + self.key_share + self.block

    @classmethod
    def from_bytes(cls, data: bytes) -> Clove:
        if len(data) < _HEADER.size:
            raise CloveMalformed("clove", f"{len(data)} bytes is shorter than its header")
        version, n, k, index, message_id, length = _HEADER.unpack_from(data)
        if version != VERSION:
            raise CloveMalformed("clove version", f"{version} (this build reads {VERSION})")
        _check_shape(n, k)
        if index >= n:
            raise CloveMalformed("clove index", f"{index} of {n}")
        if length not in {bucket + TAG_BYTES for bucket in BUCKETS}:
            raise CloveMalformed("ciphertext length", f"{length} is no padded bucket")
        block = block_bytes(length, k)
        expected = _HEADER.size + n * DIGEST_BYTES + KEY_BYTES + block
        if len(data) != expected:
            raise CloveMalformed("clove", f"{len(data)} bytes, its header says {expected}")
        at = _HEADER.size
        digests = tuple(data[at + i * DIGEST_BYTES : at + (i + 1) * DIGEST_BYTES] for i in range(n))
        at += n * DIGEST_BYTES
        key_share, block = data[at : at + KEY_BYTES], data[at + KEY_BYTES :]
        return cls(n, k, index, message_id, length, digests, key_share, block)


def _digest(message_id: bytes, index: int, body: bytes) -> bytes:
    data = b"planet-clove/v1" + message_id + bytes([index]) + body
    return hashlib.sha256(data).digest()[:DIGEST_BYTES]


def _associated(header: bytes, digests: tuple[bytes, ...]) -> bytes:
    return header + b"".join(digests)


def disperse(message: bytes, n: int, k: int) -> list[Clove]:
    """n cloves of `message`; any k give it back."""
    _check_shape(n, k)
    size = padded_length(len(message))
    plaintext = len(message).to_bytes(4, "big") + message + bytes(size - 4 - len(message))
    key = AESGCM.generate_key(bit_length=256)
    message_id = secrets.token_bytes(ID_BYTES)
    length = size + TAG_BYTES
    header = _HEADER.pack(VERSION, n, k, 0, message_id, length)
    # The digests are over the bodies, which hold the ciphertext, so the AEAD cannot cover them
    # at encryption time; it covers the header, and the digests are checked against each other.
    ciphertext = AESGCM(key).encrypt(_NONCE, plaintext, header)
    block = block_bytes(length, k)
    ciphertext += bytes(block * k - length)
    primary = tuple(ciphertext[i * block : (i + 1) * block] for i in range(k))
    blocks = zfec.Encoder(k, n).encode(primary)
    shares = gf256.split(key, n, k)
    bodies = [shares[i] + bytes(blocks[i]) for i in range(n)]
    digests = tuple(_digest(message_id, i, bodies[i]) for i in range(n))
    return [
        Clove(n, k, i, message_id, length, digests, shares[i], bytes(blocks[i])) for i in range(n)
    ]


def recover(cloves: list[Clove]) -> bytes:
    """The message from k or more cloves of it that agree on their digests (refused by name
    otherwise)."""
    if not cloves:
        raise CloveMalformed("cloves", "none given")
    first = cloves[0]
    good: dict[int, Clove] = {}
    for clove in cloves:
        if (clove.message_id, clove.n, clove.k, clove.ciphertext_length, clove.digests) != (
            first.message_id,
            first.n,
            first.k,
            first.ciphertext_length,
            first.digests,
        ):
            raise CloveMalformed("cloves", "they belong to different messages or digest lists")
        if _digest(clove.message_id, clove.index, clove.body) != clove.digests[clove.index]:
            raise CloveAltered("clove", f"clove {clove.index}'s body does not match its digest")
        good.setdefault(clove.index, clove)
    if len(good) < first.k:
        raise CloveMalformed("cloves", f"{len(good)} distinct of the {first.k} needed")
    chosen = sorted(good.values(), key=lambda c: c.index)[: first.k]
    key = gf256.join([(c.index + 1, c.key_share) for c in chosen])
    primary = zfec.Decoder(first.k, first.n).decode(
        tuple(c.block for c in chosen), tuple(c.index for c in chosen)
    )
    ciphertext = b"".join(bytes(p) for p in primary)[: first.ciphertext_length]
    try:
        plaintext = AESGCM(key).decrypt(_NONCE, ciphertext, first.header())
    except Exception as error:  # cryptography raises InvalidTag, nothing else for bad input
        raise CloveUndecryptable("cloves", "they agree but do not decrypt") from error
    size = int.from_bytes(plaintext[:4], "big")
    if size > len(plaintext) - 4:
        raise CloveUndecryptable("cloves", "the padded message's length prefix is out of range")
    return plaintext[4 : 4 + size]


class Collector:
    """Gathers cloves as they arrive (any order, from any paths) and gives each message back
    once: when k cloves that agree on the digest list are in.

    Cloves are grouped by (message id, digest list): a clove whose digest list was altered only
    joins a group of its own. A clove whose body does not match its group's digest is refused
    (`CloveAltered`) and never stored. At most `max_pending` messages wait for cloves (the oldest
    is dropped first), and the ids of the last `remember` messages recovered are kept to refuse
    replays.
    """

    def __init__(self, max_pending: int = 256, remember: int = 4096) -> None:
        self.max_pending = max_pending
        self.remember = remember
        self._pending: OrderedDict[tuple[bytes, tuple[bytes, ...]], dict[int, Clove]] = (
            OrderedDict()
        )
        self._done: OrderedDict[bytes, None] = OrderedDict()

    def add(self, clove: Clove) -> bytes | None:
        if clove.message_id in self._done:
            raise CloveReplayed("clove", f"message {clove.message_id.hex()} was already recovered")
        if _digest(clove.message_id, clove.index, clove.body) != clove.digests[clove.index]:
            raise CloveAltered("clove", f"clove {clove.index}'s body does not match its digest")
        group_key = (clove.message_id, clove.digests)
        group = self._pending.setdefault(group_key, {})
        self._pending.move_to_end(group_key)
        if clove.index in group:
            raise CloveReplayed("clove", f"clove {clove.index} of this message arrived twice")
        group[clove.index] = clove
        while len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
        if len(group) < clove.k:
            return None
        try:
            return recover(list(group.values()))
        finally:  # recovered, or k agreeing cloves that do not decrypt: either way it is over
            for key in [key for key in self._pending if key[0] == clove.message_id]:
                del self._pending[key]
            self._done[clove.message_id] = None
            while len(self._done) > self.remember:
                self._done.popitem(last=False)
