"""The client's own part of the model (tokenizer, embeddings, final norm, LM head), numpy-facing.

Wraps `node.model.ClientHead` so the pipeline code stays torch-free at its boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class NumpyHead:
    def __init__(self, manifest_path: Path, device: str = "cpu") -> None:
        import torch

        from node.model.head import ClientHead

        self._torch = torch
        self.head = ClientHead.load(manifest_path, device=device)
        self.eos_token_ids: frozenset[int] = frozenset(self.head.eos_token_ids)

    def chat_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return list(self.head.chat_ids(list(messages)))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.head.decode(list(ids)))

    def embed_np(self, ids: Sequence[int]) -> np.ndarray:
        with self._torch.inference_mode():
            return self.head.embed(list(ids)).float().cpu().numpy()

    def logits_batch_np(self, hidden_last: np.ndarray) -> np.ndarray:
        """[B, V] float32 logits of B sessions' last rows [B, H] (one matmul for all)."""
        with self._torch.inference_mode():
            rows = self._torch.from_numpy(np.ascontiguousarray(hidden_last, dtype=np.float32))
            return self.head.all_logits(rows.reshape(1, -1, rows.shape[-1])).float().numpy()

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            hidden = self._torch.from_numpy(np.ascontiguousarray(hidden_last, dtype=np.float32))
            return self.head.logits(hidden).float().cpu().numpy().reshape(-1)
