"""`ShardConfig.load(directory)`: the `config.json` values the fast shard path reads, as JSON.

`node.model.family.load_config` goes through transformers' `AutoConfig`, whose config classes
import transformers' activations, hub kernels and with them `torch._dynamo`: ~2.3 s of CPU for
every `planet node serve` start (measured on this machine's shared cores). The fast path
(node/model/fast.py, node/model/layers.py, `resolve_path`) reads only a dozen plain values, so
`ShardModel.load` reads them here when the shard runs on the fast path, the way
node/model/head_config.py does for the client head.

A key absent from `config.json` takes the value transformers' own config class of that family
gives it (`LlamaConfig`, `Qwen2Config`, transformers 5.x; tests/unit/test_shard_config.py checks
every attribute against `AutoConfig` on the repo's models). `ShardConfig.load` returns None for a
config it does not model — a non-default rope type (llama3, yarn, …), a partial rotary factor,
per-layer rope parameters, a sliding-window layer — and the caller keeps `load_config` for those.
Values of the wrong type or out of range are a `ConfigError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.model.head_config import CONFIG_FILE, is_int, read_config
from protocol.errors import ConfigError

FULL_ATTENTION = "full_attention"
DEFAULT_ROPE_THETA = 10_000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta

# Per family: the value transformers' config class gives a key absent from config.json
# (None for num_key_value_heads: "as many as the attention heads").
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
    },
    "qwen2": {
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
    },
}


@dataclass(frozen=True)
class ShardConfig:
    """What the fast path reads of a model's config (attribute names as transformers')."""

    directory: Path  # where config.json lives (for `load_config` if the hf path is chosen)
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    max_position_embeddings: int
    attention_bias: bool
    mlp_bias: bool
    layer_types: tuple[str, ...]
    rope_parameters: dict[str, Any]  # {"rope_type": "default", "rope_theta": float}

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters["rope_theta"])

    @classmethod
    def load(cls, directory: Path) -> ShardConfig | None:
        """Parse `directory/config.json`; None when it needs transformers' config (see the
        module docstring); `ConfigError` when it cannot be read or a value is malformed."""
        return cls.parse(read_config(directory), Path(directory))

    @classmethod
    def parse(cls, doc: dict[str, Any], directory: Path) -> ShardConfig | None:
        where = str(directory / CONFIG_FILE)
        model_type = doc.get("model_type")
        if model_type not in _DEFAULTS:
            raise ConfigError(
                f"model_type {model_type!r} is not supported",
                hint=f"supported families: {', '.join(sorted(_DEFAULTS))}",
            )
        defaults = _DEFAULTS[model_type]

        def positive(key: str) -> int:
            value = doc.get(key)
            value = defaults[key] if value is None else value
            if not is_int(value) or value < 1:
                raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
            return int(value)

        hidden, heads = positive("hidden_size"), positive("num_attention_heads")
        layers = positive("num_hidden_layers")
        kv_heads = doc.get("num_key_value_heads", defaults["num_key_value_heads"])
        kv_heads = heads if kv_heads is None else kv_heads
        if not is_int(kv_heads) or kv_heads < 1 or heads % kv_heads:
            raise ConfigError(
                f"{where}: num_key_value_heads must divide num_attention_heads ({heads}), "
                f"got {kv_heads!r}"
            )
        if not doc.get("head_dim") and hidden % heads:
            raise ConfigError(f"{where}: hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = doc.get("head_dim") or hidden // heads
        if not is_int(head_dim) or head_dim < 1 or head_dim % 2:
            raise ConfigError(f"{where}: head_dim must be a positive even integer")
        eps = doc.get("rms_norm_eps", defaults["rms_norm_eps"])
        if not _is_number(eps) or not eps > 0:
            raise ConfigError(f"{where}: rms_norm_eps must be a positive number, got {eps!r}")
        act = doc.get("hidden_act", defaults["hidden_act"])
        if not isinstance(act, str) or not act:
            raise ConfigError(f"{where}: hidden_act must be a name, got {act!r}")
        rope = _default_rope(doc, where)
        types = _layer_types(doc, model_type, layers, where)
        if rope is None or types is None:
            return None
        return cls(
            directory=directory,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=positive("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim),
            hidden_act=act,
            rms_norm_eps=float(eps),
            max_position_embeddings=positive("max_position_embeddings"),
            attention_bias=_flag(doc, "attention_bias", where),
            mlp_bias=_flag(doc, "mlp_bias", where),
            layer_types=types,
            rope_parameters=rope,
        )


def _default_rope(doc: dict[str, Any], where: str) -> dict[str, Any] | None:
    """{"rope_type": "default", "rope_theta": θ}, or None for any other rope (transformers'
    order: a legacy `rope_scaling` dict, else `rope_parameters`; θ there, else top level)."""
    params = doc.get("rope_scaling") or doc.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: rope_parameters must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    extra = set(params) - {"rope_type", "type", "rope_theta"}
    if rope_type != "default" or extra or "partial_rotary_factor" in doc:
        return None  # llama3 / yarn / per-layer-type parameters / partial rotary: transformers
    theta = params.get("rope_theta", doc.get("rope_theta", DEFAULT_ROPE_THETA))
    if not _is_number(theta) or not theta > 0:
        raise ConfigError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    return {"rope_type": "default", "rope_theta": float(theta)}


def _layer_types(
    doc: dict[str, Any], model_type: str, layers: int, where: str
) -> tuple[str, ...] | None:
    """Every layer's attention kind, or None when any layer slides (not the fast path's)."""
    given = doc.get("layer_types")
    if given is None:
        sliding = model_type == "qwen2" and doc.get("use_sliding_window") is True
        return None if sliding else (FULL_ATTENTION,) * layers
    if not isinstance(given, list) or len(given) != layers:
        raise ConfigError(f"{where}: layer_types must list {layers} attention kinds")
    if not all(isinstance(kind, str) for kind in given):
        raise ConfigError(f"{where}: layer_types must be names, got {given!r}")
    return tuple(given) if set(given) == {FULL_ATTENTION} else None


def _flag(doc: dict[str, Any], key: str, where: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
