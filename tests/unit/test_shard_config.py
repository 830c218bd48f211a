"""`ShardConfig` (config.json read as JSON for the fast shard path) against transformers'
`AutoConfig`: every attribute the fast path reads is equal, on the repo's models and on configs
missing keys (transformers' defaults), configs it does not model fall back to transformers', a
fast shard built on it computes bitwise what one built on `AutoConfig` computes, and malformed
values are a `ConfigError`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from node.model.family import layer_types, load_config
from node.model.prepare import prepare
from node.model.shard import ShardModel, read_safetensors
from node.model.shard_config import ShardConfig
from protocol.errors import ConfigError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

CACHE = Path.home() / ".cache" / "planet" / "models"
SMOLLM2 = sorted(p for p in CACHE.glob("smollm2-135m-*") if (p / "config.json").is_file())


def fast_view(config: Any) -> dict[str, Any]:
    """Every config value the fast path reads (node/model/fast.py, layers.py, shard.py's
    resolve_path / cache accounting), the way it reads them."""
    heads = config.num_attention_heads
    params = getattr(config, "rope_parameters", None) or {}
    return {
        "model_type": config.model_type,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": bool(getattr(config, "attention_bias", False)),
        "mlp_bias": bool(getattr(config, "mlp_bias", False)),
        "layer_types": layer_types(config),
        "rope_type": params.get("rope_type", "default"),
        "rope_theta": float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
    }


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"shard-config-{request.param}")
    make_tiny_model(root / "src", model_type=request.param, layers=4, hidden=64, tied=False)
    return prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)


def test_repo_models_read_as_transformers_reads_them(tiny: Path) -> None:
    for directory in [tiny.parent, *SMOLLM2]:
        parsed = ShardConfig.load(directory)
        assert parsed is not None, directory
        assert fast_view(parsed) == fast_view(load_config(directory)), directory


MINIMAL: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 32},
    "qwen2": {"model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 32},
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "extra",
    [
        {},  # every other key: transformers' default for the family
        {"num_key_value_heads": 2, "rope_theta": 500000.0, "head_dim": 32, "mlp_bias": True},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}, "rms_norm_eps": 1e-5},
        {"rope_scaling": {"type": "default", "rope_theta": 3.0}, "attention_bias": True},
        {"layer_types": ["full_attention"] * 3, "num_hidden_layers": 3},
    ],
)
def test_absent_keys_take_transformers_defaults(
    tmp_path: Path, family: str, extra: dict[str, Any]
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**MINIMAL[family], **extra}))
    parsed = ShardConfig.load(tmp_path)
    assert parsed is not None
    assert fast_view(parsed) == fast_view(load_config(tmp_path))


@pytest.mark.parametrize(
    "extra",
    [
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        {"partial_rotary_factor": 0.5},
        {"layer_types": ["full_attention", "sliding_attention"], "num_hidden_layers": 2},
    ],
)
def test_configs_only_transformers_models_fall_back(tmp_path: Path, extra: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**MINIMAL["llama"], **extra}))
    assert ShardConfig.load(tmp_path) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({"hidden_size": "576"}, "hidden_size"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"rms_norm_eps": -1}, "rms_norm_eps"),
        ({"rope_theta": "big"}, "rope_theta"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"layer_types": "full_attention"}, "layer_types"),
        ({"hidden_size": 100}, "multiple"),
    ],
)
def test_malformed_values_are_config_errors(tmp_path: Path, extra: dict, message: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**MINIMAL["llama"], **extra}))
    with pytest.raises(ConfigError, match=message):
        ShardConfig.load(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        ShardConfig.load(tmp_path)


def test_fast_shard_loads_on_shard_config_and_computes_bitwise_the_same(tiny: Path) -> None:
    loaded = ShardModel.load(tiny, 1, device="cpu")
    assert loaded.path == "fast" and isinstance(loaded.config, ShardConfig)
    assert not isinstance(ShardModel.load(tiny, 1, device="cpu", path="hf").config, ShardConfig)
    shard_file = next(tiny.parent.glob("shard-1.safetensors"))
    state, _ = read_safetensors(shard_file)
    on_hf = ShardModel.from_state_dict(loaded.config, loaded.layers, state, "cpu", path="hf")
    assert on_hf.path == "hf" and not isinstance(on_hf.config, ShardConfig)
    reference = ShardModel.from_file(
        load_config(tiny.parent), loaded.layers, shard_file, device="cpu", path="fast"
    )
    caches = [loaded.new_cache(), reference.new_cache()]
    hidden = torch.randn(1, 7, loaded.hidden_size, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(7)
    for step in range(6):
        ours = loaded.forward(hidden, positions, caches[0])
        theirs = reference.forward(hidden, positions, caches[1])
        assert torch.equal(ours, theirs), step
        hidden, positions = ours[:, -1:], positions[-1:] + 1
