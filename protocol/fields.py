"""Field checks for values that crossed a boundary (parsed JSON, a caller's arguments).

One home for the rules that every parser repeats; each parser names its own error. `is_int` is
the predicate (a bool is not an integer); `Fields(error)` bundles the checks that raise
`error(message)` with one message per rule, so a parser reads

    check = Fields(TxDecodeError)
    capacity = check.integer(body["capacity"], "body.capacity", 1, 1_000_000)

    integer(value, where, lo, hi)        "{where}: expected an integer in [lo, hi]"
    text(value, where, pattern, max_len) "{where}: bad value …" (a str of ≤ max_len matching)
    exact_object(value, where, keys)     "{where}: expected an object" / "expected keys …, got …"
    items(value, where, max_len)         "{where}: expected a list of 1..max_len items"
    rows(value, where, width, max_len)   a list of ≤ max_len lists of exactly `width` values

Pure: the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def is_int(value: Any, lo: int, hi: int) -> bool:
    """`value` is an integer (not a bool) with lo ≤ value ≤ hi."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


class Fields:
    """The field checks, raising `error(message)` (the caller's named error) on a mismatch."""

    def __init__(self, error: Callable[[str], Exception]) -> None:
        self.error = error

    def integer(self, value: Any, where: str, lo: int, hi: int) -> int:
        if not is_int(value, lo, hi):
            raise self.error(f"{where}: expected an integer in [{lo}, {hi}]")
        return value

    def text(self, value: Any, where: str, pattern: re.Pattern[str], max_len: int = 256) -> str:
        if not isinstance(value, str) or len(value) > max_len or not pattern.match(value):
            raise self.error(f"{where}: bad value {ascii(value)[:120]}")
        return value

    def exact_object(self, value: Any, where: str, keys: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(f"{where}: expected an object")
        if set(value) != keys:
            got = ascii(sorted(value))[:200]
            raise self.error(f"{where}: expected keys {sorted(keys)}, got {got}")
        return value

    def items(self, value: Any, where: str, max_len: int) -> list[Any]:
        """A non-empty list of at most `max_len` items."""
        if not isinstance(value, list) or not 0 < len(value) <= max_len:
            raise self.error(f"{where}: expected a list of 1..{max_len} items")
        return value

    def rows(self, value: Any, where: str, width: int, max_len: int) -> list[list[Any]]:
        """A list (maybe empty) of at most `max_len` lists of exactly `width` values each."""
        if not isinstance(value, list) or len(value) > max_len:
            raise self.error(f"{where}: expected a list of at most {max_len} items")
        for item in value:
            if not isinstance(item, list) or len(item) != width:
                raise self.error(f"{where}: expected items of {width} values")
        return value
