"""Ring tokens: the first node's binary message to the client in a ring session
(docs/overlay.md, *The ring*; the session's spec: protocol/ring.py).

`pack_ring_tokens` / `parse_ring_tokens`: the frame header's layout (protocol/frames/header.py)
with kind 0x02, `start` the position of the first token's hidden row and `count` the tokens,
then per token its id (u32), the length of its hidden row's body (u32) and that body (one row,
in the header's dtype and codec, as the last hop encoded it). The client recomputes each token
from its row (protocol/ring.py `RingMismatchError` at the first that differs).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from protocol.frames.codecs import CODECS, DTYPES, check_body_size
from protocol.frames.errors import BadBodyError, BadHeaderError, TooLargeError
from protocol.frames.header import FRAME_VERSION, MAX_POSITION, FrameHeader
from protocol.ring import MAX_TOKEN_ID

RING_TOKENS_KIND: Final = 0x02
MAX_BATCH: Final = 256  # tokens in one ring tokens message
_HEADER = struct.Struct(">BBIIIBBB")
_ITEM = struct.Struct(">II")
_DTYPE_NAMES: Final = tuple(DTYPES)


@dataclass(frozen=True, slots=True)
class RingTokens:
    """A parsed ring tokens message: `tokens[i]` was chosen from the hidden row at position
    `start + i`, whose body (one row, `dtype`/`codec`) is `rows[i]`."""

    sid: int
    start: int
    dtype: str
    codec: str
    tokens: tuple[int, ...]
    rows: tuple[bytes, ...]


def is_ring_tokens(message: bytes | bytearray | memoryview) -> bool:
    return len(message) >= 1 and message[0] == RING_TOKENS_KIND


def pack_ring_tokens(
    sid: int, start: int, dtype: str, codec: str, items: Sequence[tuple[int, bytes]]
) -> bytes:
    """One message of (token, its hidden row's body) pairs from position `start` on."""
    if not 1 <= len(items) <= MAX_BATCH:
        raise ValueError(f"a ring tokens message carries 1..{MAX_BATCH} tokens")
    header = _HEADER.pack(
        RING_TOKENS_KIND,
        FRAME_VERSION,
        sid,
        start,
        len(items),
        _DTYPE_NAMES.index(dtype),
        CODECS.index(codec),
        0,
    )
    parts = [header]
    for token, body in items:
        parts.append(_ITEM.pack(token, len(body)))
        parts.append(bytes(body))
    return b"".join(parts)


def parse_ring_tokens(message: bytes | bytearray | memoryview, hidden_size: int) -> RingTokens:
    """A ring tokens message, every field and every row's size checked, or a named FrameError
    (bad_header, bad_body, too_large)."""
    view = memoryview(message)
    if len(view) < _HEADER.size:
        raise BadHeaderError(f"ring tokens of {len(view)} bytes are shorter than their header")
    kind, version, sid, start, count, dtype, codec, flags = _HEADER.unpack_from(view)
    if kind != RING_TOKENS_KIND or version != FRAME_VERSION or flags:
        raise BadHeaderError(f"not ring tokens: kind {kind}, version {version}, flags {flags}")
    if dtype >= len(_DTYPE_NAMES) or codec >= len(CODECS):
        raise BadHeaderError(f"ring tokens: dtype {dtype} or codec {codec} unknown")
    if not 1 <= count <= MAX_BATCH:
        raise TooLargeError(f"ring tokens carry 1..{MAX_BATCH} tokens, not {count}")
    if start + count > MAX_POSITION:
        raise BadHeaderError("ring tokens: positions beyond 2^31 - 1")
    header = FrameHeader(sid, start, count, _DTYPE_NAMES[dtype], CODECS[codec], True)
    at = _HEADER.size
    tokens, rows = [], []
    for _ in range(count):
        if len(view) < at + _ITEM.size:
            raise BadBodyError("ring tokens end inside a token's entry")
        token, size = _ITEM.unpack_from(view, at)
        at += _ITEM.size
        if token > MAX_TOKEN_ID or len(view) < at + size:
            raise BadBodyError("ring tokens: a token id out of range or a row cut short")
        check_body_size(header.dtype, header.codec, 1, hidden_size, size)
        tokens.append(token)
        rows.append(bytes(view[at : at + size]))
        at += size
    if at != len(view):
        raise BadBodyError(f"ring tokens: {len(view) - at} bytes after the last token")
    return RingTokens(sid, start, header.dtype, header.codec, tuple(tokens), tuple(rows))


__all__ = [
    "MAX_BATCH",
    "RING_TOKENS_KIND",
    "RingTokens",
    "is_ring_tokens",
    "pack_ring_tokens",
    "parse_ring_tokens",
]
