"""A deterministic stand-in shard (no model): for unit tests and protocol debugging.

forward(h) = h + (shard_id + 1) for every row, and it checks that the positions it is given
continue its cache exactly, so tests catch any off-by-one in session handling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class FakeCache:
    positions: list[int] = field(default_factory=list)


class FakeShard:
    """Implements node.server.backend.ShardBackend with arithmetic instead of layers."""

    def __init__(
        self,
        *,
        shard_id: int = 0,
        hidden_size: int = 8,
        layers: tuple[int, int] = (0, 2),
        bytes_per_position: int = 1024,
        fail_with: Exception | None = None,
    ) -> None:
        self.shard_id = shard_id
        self.hidden_size = hidden_size
        self.layers = layers
        self.bytes_per_position = bytes_per_position
        self.fail_with = fail_with
        self.model_id = "fake"
        self.model_hash = "sha256:" + "0" * 64
        self.quant = "none"
        self.device = "cpu"
        self.calls = 0
        self.batch_sizes: list[int] = []  # one entry per forward_batch call

    def new_cache(self) -> FakeCache:
        return FakeCache()

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: FakeCache) -> np.ndarray:
        self.calls += 1
        if self.fail_with is not None:
            raise self.fail_with
        expected = list(range(len(cache.positions), len(cache.positions) + len(positions)))
        if [int(p) for p in positions] != expected:
            raise AssertionError(f"fake shard got positions {positions}, expected {expected}")
        cache.positions.extend(int(p) for p in positions)
        return hidden + np.float32(self.shard_id + 1)

    def forward_batch(
        self, hidden: np.ndarray, positions: np.ndarray, caches: list[FakeCache]
    ) -> np.ndarray:
        self.batch_sizes.append(len(caches))
        rows = [
            self.forward(hidden[b : b + 1], positions[b : b + 1], cache)
            for b, cache in enumerate(caches)
        ]
        return np.concatenate(rows)

    def cache_bytes(self, cache: FakeCache) -> int:
        return len(cache.positions) * self.bytes_per_position

    def cache_bytes_per_position(self) -> int:
        return self.bytes_per_position
