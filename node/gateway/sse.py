"""Server-sent events as OpenAI streams them: `data: <json>\\n\\n` per chunk, `data: [DONE]`."""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying `payload` as compact JSON (one line: JSON escapes newlines)."""
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


def parse_events(body: bytes) -> list[Any]:
    """The payloads of a whole SSE body (tests and the CLI); `[DONE]` becomes the string."""
    out: list[Any] = []
    for block in body.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        data = [line[len("data: ") :] for line in block.split("\n") if line.startswith("data: ")]
        text = "\n".join(data)
        out.append(text if text == "[DONE]" else json.loads(text))
    return out
