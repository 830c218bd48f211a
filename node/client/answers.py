"""The client's boundary against nodes' HTTP answers (GET /info, error bodies): bounded reads,
strict checks, named errors. (Frames on a circuit's links go through protocol/frames/header.py.)

A node is a stranger to the client too. Everything it answers over HTTP goes through here once:
- bodies are read up to a bound (a small cap for JSON), never to whatever length the node
  chooses;
- an error body yields a short `code` of [a-z0-9_] and a message cut to a few hundred characters.

    ProtocolError (protocol.errors)
    └── BadAnswerError          a node's answer is malformed
        └── AnswerTooLargeError the answer is longer than the request allows
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp

from protocol.canonical import loads_bounded
from protocol.errors import ProtocolError

MAX_JSON_ANSWER_BYTES = 64 * 1024  # /info and error bodies
MAX_MESSAGE_CHARS = 300
_CODE_RE = re.compile(r"[a-z0-9_]{1,64}")
_READ_CHUNK = 64 * 1024


class BadAnswerError(ProtocolError):
    """A node answered something malformed."""

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


def parse_error_body(body: bytes) -> tuple[str, str]:
    """(code, message) of a node's JSON error body; ("http_error", "") if it is not one."""
    try:
        raw = loads_bounded(body)
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
        raw = loads_bounded(body)
    except (ValueError, RecursionError):
        raise BadAnswerError(peer, "answer is not JSON") from None
    if not isinstance(raw, dict):
        raise BadAnswerError(peer, "answer is not a JSON object")
    return raw
