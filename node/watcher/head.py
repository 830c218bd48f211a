"""`PassHead`: the latest EVM block number, read at most once per watcher pass.

Every step of one pass (the stake watcher's event range, the mint funder's deposit log) reads
up to the same block: the runner calls `new_pass()` before each pass, and the first step that
asks reads `eth_blockNumber`; the others reuse that answer. A failed read caches nothing.
"""

from __future__ import annotations

from collections.abc import Callable


class PassHead:
    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._latest: int | None = None

    def new_pass(self) -> None:
        """Forget the block read in the last pass: the next `latest()` reads again."""
        self._latest = None

    def latest(self) -> int:
        """The pass's latest block (read now when this pass has not read it yet)."""
        if self._latest is None:
            self._latest = self._read()
        return self._latest
