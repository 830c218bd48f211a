"""SSE framing and the text stream (stop sequences, partial UTF-8)."""

from __future__ import annotations

import pytest

from node.gateway.sse import DONE, event, parse_events
from node.gateway.textstream import TextStream

pytestmark = pytest.mark.unit


def test_sse_event_is_one_data_line_even_with_newlines_in_text() -> None:
    frame = event({"text": "a\nb\n\ndata: x", "é": 1})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert frame.count(b"\n") == 2  # JSON escapes the newlines inside strings
    assert parse_events(frame + DONE) == [{"text": "a\nb\n\ndata: x", "é": 1}, "[DONE]"]


def _decode(ids: list[int]) -> str:
    return "".join(TABLE[i] for i in ids)


TABLE = {0: "Hel", 1: "lo", 2: " wor", 3: "ld", 4: "\n", 5: "EN", 6: "D", 7: "\ufffd"}


def _run(tokens: list[int], stop: tuple[str, ...]) -> tuple[list[str], str, bool]:
    stream = TextStream(_decode, stop)
    deltas = []
    for token in tokens:
        deltas.append(stream.push(token))
        if stream.stopped:
            break
    deltas.append(stream.finish())
    return deltas, stream.text, stream.stopped


def test_textstream_without_stop_emits_everything() -> None:
    deltas, text, stopped = _run([0, 1, 2, 3], ())
    assert deltas == ["Hel", "lo", " wor", "ld", ""] and text == "Hello world" and not stopped


def test_textstream_stop_across_tokens_is_held_back_and_cut() -> None:
    deltas, text, stopped = _run([0, 1, 4, 5, 6, 2], ("\nEND",))
    assert text == "Hello" and stopped
    assert "".join(deltas) == "Hello"
    assert deltas[2] == ""  # "\n" could start "\nEND": held back


def test_textstream_held_back_prefix_released_at_the_end() -> None:
    deltas, text, stopped = _run([0, 1, 4], ("\nEND",))
    assert text == "Hello\n" and not stopped and deltas[-1] == "\n"


def test_textstream_partial_utf8_waits() -> None:
    stream = TextStream(lambda ids: "ab" + ("\ufffd" if ids[-1] == 7 else "c"), ())
    assert stream.push(7) == ""
    assert stream.push(1) == "abc"
