"""The ring: a circuit's own decode loop, run by its first node (docs/overlay.md, *The ring*).

Two things travel that a client-driven circuit does not have:

**The ring spec**, the `ring` field of the first hop's `open` (protocol/stream.py), a JSON
object parsed here (`parse_ring_spec`) or refused `bad_control` by name:

    {"prompt": N, "max_new": M, "stop": [id, ...], "temperature": t, "top_p": p, "seed": s}

    prompt       positions the client sends as prefill frames (1 … 2^31 − 1): the first token
                 is sampled from the output at position N − 1
    max_new      tokens the loop chooses at most (1 … MAX_RING_TOKENS); it computes at most
                 N + M − 1 positions (the last token is never fed)
    stop         token ids after which the loop stops (at most MAX_STOP_IDS, each < 2^31)
    temperature  0 (greedy) … 10; top_p (0, 1]; seed null or 0 … 2^63 − 1: the sampler of
                 protocol/sampling.py, one Generator seeded with `seed`, one draw per token

**Ring tokens**, the first node's binary message to the client (`pack_ring_tokens`,
`parse_ring_tokens`): the frame header's layout (protocol/frames/header.py) with kind 0x02,
`start` the position of the first token's hidden row and `count` the tokens, then per token
its id (u32), the length of its hidden row's body (u32) and that body (one row, in the
header's dtype and codec, as the last hop encoded it). The client recomputes each token from
its row (`RingMismatchError` at the first that differs).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol.frames.codecs import CODECS, DTYPES, check_body_size
from protocol.frames.errors import BadBodyError, BadHeaderError, FrameError, TooLargeError
from protocol.frames.header import FRAME_VERSION, MAX_POSITION, FrameHeader
from protocol.sampling import SamplingConfig

RING_TOKENS_KIND: Final = 0x02
MAX_RING_TOKENS: Final = 8192  # tokens one ring session chooses at most
MAX_STOP_IDS: Final = 64
MAX_TOKEN_ID: Final = 2**31 - 1
MAX_SEED: Final = 2**63 - 1
MAX_BATCH: Final = 256  # tokens in one ring tokens message
_HEADER = struct.Struct(">BBIIIBBB")
_ITEM = struct.Struct(">II")
_FIELDS: Final = frozenset({"prompt", "max_new", "stop", "temperature", "top_p", "seed"})
_DTYPE_NAMES: Final = tuple(DTYPES)


class RingSpecError(FrameError):
    """An open's `ring` field is out of its grammar (the module docstring)."""

    code = "bad_control"


class RingUnavailableError(FrameError):
    """This node runs no ring: it has no client head (`client.safetensors` beside its
    manifest), or the open asked the ring of a hop that is not the circuit's first."""

    code = "ring_unavailable"
    http_status = 409


class RingMismatchError(FrameError):
    """A ring token is not what the client's own head and sampler choose from the hidden row
    that came with it: the first node lied (or computed another head); the session is stopped
    and nothing more is paid."""

    code = "ring_token_mismatch"
    http_status = 502


@dataclass(frozen=True, slots=True)
class RingSpec:
    prompt: int
    max_new: int
    stop: frozenset[int] = frozenset()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.seed)

    @property
    def last_position(self) -> int:
        """The last position the loop may compute (its last token is never fed)."""
        return self.prompt + self.max_new - 2

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            "max_new": self.max_new,
            "stop": sorted(self.stop),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }


def _int(raw: dict[str, Any], name: str, low: int, high: int) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RingSpecError(f"ring.{name} must be an integer in {low}..{high}")
    return value


def _number(raw: dict[str, Any], name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RingSpecError(f"ring.{name} must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise RingSpecError(f"ring.{name} must be finite")
    return value


def parse_ring_spec(raw: Any) -> RingSpec:
    """An open's `ring` value as a RingSpec, or RingSpecError naming the field."""
    if not isinstance(raw, dict) or set(raw) != _FIELDS:
        raise RingSpecError(f"ring must be an object with exactly the fields {sorted(_FIELDS)}")
    stop = raw["stop"]
    if not isinstance(stop, list) or len(stop) > MAX_STOP_IDS:
        raise RingSpecError(f"ring.stop must be a list of at most {MAX_STOP_IDS} token ids")
    for item in stop:
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= MAX_TOKEN_ID:
            raise RingSpecError(f"ring.stop entries must be integers in 0..{MAX_TOKEN_ID}")
    seed = raw["seed"]
    if seed is not None:
        seed = _int(raw, "seed", 0, MAX_SEED)
    temperature, top_p = _number(raw, "temperature"), _number(raw, "top_p")
    if not 0.0 <= temperature <= 10.0:
        raise RingSpecError("ring.temperature must be in [0, 10]")
    if not 0.0 < top_p <= 1.0:
        raise RingSpecError("ring.top_p must be in (0, 1]")
    return RingSpec(
        prompt=_int(raw, "prompt", 1, MAX_POSITION),
        max_new=_int(raw, "max_new", 1, MAX_RING_TOKENS),
        stop=frozenset(stop),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


# ------------------------------------------------------------------------------ ring tokens
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
    "MAX_RING_TOKENS",
    "MAX_STOP_IDS",
    "RING_TOKENS_KIND",
    "RingMismatchError",
    "RingSpec",
    "RingSpecError",
    "RingTokens",
    "RingUnavailableError",
    "is_ring_tokens",
    "pack_ring_tokens",
    "parse_ring_spec",
    "parse_ring_tokens",
]
