"""A frame: one binary WebSocket message carrying activations on a link of a circuit.

17-byte big-endian header, then the body (protocol/frames/codecs.py):

    offset  size  field
    0       1     kind  0x01
    1       1     version 1
    2       4     sid     the session on this link (the sending side chose it)
    6       4     start   first absolute position of the rows
    10      4     count   rows (positions) in the body
    14      1     dtype   index into codecs.DTYPES ("float32", "float16")
    15      1     codec   index into codecs.CODECS ("raw", "int8", "hq9", "ohq7", "rq")
    16      1     flags   bit 0: last_only (the last hop answers only the last row)
                          bit 1: rewind (start may lie below the session's length: every hop
                                 first drops its cached positions >= start; speculation)

`parse_frame` is the one parser of frame headers, for nodes and clients alike: it checks every
field and the body's size against count x hidden size before anything is decoded, and rejects
with a named FrameError (protocol/frames/errors.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from protocol.frames.codecs import CODECS, DTYPES, check_body_size
from protocol.frames.errors import (
    BadCodecError,
    BadDtypeError,
    BadHeaderError,
    BadPositionsError,
    TooLargeError,
)

FRAME_KIND: Final = 0x01
FRAME_VERSION: Final = 1
_HEADER = struct.Struct(">BBIIIBBB")
FRAME_HEADER_BYTES: Final = _HEADER.size  # 17
FLAG_LAST_ONLY: Final = 0x01
FLAG_REWIND: Final = 0x02
_FLAGS: Final = FLAG_LAST_ONLY | FLAG_REWIND
MAX_POSITION: Final = 2**31 - 1
_DTYPE_NAMES: Final = tuple(DTYPES)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    sid: int
    start: int
    count: int
    dtype: str
    codec: str
    last_only: bool = False
    rewind: bool = False

    def pack(self) -> bytes:
        return _HEADER.pack(
            FRAME_KIND,
            FRAME_VERSION,
            self.sid,
            self.start,
            self.count,
            _DTYPE_NAMES.index(self.dtype),
            CODECS.index(self.codec),
            (FLAG_LAST_ONLY if self.last_only else 0) | (FLAG_REWIND if self.rewind else 0),
        )


def pack_frame(header: FrameHeader, body: bytes | memoryview) -> bytes:
    return b"".join((header.pack(), body))


def parse_frame(
    message: bytes | bytearray | memoryview, hidden_size: int, max_tokens: int
) -> tuple[FrameHeader, memoryview]:
    """A frame's header and body (body size checked, values not yet decoded)."""
    view = memoryview(message)
    if len(view) < FRAME_HEADER_BYTES:
        raise BadHeaderError(f"frame of {len(view)} bytes is shorter than its header")
    kind, version, sid, start, count, dtype, codec, flags = _HEADER.unpack_from(view)
    if kind != FRAME_KIND or version != FRAME_VERSION:
        raise BadHeaderError(f"unknown frame kind {kind} / version {version}")
    if dtype >= len(_DTYPE_NAMES):
        raise BadDtypeError(f"dtype index {dtype} unknown; accepted: {list(_DTYPE_NAMES)}")
    if codec >= len(CODECS):
        raise BadCodecError(f"codec index {codec} unknown; accepted: {list(CODECS)}")
    if flags & ~_FLAGS:
        raise BadHeaderError(f"unknown flags {flags:#04x}")
    if count < 1:
        raise BadPositionsError("count must be >= 1")
    if count > max_tokens:
        raise TooLargeError(f"{count} positions exceed the limit of {max_tokens}")
    if start + count > MAX_POSITION:
        raise BadPositionsError("positions beyond 2^31 - 1")
    header = FrameHeader(
        sid=sid,
        start=start,
        count=count,
        dtype=_DTYPE_NAMES[dtype],
        codec=CODECS[codec],
        last_only=bool(flags & FLAG_LAST_ONLY),
        rewind=bool(flags & FLAG_REWIND),
    )
    body = view[FRAME_HEADER_BYTES:]
    check_body_size(header.dtype, header.codec, count, hidden_size, len(body))
    return header, body


def frame_sid(data: bytes) -> int | None:
    """The sid field of a frame's raw bytes, unchecked (None when too short): for routing a
    frame before `parse_frame` checks it."""
    if len(data) < FRAME_HEADER_BYTES:
        return None
    return int.from_bytes(data[2:6], "big")
