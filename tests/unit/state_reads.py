"""Counting what the committee app reads from its store, for tests of what a rule costs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from abci_app.state import State


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the records `State` reads (lookups and range-scan rows) from now on, while
    `monkeypatch` (or its `context()`) holds: reads[0]."""
    reads = [0]
    committed, items = State.committed, State.committed_items

    def counted(state: State, ns: str, key: str) -> Any:
        reads[0] += 1
        return committed(state, ns, key)

    def counted_items(state: State, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        for item in items(state, *args, **kwargs):
            reads[0] += 1
            yield item

    monkeypatch.setattr(State, "committed", counted)
    monkeypatch.setattr(State, "committed_items", counted_items)
    return reads
