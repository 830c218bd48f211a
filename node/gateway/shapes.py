"""OpenAI's response objects, built from what a generation produced.

    chat.completion / chat.completion.chunk     /v1/chat/completions
    text_completion                             /v1/completions (streamed chunks too)

Logprobs: chat → `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`;
completions → `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from node.gateway.engine import TokenEvent

TokenText = Callable[[int], str]


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _entry(token_text: TokenText, token: int, logprob: float) -> dict[str, Any]:
    text = token_text(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(events: Sequence[TokenEvent], token_text: TokenText) -> dict[str, Any]:
    content = []
    for event in events:
        if event.logprob is None:
            continue
        item = _entry(token_text, event.token, event.logprob)
        item["top_logprobs"] = [_entry(token_text, t, lp) for t, lp in event.top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(
    events: Sequence[TokenEvent],
    token_text: TokenText,
    offset: int,
    echoed: Sequence[TokenEvent] = (),
) -> dict[str, Any]:
    """`echoed`: the prompt's events (echo); its first token has no logprob (OpenAI: null)."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    if echoed:
        text = token_text(echoed[0].token)
        tokens.append(text)
        values.append(None)
        tops.append(None)
        offsets.append(offset)
        offset += len(text)
    for event in [*echoed[1:], *events]:
        if event.logprob is None:
            continue
        text = token_text(event.token)
        tokens.append(text)
        values.append(event.logprob)
        top: dict[str, float] = {}
        for t, lp in event.top:
            top.setdefault(token_text(t), lp)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class Shaper:
    """Builds the objects of one response (one id, one `created` time)."""

    def __init__(self, kind: str, model: str, token_text: TokenText, want_logprobs: bool) -> None:
        self.kind = kind
        self.model = model
        self.token_text = token_text
        self.want_logprobs = want_logprobs
        self.id = new_id(kind)
        self.created = int(time.time())
        self.text_offset = 0

    def _base(self, object_name: str) -> dict[str, Any]:
        base: dict[str, Any] = {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
        }
        if self.kind == "chat":
            base["system_fingerprint"] = None
        return base

    def _logprobs(
        self, events: Sequence[TokenEvent], echoed: Sequence[TokenEvent] = ()
    ) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        if self.kind == "chat":
            return chat_logprobs(events, self.token_text)
        shaped = completion_logprobs(events, self.token_text, self.text_offset, echoed)
        self.text_offset += sum(len(t) for t in shaped["tokens"])
        return shaped

    def full(
        self,
        text: str,
        events: Sequence[TokenEvent],
        finish: str,
        use: dict[str, int],
        echoed: Sequence[TokenEvent] = (),
    ) -> dict[str, Any]:
        """`echoed` (completions with echo): the prompt's events, already part of `text`."""
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": self._logprobs(events),
                "finish_reason": finish,
            }
            body = self._base("chat.completion")
        else:
            choice = {
                "text": text,
                "index": 0,
                "logprobs": self._logprobs(events, echoed),
                "finish_reason": finish,
            }
            body = self._base("text_completion")
        body["choices"] = [choice]
        body["usage"] = use
        return body

    def chunk(
        self,
        text: str | None,
        events: Sequence[TokenEvent],
        finish: str | None,
        *,
        first: bool = False,
        include_usage: bool = False,
    ) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": self._logprobs(events) if events else None,
                "finish_reason": finish,
            }
            body = self._base("chat.completion.chunk")
        else:
            choice = {
                "text": text or "",
                "index": 0,
                "logprobs": self._logprobs(events) if events else None,
                "finish_reason": finish,
            }
            body = self._base("text_completion")
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, use: dict[str, int]) -> dict[str, Any]:
        body = self._base("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        body["choices"] = []
        body["usage"] = use
        return body
