"""The client's boundary against node answers: bounded reads, strict checks, named errors.

A node is a stranger to the client too. Everything it sends back goes through here once:
- bodies are read up to a bound derived from what was asked (a forward answer's frame shape, a
  small cap for JSON), never to whatever length the node chooses;
- an answer frame must match the request exactly (session capability, shard, positions, shape,
  dtype, codec), and the `X-Planet-Compute-Ms` header must be a finite number;
- an error body yields a short `code` of [a-z0-9_] and a message cut to a few hundred characters.

    ProtocolError (protocol.errors)
    └── BadAnswerError          a node's answer is malformed or does not match the request
        └── AnswerTooLargeError the answer is longer than the request allows
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import aiohttp

from protocol.errors import ProtocolError
from protocol.frames import (
    MAX_HEADER_BYTES,
    PREFIX_BYTES,
    Frame,
    FrameError,
    FrameHeader,
    FrameLimits,
    body_size,
    parse_frame,
)

MAX_JSON_ANSWER_BYTES = 64 * 1024  # /info and error bodies
MAX_MESSAGE_CHARS = 300
MAX_COMPUTE_MS = 1e9
_CODE_RE = re.compile(r"[a-z0-9_]{1,64}")
_READ_CHUNK = 64 * 1024


class BadAnswerError(ProtocolError):
    """A node answered something malformed, or a frame that does not match the request."""

    code = "bad_answer"

    def __init__(self, peer: str, problem: str) -> None:
        super().__init__(
            f"node {peer} answered badly: {problem}",
            hint="the node is faulty or hostile; use another node for this shard",
        )
        self.peer = peer


class AnswerTooLargeError(BadAnswerError):
    code = "answer_too_large"


async def read_bounded(answer: aiohttp.ClientResponse, limit: int, peer: str) -> bytes:
    """The whole body, or AnswerTooLargeError as soon as it would exceed `limit` bytes."""
    declared = answer.content_length
    if declared is not None and declared > limit:
        raise AnswerTooLargeError(peer, f"declares {declared} bytes, at most {limit} expected")
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await answer.content.read(_READ_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise AnswerTooLargeError(peer, f"sent more than {limit} bytes")
        parts.append(chunk)


def answer_frame_limit(request: FrameHeader) -> int:
    """Largest frame a node may answer `request` with (its prefix, header cap and body)."""
    count = 1 if request.last_only else request.count
    return (
        PREFIX_BYTES
        + MAX_HEADER_BYTES
        + body_size(request.dtype, request.codec, count * request.shape[2])
    )


def parse_answer_frame(body: bytes, request: FrameHeader, shard: int, peer: str) -> Frame:
    """Parse a forward answer and check it answers `request` (sent to the node of `shard`)."""
    hidden = request.shape[2]
    count = 1 if request.last_only and request.count > 1 else request.count
    start = request.start + request.count - count
    try:
        frame = parse_frame(
            body,
            FrameLimits(
                hidden_size=hidden,
                max_tokens=count,
                max_body_bytes=body_size(request.dtype, request.codec, count * hidden),
            ),
        )
    except FrameError as error:
        raise BadAnswerError(peer, f"{error.code}: {error.message}") from None
    h = frame.header
    expected = (request.session, shard, start, count, request.dtype, request.codec)
    got = (h.session, h.shard, h.start, h.count, h.dtype, h.codec)
    if got != expected:
        names = ("session", "shard", "start", "count", "dtype", "codec")
        wrong = [n for n, a, b in zip(names, got, expected, strict=True) if a != b]
        raise BadAnswerError(peer, f"answer frame does not match the request ({', '.join(wrong)})")
    return frame


def parse_compute_ms(value: str | None, peer: str) -> float:
    """The node's `X-Planet-Compute-Ms` header: absent = 0, else a finite number of ms."""
    if value is None or value == "":
        return 0.0
    try:
        ms = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        ms = math.nan
    if not (math.isfinite(ms) and 0.0 <= ms <= MAX_COMPUTE_MS):
        raise BadAnswerError(peer, f"malformed compute time header {value[:40]!r}")
    return ms


def parse_error_body(body: bytes) -> tuple[str, str]:
    """(code, message) of a node's JSON error body; ("http_error", "") if it is not one."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        return "http_error", ""
    if not isinstance(raw, dict):
        return "http_error", ""
    code, message = raw.get("code"), raw.get("message")
    if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
        code = "http_error"
    if not isinstance(message, str):
        message = ""
    message = "".join(c if c.isprintable() else "?" for c in message[:MAX_MESSAGE_CHARS])
    return code, message


def parse_json_object(body: bytes, peer: str) -> dict[str, Any]:
    """A JSON object answer (e.g. /info) or BadAnswerError."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):
        raise BadAnswerError(peer, "answer is not JSON") from None
    if not isinstance(raw, dict):
        raise BadAnswerError(peer, "answer is not a JSON object")
    return raw
