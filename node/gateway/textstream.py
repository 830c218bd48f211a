"""Token ids → text deltas for streaming, with stop sequences.

A delta is only emitted once it is stable: text ending in U+FFFD (a partial UTF-8 sequence) and
any suffix that could still become a stop sequence are held back. When a stop sequence appears,
the text ends right before it and nothing after it is ever emitted. Emitted text is always a
prefix of the final text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self.tokens: list[int] = []
        self.emitted = ""
        self.stopped = False  # a stop sequence was found

    def _find_stop(self, text: str) -> int:
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else -1

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop sequence."""
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _emit(self, upto: str) -> str:
        if not upto.startswith(self.emitted):
            return ""  # the decoder revised earlier text; wait until it is consistent again
        delta = upto[len(self.emitted) :]
        self.emitted = upto
        return delta

    def push(self, token: int) -> str:
        """Add one token; the newly stable text (possibly empty)."""
        if self.stopped:
            return ""
        self.tokens.append(token)
        text = self._decode(self.tokens)
        cut = self._find_stop(text)
        if cut >= 0:
            self.stopped = True
            return self._emit(text[:cut])
        if text.endswith(REPLACEMENT):
            return ""
        return self._emit(text[: len(text) - self._held_back(text)])

    def finish(self) -> str:
        """The rest of the text at the end of generation (held-back parts included)."""
        if self.stopped:
            return ""
        text = self._decode(self.tokens)
        cut = self._find_stop(text)
        if cut >= 0:
            self.stopped = True
            text = text[:cut]
        return self._emit(text)

    @property
    def text(self) -> str:
        return self.emitted
