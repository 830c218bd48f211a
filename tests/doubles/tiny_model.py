"""Tiny, randomly initialised models for tests (built in-process, offline, in about a second).

`make_tiny_model(directory)` writes a complete Hugging Face directory (config, safetensors
weights, a word-level tokenizer with a chat template) that `prepare(model=directory)` accepts
like any local Llama/Qwen2 model, and returns the in-memory `*ForCausalLM` for reference runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_WORDS = 120  # vocabulary = 8 specials + TINY_WORDS words
_SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tiny_words() -> list[str]:
    return [f"w{i}" for i in range(TINY_WORDS)]


def make_tiny_model(
    directory: Path,
    *,
    model_type: str = "llama",
    layers: int = 6,
    hidden: int = 64,
    tied: bool = True,
    seed: int = 0,
    init_std: float = 0.08,
) -> Any:
    """Write a tiny random model to `directory`; return the loaded `*ForCausalLM` (fp32)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    vocab = {token: index for index, token in enumerate(_SPECIALS + tiny_words())}
    common: dict[str, Any] = {
        "vocab_size": len(vocab),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0},
        "tie_word_embeddings": tied,
        "initializer_range": init_std,
        "bos_token_id": vocab["<s>"],
        "eos_token_id": vocab["</s>"],
        "pad_token_id": vocab["</s>"],
    }
    torch.manual_seed(seed)
    if model_type == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif model_type == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(f"unknown tiny model type {model_type!r}")
    model = model.float().eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return model
