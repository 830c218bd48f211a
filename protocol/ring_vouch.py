"""Ring vouches: the last hop's word, on the client's own link to it, for the rows it produced in
a ring session (docs/overlay.md, *The ring*; docs/privacy.md).

The first node relays the last hop's output rows to the client inside ring tokens
(protocol/ring_tokens.py), each with the token it chose from it. A first node that fabricates a
row AND the token that row gives passes the client's own head check; so the last hop of a ring
session opened `back` with `vouch: true` (protocol/stream.py) also sends the client, for every
output it sends back up, the digest of that output's last row (`row_digest`: the first
DIGEST_BYTES bytes of SHA-256 over the row's body, exactly as the first node puts it in its ring
tokens, `last_row_body`). The client checks each ring token's row against the digest for its
position before it accepts the token.

Layout (big-endian), kind 0x03 beside frames (0x01) and ring tokens (0x02):

    offset  size  field
    0       1     kind     0x03
    1       1     version  1
    2       4     sid      the session on the client's link to the last hop
    6       2     count    vouches in this message (1 … MAX_VOUCHES)
    8       12·n  per vouch: position (u32, ≤ 2^31 − 1), digest (DIGEST_BYTES)

`parse_ring_vouch` checks every field (positions strictly increasing within a message) or
raises a named FrameError (bad_header, bad_body, too_large, bad_positions); whether the
positions lie within the session's range is the client's check (it knows the range:
node/client/ring_vouch.py).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.errors import (
    BadBodyError,
    BadHeaderError,
    BadPositionsError,
    FrameError,
    TooLargeError,
)
from protocol.frames.header import FRAME_VERSION, MAX_POSITION

RING_VOUCH_KIND: Final = 0x03
MAX_VOUCHES: Final = 256  # vouches in one message (as many as ring tokens carry)
DIGEST_BYTES: Final = 8
_HEADER = struct.Struct(">BBIH")
_ITEM = struct.Struct(f">I{DIGEST_BYTES}s")
MAX_VOUCH_BYTES: Final = _HEADER.size + MAX_VOUCHES * _ITEM.size


class VouchError(FrameError):
    """The last hop of a ring sent a vouch its session refuses: outside the positions the loop
    may compute, not after the ones it vouched before, for a sid no ring asked to vouch, or on
    another hop's link."""

    code = "bad_vouch"
    http_status = 502


@dataclass(frozen=True, slots=True)
class RingVouch:
    """A parsed vouch message: `digests[i]` is the last hop's digest of its row at
    `positions[i]` (strictly increasing)."""

    sid: int
    positions: tuple[int, ...]
    digests: tuple[bytes, ...]


def row_digest(row: bytes | bytearray | memoryview) -> bytes:
    """The digest of one row's encoded body (the module docstring)."""
    return hashlib.sha256(row).digest()[:DIGEST_BYTES]


def last_row_body(dtype: str, codec: str, count: int, hidden_size: int, body: bytes) -> bytes:
    """The body of an output's last row as a ring tokens message carries it: the output's own
    body for one row, else that row decoded and encoded again on its own (what the first node
    does, node/server/ring.py; the last hop digests the same bytes)."""
    if count == 1:
        return bytes(body)
    rows = decode_values(dtype, codec, (1, count, hidden_size), body)
    return bytes(encode_body(rows[:, -1:, :], dtype, codec))


def is_ring_vouch(message: bytes | bytearray | memoryview) -> bool:
    return len(message) >= 1 and message[0] == RING_VOUCH_KIND


def pack_ring_vouch(sid: int, items: Sequence[tuple[int, bytes]]) -> bytes:
    """One message of (position, digest) pairs, positions strictly increasing."""
    if not 1 <= len(items) <= MAX_VOUCHES:
        raise ValueError(f"a ring vouch message carries 1..{MAX_VOUCHES} vouches")
    parts = [_HEADER.pack(RING_VOUCH_KIND, FRAME_VERSION, sid, len(items))]
    parts.extend(_ITEM.pack(position, digest) for position, digest in items)
    return b"".join(parts)


def parse_ring_vouch(message: bytes | bytearray | memoryview) -> RingVouch:
    """A ring vouch message, every field checked, or a named FrameError."""
    view = memoryview(message)
    if len(view) > MAX_VOUCH_BYTES:
        raise TooLargeError(f"a ring vouch of {len(view)} bytes (at most {MAX_VOUCH_BYTES})")
    if len(view) < _HEADER.size:
        raise BadHeaderError(f"a ring vouch of {len(view)} bytes is shorter than its header")
    kind, version, sid, count = _HEADER.unpack_from(view)
    if kind != RING_VOUCH_KIND or version != FRAME_VERSION:
        raise BadHeaderError(f"not a ring vouch: kind {kind}, version {version}")
    if not 1 <= count <= MAX_VOUCHES:
        raise TooLargeError(f"a ring vouch carries 1..{MAX_VOUCHES} vouches, not {count}")
    if len(view) != _HEADER.size + count * _ITEM.size:
        raise BadBodyError(f"a ring vouch of {count} vouches is {len(view)} bytes")
    positions, digests = [], []
    for index in range(count):
        position, digest = _ITEM.unpack_from(view, _HEADER.size + index * _ITEM.size)
        if position > MAX_POSITION or (positions and position <= positions[-1]):
            raise BadPositionsError("ring vouch positions must increase, each ≤ 2^31 − 1")
        positions.append(position)
        digests.append(bytes(digest))
    return RingVouch(sid, tuple(positions), tuple(digests))


__all__ = [
    "DIGEST_BYTES",
    "MAX_VOUCHES",
    "MAX_VOUCH_BYTES",
    "RING_VOUCH_KIND",
    "RingVouch",
    "VouchError",
    "is_ring_vouch",
    "last_row_body",
    "pack_ring_vouch",
    "parse_ring_vouch",
    "row_digest",
]
