"""What the server needs from a shard, and the real implementation on top of `node.model`.

The server speaks numpy at this boundary ([1, T, H] float32 in and out, positions int64), so
handlers and tests stay torch-free; `ModelShardBackend` converts to torch on the worker thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from protocol.spans import ShardSpan


class ShardBackend(Protocol):
    shard_id: int
    hidden_size: int
    layers: tuple[int, int]
    model_id: str
    model_hash: str
    quant: str
    device: str

    def new_cache(self) -> Any: ...

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        """hidden [1, T, H] float32, positions [T] int64 → [1, T, H] float32."""
        ...

    def forward_batch(
        self, hidden: np.ndarray, positions: np.ndarray, caches: list[Any]
    ) -> np.ndarray:
        """One decode step of B sessions: hidden [B, 1, H], positions [B] (each session's next
        position), one cache per session → [B, 1, H] float32."""
        ...

    def cache_bytes(self, cache: Any) -> int: ...

    def rewind(self, cache: Any, length: int) -> None:
        """Drop the cached positions >= `length` (a frame with the rewind flag)."""
        ...

    def cache_bytes_per_position(self) -> int:
        """KV bytes one more position costs a session (accounted before computing it)."""
        ...


def served_span(backend: ShardBackend) -> ShardSpan:
    """The shards a backend runs as one hop: a span backend's (node/server/span_backend.py),
    else its one shard."""
    span = getattr(backend, "span", None)
    return span if isinstance(span, ShardSpan) else ShardSpan.one(backend.shard_id)


class PrefixBackend(ShardBackend, Protocol):
    """A backend whose KV can be copied out by blocks of positions and back into another
    session's cache (the prefix cache, node/server/prefix_cache.py)."""

    def export_kv(self, cache: Any, start: int, end: int) -> Any:
        """A copy of what `cache` holds for positions [start, end)."""
        ...

    def import_kv(self, cache: Any, block: Any) -> None:
        """Append an exported block to `cache` (which holds exactly the block's start)."""
        ...


class ModelShardBackend:
    """A hash-checked shard from a manifest (node.model.ShardModel), run with torch."""

    def __init__(self, manifest_path: Path, shard_id: int, device: str = "auto") -> None:
        import torch

        from node.model.manifest import Manifest
        from node.model.shard import ShardModel
        from node.model.shard import cache_bytes as _cache_bytes

        self._torch = torch
        self._cache_bytes = _cache_bytes
        manifest = Manifest.load(manifest_path)
        self.model = ShardModel.load(manifest_path, shard_id, device=device)
        entry = next(s for s in manifest.shards if s.shard_id == shard_id)
        self.shard_id = shard_id
        self.hidden_size = int(self.model.hidden_size)
        self.layers = tuple(self.model.layers)
        self.model_id = manifest.model_id
        self.model_hash = manifest.model_hash
        self.quant = entry.quant
        self.device = str(self.model.device)
        # KV blocks can be copied between sessions only for full-attention layers (a sliding-
        # window layer keeps only its window: node/server/prefix_cache.py stays off)
        self.prefix_reusable = self.model.full_attention

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model.forward(torch.from_numpy(hidden), torch.from_numpy(positions), cache)
        return out.numpy()

    def forward_batch(
        self, hidden: np.ndarray, positions: np.ndarray, caches: list[Any]
    ) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model.forward_batch(
                torch.from_numpy(hidden), torch.from_numpy(positions), caches
            )
        return out.numpy()

    def cache_bytes(self, cache: Any) -> int:
        return int(self._cache_bytes(cache))

    def rewind(self, cache: Any, length: int) -> None:
        self.model.rewind(cache, length)

    def cache_bytes_per_position(self) -> int:
        return int(self.model.cache_bytes_per_position())

    def export_kv(self, cache: Any, start: int, end: int) -> Any:
        return self.model.export_kv(cache, start, end)

    def import_kv(self, cache: Any, block: Any) -> None:
        self.model.import_kv(cache, block)
