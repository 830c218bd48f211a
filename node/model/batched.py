"""One decode step of several sessions as one batched forward (continuous batching at a shard).

Each session brings one new position ([1, 1, H]) and its own KV cache, at its own length. The
projections, norms and MLPs run once on the stacked rows [B, 1, H] (weights are read once for
all sessions: that is where batching pays, on CPU and GPU alike); only attention runs per
session, against that session's own cache, so no padding and no cross-session mask exist.
Same greedy tokens as running the sessions one by one (tests/unit/test_batching.py).

Supported for layers built like transformers' Llama/Qwen2 decoder layers with full attention
only; `supports_batched_decode` says whether a shard qualifies (else the caller loops).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def supports_batched_decode(modules: Sequence[nn.Module], types: Sequence[str]) -> bool:
    """True if every layer is a full-attention Llama/Qwen2-style decoder layer."""
    if any(kind != "full_attention" for kind in types):
        return False
    needed = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
    for layer in modules:
        if not all(hasattr(layer, name) for name in needed):
            return False
        attn = layer.self_attn
        if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
            return False
        if getattr(attn, "sliding_window", None):
            return False
    return True


def _rotary_fn(layer: nn.Module) -> Any:
    """The family's `apply_rotary_pos_emb` (from the layer's own modeling module)."""
    return importlib.import_module(type(layer).__module__).apply_rotary_pos_emb


def decode_step_batched(
    modules: Sequence[nn.Module],
    rotary: nn.Module,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    caches: Sequence[Any],
) -> torch.Tensor:
    """hidden [B, 1, H] (one new position per session), positions [B] (each session's next
    position), caches: B per-session DynamicCaches → [B, 1, H]; appends to every cache."""
    batch = hidden.shape[0]
    position_ids = positions.view(batch, 1)
    cos, sin = rotary(hidden, position_ids)  # [B, 1, head_dim]
    apply_rotary = _rotary_fn(modules[0]) if modules else None
    for layer in modules:
        attn = layer.self_attn
        residual = hidden
        x = layer.input_layernorm(hidden)
        shape = (batch, 1, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)  # [B, heads, 1, d]
        k = attn.k_proj(x).view(shape).transpose(1, 2)  # [B, kv_heads, 1, d]
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        groups = q.shape[1] // k.shape[1]
        outs = []
        for b, cache in enumerate(caches):
            keys, values = cache.update(k[b : b + 1], v[b : b + 1], attn.layer_idx)
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                values = values.repeat_interleave(groups, dim=1)
            outs.append(
                F.scaled_dot_product_attention(q[b : b + 1], keys, values, scale=attn.scaling)
            )
        attended = torch.cat(outs).transpose(1, 2).reshape(batch, 1, -1)
        hidden = residual + attn.o_proj(attended)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return hidden
