"""A span hop's backend: several consecutive shards run as one `ShardBackend`.

    SpanBackend([shard a, shard a+1, …, shard b])     each a ShardBackend of one shard
    forward(hidden [1, T, H], positions [T], cache)  = shard b(… shard a+1(shard a(hidden)))
    cache                                            = SpanCache: one cache per shard, in order

The server sees one backend whose `shard_id` is the span's first shard (what a circuit's `open`
names) and whose `layers` run from the first shard's first layer to the last shard's last; every
shard keeps its own KV cache per session (node/model/shard.py keeps layer indexes, so the caches
never mix). `stages` names the shards in order for what is per shard (prices, credits,
commitments: docs/compute.md, *Span hops*).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from node.server.backend import ShardBackend
from protocol.errors import ConfigError
from protocol.spans import ShardSpan

MAX_KEPT_STAGES = 64  # a session's forwards whose per-shard outputs wait to be recorded


@dataclass(slots=True)
class SpanCache:
    """One session's KV caches, one per shard of the span, in shard order, and every shard's
    outputs of the session's forwards not yet recorded, by their first position (`stages`:
    taken by node/server/state.py `after_forward` for the per-shard served logs; a session has
    several frames in flight, so the worker may run the next before the last is recorded)."""

    parts: tuple[Any, ...]
    stages: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def keep(self, start: int, outs: list[np.ndarray]) -> None:
        self.stages[start] = outs
        while len(self.stages) > MAX_KEPT_STAGES:  # never taken (the frame failed later)
            del self.stages[next(iter(self.stages))]

    def take(self, start: int) -> list[np.ndarray] | None:
        return self.stages.pop(start, None)


@dataclass(frozen=True, slots=True)
class SpanKV:
    """An exported block of positions: one block per shard (node/server/prefix_cache.py)."""

    parts: tuple[Any, ...]


class SpanBackend:
    """Shards first … last of one model, each its own backend, served as one hop."""

    def __init__(self, stages: Sequence[ShardBackend]) -> None:
        if not stages:
            raise ConfigError("a span needs at least one shard")
        ids = [stage.shard_id for stage in stages]
        if ids != list(range(ids[0], ids[0] + len(ids))):
            raise ConfigError(f"a span's shards must be consecutive, got {ids}")
        first = stages[0]
        for stage in stages[1:]:
            if stage.model_hash != first.model_hash or stage.hidden_size != first.hidden_size:
                raise ConfigError("a span's shards must come from one model")
        self.stages = tuple(stages)
        self.span = ShardSpan(ids[0], ids[-1])
        self.shard_id = first.shard_id
        self.hidden_size = first.hidden_size
        self.layers = (first.layers[0], stages[-1].layers[1])
        self.model_id = first.model_id
        self.model_hash = first.model_hash
        quants = sorted({stage.quant for stage in stages})
        self.quant = quants[0] if len(quants) == 1 else "+".join(quants)
        self.device = first.device
        # off: a prefix hit would skip the inner shards' inputs that their commitments (and
        # spot-check tickets) need (docs/compute.md, *Span hops*)
        self.prefix_reusable = False
        # keep each forward's per-shard outputs in the session's cache until recorded: on only
        # where something records them (node/server/served.py, tickets.py for a span)
        self.keep_stages = False

    @property
    def shards(self) -> tuple[int, ...]:
        return self.span.shards

    def new_cache(self) -> SpanCache:
        return SpanCache(tuple(stage.new_cache() for stage in self.stages))

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: SpanCache) -> np.ndarray:
        return self.forward_stages(hidden, positions, cache)[-1]

    def forward_stages(
        self, hidden: np.ndarray, positions: np.ndarray, cache: SpanCache
    ) -> list[np.ndarray]:
        """Every shard's output, in order (the last is `forward`'s): the inputs of shard i + 1
        are the outputs of shard i. Kept in `cache.stages` until the next forward."""
        outs = []
        for stage, part in zip(self.stages, cache.parts, strict=True):
            hidden = stage.forward(hidden, positions, part)
            outs.append(hidden)
        if self.keep_stages:
            cache.keep(int(positions[0]), outs)
        return outs

    def forward_batch(
        self, hidden: np.ndarray, positions: np.ndarray, caches: list[SpanCache]
    ) -> np.ndarray:
        outs = []
        for index, stage in enumerate(self.stages):
            hidden = stage.forward_batch(hidden, positions, [c.parts[index] for c in caches])
            outs.append(hidden)
        for row, cache in enumerate(caches if self.keep_stages else ()):  # [B, 1, H] → [1, 1, H]
            cache.keep(int(positions[row]), [out[row : row + 1] for out in outs])
        return hidden

    def cache_bytes(self, cache: SpanCache) -> int:
        return sum(
            stage.cache_bytes(part) for stage, part in zip(self.stages, cache.parts, strict=True)
        )

    def rewind(self, cache: SpanCache, length: int) -> None:
        for stage, part in zip(self.stages, cache.parts, strict=True):
            stage.rewind(part, length)

    def cache_bytes_per_position(self) -> int:
        return sum(stage.cache_bytes_per_position() for stage in self.stages)

    def export_kv(self, cache: SpanCache, start: int, end: int) -> SpanKV:
        return SpanKV(
            tuple(
                stage.export_kv(part, start, end)  # type: ignore[attr-defined]
                for stage, part in zip(self.stages, cache.parts, strict=True)
            )
        )

    def import_kv(self, cache: SpanCache, block: SpanKV) -> None:
        for stage, part, piece in zip(self.stages, cache.parts, block.parts, strict=True):
            stage.import_kv(part, piece)  # type: ignore[attr-defined]


def load_span(manifest_path: Path, span: ShardSpan, device: str = "auto") -> SpanBackend:
    """Every shard of `span` from the manifest (each hash-checked as `planet node serve` does)."""
    from node.server.backend import ModelShardBackend

    return SpanBackend([ModelShardBackend(manifest_path, shard, device=device) for shard in span])
