"""A client head for fake shards: embed(id) = id in every one of H channels; the logits peak at
round(h[0]) mod V; EOS = V - 1. So a circuit of FakeShards (each adds its offset) gives tokens
one can write down by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

H = 8
V = 50


class FakeHead:
    eos_token_ids = frozenset({V - 1})

    def embed_np(self, ids: Sequence[int]) -> np.ndarray:
        return np.repeat(np.asarray(ids, dtype=np.float32)[None, :, None], H, axis=2)

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        logits = np.zeros(V, dtype=np.float32)
        logits[round(float(hidden_last[0])) % V] = 10.0
        return logits
