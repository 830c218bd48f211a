"""Spans: a hop that serves several consecutive shards of a model in one process.

A node registers the shards it serves as a list (`register_node` `shards`); a list of more than
one shard is a span hop only when it is contiguous (`[1, 2, 3]`): a frame for the span's first
shard runs through every shard of it in order and goes on to the hop after the span. Everything
that reads a registry entry or a flag turns it into a `ShardSpan` here, or refuses it by name:

    ShardSpan(first, last)          first ≤ last, both shard indexes (0 … MAX_SHARD)
    span_of(shards)                 a registry entry's list → ShardSpan, or NonContiguousSpanError
    parse_span_arg("1-2" | "3")     a CLI value → ShardSpan, or UsageError with a hint

For money and verification a span hop is its shards' hops (docs/compute.md, *Span hops*): its
price is the sum of its shards' prices and it commits each shard's work as that shard.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from protocol.errors import ProtocolError, UsageError

MAX_SHARD = 65535  # shard indexes are u16 on the registry (register_node)
MAX_SPAN = 256  # shards one node may register (register_node's limit)
_ARG = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")


class NonContiguousSpanError(ProtocolError):
    """A shard list that is not one run of consecutive shards (a peer's registry entry)."""

    code = "non_contiguous_span"

    def __init__(self, shards: object) -> None:
        super().__init__(f"shards {shards!r} are not one contiguous run of shard indexes")
        self.shards = shards


@dataclass(frozen=True, slots=True, order=True)
class ShardSpan:
    """Shards `first` … `last` (inclusive) served as one hop."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last <= MAX_SHARD:
            raise ValueError(f"bad span {self.first}-{self.last}")
        if self.last - self.first + 1 > MAX_SPAN:
            raise ValueError(f"span {self.first}-{self.last} is longer than {MAX_SPAN} shards")

    @classmethod
    def one(cls, shard: int) -> ShardSpan:
        return cls(shard, shard)

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(range(self.first, self.last + 1))

    def __iter__(self) -> Iterator[int]:
        return iter(self.shards)

    def __contains__(self, shard: object) -> bool:
        return isinstance(shard, int) and self.first <= shard <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def span_of(shards: object) -> ShardSpan:
    """A registry entry's `shards` as a span: a non-empty list of ints (not bools), each the one
    before plus 1; anything else is `NonContiguousSpanError`."""
    if not isinstance(shards, Sequence) or isinstance(shards, str | bytes) or not shards:
        raise NonContiguousSpanError(shards)
    if len(shards) > MAX_SPAN:
        raise NonContiguousSpanError(f"{len(shards)} shards")
    values = list(shards)
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SHARD:
            raise NonContiguousSpanError(shards)
    if values != list(range(values[0], values[0] + len(values))):
        raise NonContiguousSpanError(shards)
    return ShardSpan(values[0], values[-1])


def parse_span_arg(
    text: str, *, flag: str = "--shards", shard_count: int | None = None
) -> ShardSpan:
    """`K` or `A-B` (A ≤ B, ASCII digits) → ShardSpan; within `shard_count` when given."""
    match = _ARG.fullmatch(text.strip())
    if match is None:
        raise UsageError(
            f"{flag} {text!r} is not a shard or a range of shards",
            hint=f"write {flag} 1-2 (shards 1 to 2, one hop) or {flag} 3",
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise UsageError(
            f"{flag} {text}: the range runs backwards",
            hint=f"write the lower shard first: {flag} {last}-{first}",
        )
    if last > MAX_SHARD or last - first + 1 > MAX_SPAN:
        raise UsageError(
            f"{flag} {text}: shard indexes are 0 … {MAX_SHARD}, at most {MAX_SPAN} in a span",
            hint="name a shorter range",
        )
    if shard_count is not None and last >= shard_count:
        raise UsageError(
            f"{flag} {text}: the model has shards 0..{shard_count - 1}",
            hint=f"name shards within 0-{shard_count - 1}",
        )
    return ShardSpan(first, last)
