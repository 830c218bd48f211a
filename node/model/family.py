"""The transformers building blocks of each supported model family (Llama, Qwen2).

A shard builds only its own decoder layers and a rotary embedding; the client head builds the
final norm. Both get the classes from here, so adding a family is one table entry.

Read `config.json` with `load_config`: it goes through transformers' own config class, which
knows that transformers 5 keeps `rope_theta` under `rope_parameters` (reading the top-level key
silently gives 10,000 instead of SmolLM2's 100,000).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError

# model_type -> (modeling module, class-name prefix)
_FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}
MODEL_TYPES: frozenset[str] = frozenset(_FAMILIES)  # what family_for accepts, without importing


@dataclass(frozen=True)
class Family:
    """Classes of one model family: `decoder_layer(config, layer_idx)`, `rotary(config=...)`,
    `rms_norm(hidden, eps=...)`."""

    model_type: str
    decoder_layer: type
    rotary: type
    rms_norm: type


def check_family(config: Any) -> str:
    """The config's model_type if it is a supported family (`ConfigError` if not), without
    importing its modeling module."""
    model_type = getattr(config, "model_type", None)
    if model_type not in _FAMILIES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported",
            hint=f"supported families: {', '.join(sorted(_FAMILIES))}",
        )
    return str(model_type)


def family_for(config: Any) -> Family:
    """The family's transformers classes (imports its modeling module)."""
    model_type = check_family(config)
    module_name, prefix = _FAMILIES[model_type]
    module = importlib.import_module(module_name)
    return Family(
        model_type=model_type,
        decoder_layer=getattr(module, f"{prefix}DecoderLayer"),
        rotary=getattr(module, f"{prefix}RotaryEmbedding"),
        rms_norm=getattr(module, f"{prefix}RMSNorm"),
    )


def load_config(directory: Path) -> Any:
    """The transformers config of a model directory, fp32, sdpa attention."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(directory))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the model config in {directory}: {error}") from error
    check_family(config)  # reject unsupported families early
    config._attn_implementation = "sdpa"
    return config


def layer_types(config: Any) -> list[str]:
    """Per-layer attention type ("full_attention" / "sliding_attention")."""
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers
