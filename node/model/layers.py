"""Decoder-layer weight containers for the fast shard path, without transformers' modeling code.

`decoder_layer(config, index)` builds an (uninitialised) module with exactly the parameters and
state-dict keys of transformers' `LlamaDecoderLayer` / `Qwen2DecoderLayer`
(`self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `input_layernorm`,
`post_attention_layernorm`; Qwen2's q/k/v biases, Llama's `attention_bias` / `mlp_bias`), so
the same shard files load into it strictly. It has no forward of its own:
node/model/fast.py runs it. Importing this instead of `transformers.models.*.modeling_*` keeps
the modeling modules (and their import time) out of a node that serves on the fast path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from protocol.errors import ConfigError


class RMSNormWeights(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps


class AttentionWeights(nn.Module):
    def __init__(self, config: Any, index: int, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.layer_idx = index
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(config.hidden_size, heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, config.hidden_size, bias=o_bias)


class MLPWeights(nn.Module):
    def __init__(self, config: Any, bias: bool) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)
        self.act_fn = _activation(config.hidden_act)


class DecoderLayerWeights(nn.Module):
    def __init__(self, config: Any, index: int) -> None:
        super().__init__()
        if config.model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif config.model_type == "llama":
            qkv_bias = o_bias = bool(getattr(config, "attention_bias", False))
            mlp_bias = bool(getattr(config, "mlp_bias", False))
        else:
            raise ConfigError(f"no fast decoder layer for model_type {config.model_type!r}")
        self.self_attn = AttentionWeights(config, index, qkv_bias, o_bias)
        self.mlp = MLPWeights(config, mlp_bias)
        self.input_layernorm = RMSNormWeights(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormWeights(config.hidden_size, config.rms_norm_eps)


def decoder_layer(config: Any, index: int) -> nn.Module:
    """The weights of decoder layer `index` (built on the current default device)."""
    return DecoderLayerWeights(config, index)


def _activation(name: str) -> Any:
    if name == "silu":
        return F.silu
    from transformers.activations import ACT2FN  # other activations: transformers' table

    return ACT2FN[name]
