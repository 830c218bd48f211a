"""Real inputs for the ZK-checked operation: the hidden state a shard receives, computed by the
client head and the shards before it (one prefill; the last position)."""

from __future__ import annotations

from pathlib import Path

import torch

from node.model.head import ClientHead
from node.model.shard import ShardModel


@torch.inference_mode()
def shard_input(manifest: str | Path, shard: int, text: str) -> torch.Tensor:
    """[1, H] float32: the input of `shard` at the last position of `text`."""
    head = ClientHead.load(manifest, device="cpu")
    hidden = head.embed(head.encode(text))  # [1, T, H]
    positions = torch.arange(hidden.shape[1])
    for index in range(shard):
        model = ShardModel.load(manifest, index, device="cpu")
        hidden = model.forward(hidden, positions, model.new_cache())
    return hidden[:, -1, :].contiguous()  # [1, H]
