"""`HeadConfig.load(directory)`: the few `config.json` values the client head needs, read as JSON.

The head (node/model/head.py) needs the model family, the hidden size, the final norm's epsilon,
the configured end-of-sequence ids and the context length. Reading them through transformers'
`AutoConfig` would import transformers' whole modelling stack: with torch installed, every
model config class imports `transformers.utils.type_validators`, which imports
`transformers.activations` and with it the model-loading, distributed and cache modules (and hqq
and torchao when installed) — ~2 s of CPU for each gateway, personal client, `planet ask` and
verifier start, which run no decoder layer. A prepared model's `config.json` is written by
transformers (`save_pretrained`), which always writes these keys; the defaults below are the
ones the head used before when a key was absent (`max_position_embeddings`: 2048, no configured
end-of-sequence id: the tokenizer's alone).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.model.family import MODEL_TYPES
from protocol.errors import ConfigError

CONFIG_FILE = "config.json"
DEFAULT_CONTEXT = 2048


@dataclass(frozen=True)
class HeadConfig:
    model_type: str
    hidden_size: int
    rms_norm_eps: float
    eos_token_id: tuple[int, ...]  # configured end-of-sequence ids (may be empty)
    max_position_embeddings: int

    @classmethod
    def load(cls, directory: Path) -> HeadConfig:
        """Parse `directory/config.json`; ConfigError when it cannot be read, names a family
        node.model.family does not support, or a value has the wrong type."""
        return cls.parse(read_config(directory), str(directory / CONFIG_FILE))

    @classmethod
    def parse(cls, doc: dict[str, Any], where: str) -> HeadConfig:
        model_type = doc.get("model_type")
        if model_type not in MODEL_TYPES:
            raise ConfigError(
                f"model_type {model_type!r} is not supported",
                hint=f"supported families: {', '.join(sorted(MODEL_TYPES))}",
            )
        hidden = doc.get("hidden_size")
        if not is_int(hidden) or hidden < 1:
            raise ConfigError(f"{where}: hidden_size must be a positive integer, got {hidden!r}")
        eps = doc.get("rms_norm_eps", 1e-6)
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not math.isfinite(eps):
            raise ConfigError(f"{where}: rms_norm_eps must be a number, got {eps!r}")
        eos = doc.get("eos_token_id")
        if eos is None:
            eos_ids: tuple[int, ...] = ()
        elif is_int(eos):
            eos_ids = (eos,)
        elif isinstance(eos, list) and all(is_int(i) for i in eos):
            eos_ids = tuple(eos)
        else:
            raise ConfigError(f"{where}: eos_token_id must be an integer or a list, got {eos!r}")
        context = doc.get("max_position_embeddings") or DEFAULT_CONTEXT
        if not is_int(context) or context < 1:
            raise ConfigError(f"{where}: max_position_embeddings must be a positive integer")
        return cls(model_type, hidden, float(eps), eos_ids, context)


def read_config(directory: Path) -> dict[str, Any]:
    """`directory/config.json` as a JSON object (the head's and the fast shard path's reader);
    ConfigError when it cannot be read or is not an object."""
    path = Path(directory) / CONFIG_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the model config in {directory}: {error}") from error
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return doc


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
