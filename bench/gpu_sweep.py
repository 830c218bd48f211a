"""GPU sweep: a Llama-3-8B-shaped model with random weights (no download), bf16 and int4, as 4
shards on one GPU against the monolithic model — one JSON object on stdout, logs on stderr.

    .venv/bin/python bench/gpu_sweep.py         # on a CUDA machine: the issue's figures
                                                # (without a usable GPU: the tiny shape)
    .venv/bin/python bench/gpu_sweep.py --tiny  # a tiny Llama, on whatever device (CI, CPU)
    .venv/bin/python bench/gpu_sweep.py --quants bf16,int8,int4 --sessions 32 --new-tokens 64

Per quant, in one process and interleaved with the monolithic reference:
- single session: greedy decode tok/s of the monolithic model (one forward per token over all
  layers, transformers DynamicCache) and of the 4-shard pipeline (node.model.ShardModel per
  shard; activations cross every shard boundary through host memory as float32, as they do on
  the wire; no network) → `ratio_pipeline_4_vs_monolithic_<q>` (target ≥ 0.8);
- many sessions: N sessions decoding together through the same 4 shards, each decode step one
  batched forward per shard (`ShardModel.forward_batch`, continuous batching) → aggregate tok/s
  and `ratio_aggregate_<N>_vs_1_<q>` (target ≥ 10 for N = 32);
- memory: bytes of the shards' weights → `ratio_shard_bytes_int4_vs_bf16` (target ≤ 0.3).
bf16 = bf16 weights and activations on CUDA (float32 on a CPU: bf16 matmuls there are slow and
not what a CPU node runs); int4 = torchao int4 weight-only (tinygemm, group 128) on CUDA, hqq
4-bit group 32 elsewhere; int8 = torchao int8 weight-only.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick

log = logging.getLogger("bench.gpu_sweep")

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_theta": 500000.0,
}
COMMAND = ".venv/bin/python bench/gpu_sweep.py"


def build_model(shape: dict[str, Any], device: Any, dtype: Any, seed: int) -> Any:
    """A LlamaForCausalLM of `shape` with random N(0, 0.02) weights, built on `device`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **{k: v for k, v in shape.items() if k != "rope_theta"},
        rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]},
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config).to(device)
    return model.eval()


def shards_of(model: Any, parts: int, device: Any, dtype: Any) -> list[Any]:
    """`parts` ShardModels over the model's own layer modules (shared weights, no copy)."""
    from torch import nn

    from node.model.shard import ShardModel

    total = model.config.num_hidden_layers
    bounds = [round(i * total / parts) for i in range(parts + 1)]
    shards = []
    for start, end in itertools.pairwise(bounds):
        root = nn.Module()
        root.model = nn.Module()
        own = {str(i): model.model.layers[i] for i in range(start, end)}
        root.model.layers = nn.ModuleDict(own)
        shards.append(ShardModel(model.config, (start, end), root, device, activation_dtype=dtype))
    return shards


def quantize_layers(model: Any, quant: str, device: Any) -> str:
    """Quantize every decoder layer's Linear in place; returns what was used."""
    import torch

    layers = model.model.layers
    if quant == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(layers, Int8WeightOnlyConfig())
        return "torchao Int8WeightOnlyConfig"
    if device.type == "cuda":
        try:
            from torchao.quantization import Int4WeightOnlyConfig, quantize_

            # the default "plain" layout needs fbgemm's kernels; tinygemm's is in torch itself
            config = Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
            quantize_(layers, config)
            return "torchao Int4WeightOnlyConfig(group_size=128, tile_packed_to_4d: tinygemm)"
        except Exception as error:  # no tinygemm kernel for this GPU/torch: hqq instead
            log.warning("torchao int4 failed (%s); using hqq", error)
    from node.model.quant import quantize_module

    if device.type != "cuda":
        layers.float()  # hqq's CPU path computes in float32
    quantize_module(layers, "int4")
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return "hqq 4-bit group 32 (node.model.quant)"


def weight_bytes(shards: list[Any]) -> int:
    return sum(shard.parameter_bytes() for shard in shards)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def decode_monolithic(model: Any, ids: list[int], steps: int, device: Any) -> float:
    """Greedy decode tok/s of the whole model (after the first token)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=device), past_key_values=cache).logits
        token = int(logits[0, -1].argmax())
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = model(torch.tensor([[token]], device=device), past_key_values=cache).logits
            token = int(logits[0, -1].argmax())
        _sync(device)
    return steps / (time.perf_counter() - t0)


def _head(model: Any, hidden: Any) -> Any:
    """Final norm and LM head of the monolithic model on the last row(s): [B, V]."""
    inner = model.model
    weight_dtype = model.lm_head.weight.dtype
    return model.lm_head(inner.norm(hidden.to(inner.norm.weight.device, weight_dtype)))[:, -1]


def decode_pipeline(
    model: Any, shards: list[Any], prompts: list[list[int]], steps: int, device: Any
) -> float:
    """Aggregate greedy decode tok/s of len(prompts) sessions through the shards (one batched
    forward per shard and step when there are several)."""
    import torch

    embed = model.model.embed_tokens
    batch = len(prompts)
    caches = [[s.new_cache() for s in shards] for _ in prompts]
    tokens = []
    with torch.inference_mode():
        for b, ids in enumerate(prompts):  # prefill each session
            hidden = embed(torch.tensor([ids], device=device)).float().cpu()
            for shard, cache in zip(shards, caches[b], strict=True):
                hidden = shard.forward(hidden, torch.arange(len(ids)), cache)
            tokens.append(int(_head(model, hidden)[0].argmax()))
        positions = torch.tensor([len(ids) for ids in prompts])
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            hidden = embed(torch.tensor([[t] for t in tokens], device=device)).float().cpu()
            for k, shard in enumerate(shards):
                if batch == 1:
                    hidden = shard.forward(hidden, positions, caches[0][k])
                else:
                    hidden = shard.forward_batch(hidden, positions, [c[k] for c in caches])
            tokens = [int(t) for t in _head(model, hidden).argmax(dim=-1)]
            positions = positions + 1
        _sync(device)
    return batch * steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny Llama shape (CPU, CI)")
    parser.add_argument("--device", default="auto", help="auto (cuda if usable), cuda or cpu")
    parser.add_argument("--quants", default="bf16,int4", help="bf16,int8,int4 (default bf16,int4)")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=32, help="sessions of the batched point")
    parser.add_argument("--new-tokens", type=int, default=None, help="decode steps (64; tiny 8)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="(128; tiny 16)")
    parser.add_argument("--repeats", type=int, default=3)
    quick = {"tiny": True, "sessions": 2, "new_tokens": 2, "prompt_tokens": 4, "repeats": 1}
    args = parse_with_quick(parser, quick, argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    import torch

    from node.model.device import activation_dtype_for, resolve_device

    device = resolve_device(args.device)
    dtype = activation_dtype_for(device)
    fell_back = device.type != "cuda" and not args.tiny
    if fell_back:  # the Llama-3-8B shape needs a GPU's memory; show the script works instead
        log.warning("no usable GPU: running the tiny shape on %s instead of llama3-8b", device)
        args.tiny = True
    shape = TINY if args.tiny else LLAMA3_8B
    steps = args.new_tokens or (8 if args.tiny else 64)
    prompt_len = args.prompt_tokens or (16 if args.tiny else 128)
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    if any(q not in ("bf16", "int8", "int4") for q in quants) or quants[0] != "bf16":
        parser.error("--quants: bf16 first, then any of int8, int4")
    load_start = [round(x, 2) for x in os.getloadavg()]
    metrics: dict[str, Any] = {}
    methods: dict[str, str] = {}
    generator = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    prompts = [
        torch.randint(0, vocab, (prompt_len,), generator=generator).tolist()
        for _ in range(args.sessions)
    ]
    bf16_bytes = 0
    for quant in quants:
        log.info("%s: building %s on %s", quant, "tiny" if args.tiny else "llama3-8b", device)
        model = build_model(shape, device, dtype, seed=0)
        if quant != "bf16":
            methods[quant] = quantize_layers(model, quant, device)
        shards = shards_of(model, args.parts, device, dtype)
        size = weight_bytes(shards)
        metrics[f"shard_bytes_{quant}"] = size
        if quant == "bf16":
            bf16_bytes = size
        else:
            metrics[f"ratio_shard_bytes_{quant}_vs_bf16"] = round(size / bf16_bytes, 4)
        if not args.quick:  # warm-up (a smoke run proves the code path, not the figure)
            decode_monolithic(model, prompts[0][:8], 2, device)
            decode_pipeline(model, shards, prompts[:2], 2, device)
        mono, pipe, many = [], [], []
        for repeat in range(args.repeats):
            mono.append(decode_monolithic(model, prompts[0], steps, device))
            pipe.append(decode_pipeline(model, shards, prompts[:1], steps, device))
            many.append(decode_pipeline(model, shards, prompts, steps, device))
            log.info(
                "%s repeat %d: mono %.1f pipe %.1f %d sessions %.1f tok/s",
                quant, repeat + 1, mono[-1], pipe[-1], args.sessions, many[-1],
            )  # fmt: skip
        n = args.sessions
        metrics[f"decode_tok_s_monolithic_{quant}"] = round(median(mono), 2)
        metrics[f"decode_tok_s_pipeline_{args.parts}_{quant}"] = round(median(pipe), 2)
        metrics[f"decode_tok_s_sessions_{n}_{quant}"] = round(median(many), 2)
        metrics[f"ratio_pipeline_{args.parts}_vs_monolithic_{quant}"] = round(
            median(pipe) / median(mono), 3
        )
        metrics[f"ratio_aggregate_{n}_vs_1_{quant}"] = round(median(many) / median(pipe), 3)
        if device.type == "cuda":
            metrics[f"peak_gpu_bytes_{quant}"] = int(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        del model, shards
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result = {
        "bench": "gpu_sweep",
        "machine": machine(),
        "config": {
            "command": " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])]),
            "shape": "tiny" if args.tiny else "llama3-8b (random weights)",
            "fell_back_to_tiny_without_gpu": fell_back,
            "quick": args.quick,
            "model_shape": shape,
            "device": str(device),
            "activation_dtype": str(dtype).removeprefix("torch."),
            "parts": args.parts,
            "sessions": args.sessions,
            "new_tokens": steps,
            "prompt_tokens": prompt_len,
            "repeats": args.repeats,
            "quant_methods": methods,
            "pipeline": "in-process ShardModels, activations through host memory (float32) at "
            "every shard boundary; no network",
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "metrics": metrics,
        "targets": {
            f"ratio_pipeline_{args.parts}_vs_monolithic_bf16": {"op": ">=", "value": 0.8},
            f"ratio_aggregate_{args.sessions}_vs_1_bf16": {"op": ">=", "value": 10.0},
            "ratio_shard_bytes_int4_vs_bf16": {"op": "<=", "value": 0.3},
        },
    }
    import json

    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
