"""The client head's own reading of config.json and its final RMSNorm (node/model/head_config.py,
node/model/head.py): the same values and bit-identical logits as transformers' classes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from node.model.head import EMBED_KEY, LM_HEAD_KEY, NORM_KEY, ClientHead
from node.model.head_config import HeadConfig
from protocol.errors import ConfigError

SMOLLM2 = {
    "model_type": "llama",
    "hidden_size": 576,
    "rms_norm_eps": 9.999999747378752e-06,
    "eos_token_id": 2,
    "max_position_embeddings": 8192,
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_are_bit_identical_to_transformers_rmsnorm_and_linear(family: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    generator = torch.Generator().manual_seed(7)
    hidden, vocab, eps = 48, 97, 1e-5
    tensors = {
        EMBED_KEY: torch.randn(vocab, hidden, generator=generator),
        NORM_KEY: 1 + 0.1 * torch.randn(hidden, generator=generator),
        LM_HEAD_KEY: torch.randn(vocab, hidden, generator=generator),
    }
    config = HeadConfig(family, hidden, eps, (2,), 128)
    head = ClientHead(config, SimpleNamespace(eos_token_id=None), tensors, torch.device("cpu"))
    norm = (LlamaRMSNorm if family == "llama" else Qwen2RMSNorm)(hidden, eps=eps)
    norm.weight = torch.nn.Parameter(tensors[NORM_KEY].clone(), requires_grad=False)
    states = 3 * torch.randn(1, 5, hidden, generator=generator)
    with torch.inference_mode():
        expected = torch.nn.functional.linear(norm(states), tensors[LM_HEAD_KEY])[0]
        last = torch.nn.functional.linear(norm(states[:, -1:]), tensors[LM_HEAD_KEY])[0, -1]
    assert torch.equal(head.all_logits(states), expected)
    assert torch.equal(head.logits(states[0, -1]), last)


def test_reads_a_prepared_models_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, "rope_parameters": {}}))
    config = HeadConfig.load(tmp_path)
    assert config == HeadConfig("llama", 576, 9.999999747378752e-06, (2,), 8192)


def test_defaults_are_the_heads_former_fallbacks() -> None:
    doc = {"model_type": "qwen2", "hidden_size": 64, "eos_token_id": [5, 7]}
    config = HeadConfig.parse(doc, "config.json")
    assert (config.rms_norm_eps, config.eos_token_id, config.max_position_embeddings) == (
        1e-6,
        (5, 7),
        2048,
    )
    assert HeadConfig.parse({**doc, "eos_token_id": None}, "c").eos_token_id == ()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({"hidden_size": "576"}, "hidden_size"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"rms_norm_eps": "1e-5"}, "rms_norm_eps"),
        ({"eos_token_id": [2, "x"]}, "eos_token_id"),
        ({"eos_token_id": True}, "eos_token_id"),
        ({"max_position_embeddings": -1}, "max_position_embeddings"),
    ],
)
def test_rejects_what_the_head_cannot_use(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HeadConfig.parse({**SMOLLM2, **change}, "config.json")


def test_an_unreadable_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the model config"):
        HeadConfig.load(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        HeadConfig.load(tmp_path)
