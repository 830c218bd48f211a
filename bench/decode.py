"""Decode speed of one node's compute path: the hf path vs the fast path, int8 vs fp32 shards,
one torch thread vs two, side by side in one process (issue 46, the CPU part). Int8 shards run
four ways: hf, the fast path with torch's int8 kernel pinned (`fast`: `int8_kernel=True`), the
default (`auto`: the same kernel unless `PLANET_INT8_KERNEL=0`, which this bench ignores) and
the opt-out (`dequant`: the fast path on weights de-quantized to fp32 at load, the default
before the kernel became verifiable).

    python bench/decode.py --quick     # smoke run: 2 new tokens, 1 repeat, 1 thread, each
                                       # quant's files hashed once (~10 CPU-s)
    python bench/decode.py             # 64 new tokens, medians of 5 interleaved repeats

The shards of the 3-part SmolLM2-135M circuit (the prepared cache) run in this process one after
another with the client head's embedding and greedy logits between tokens, as a circuit does
without its network hops (bench/pipeline.py measures those). Each repeat runs every
configuration once, in turn, so the machine's noise hits all of them alike. With
`llama_cpp` importable (a bench-only install) and `--gguf FILE`, llama.cpp's decode of the same
number of tokens is reported beside it on the same threads.

Prints one BENCHMARKS.md-shaped JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median, spread
from node.procs import exit_process

log = logging.getLogger("bench.decode")
PROMPT = "The history of the printing press begins with"
PATHS = ("hf", "fast")
QUANTS = ("none", "int8")
# (quant, label) in the order they load and run. Labels: "hf" and "fast" are paths passed by
# name ("fast" on an int8 shard pins the int8 kernel); "auto" is what a node runs by default (an
# int8 shard: the fast path with the int8 kernel); "dequant" is the int8 opt-out
# (`PLANET_INT8_KERNEL=0`: the fast path on weights de-quantized to fp32 at load)
CONFIGS = (
    ("none", "hf"),
    ("none", "fast"),
    ("int8", "hf"),
    ("int8", "fast"),
    ("int8", "auto"),
    ("int8", "dequant"),
)
LOAD_ARGS: dict[str, dict[str, Any]] = {
    "hf": {"path": "hf"},
    "fast": {"path": "fast", "int8_kernel": True},
    "auto": {"path": "auto"},
    "dequant": {"path": "fast", "int8_kernel": False},
}


def _circuit(quant: str, path: str, head: Any = None) -> tuple[Any, list[Any]]:
    """The client head and the 3 shards of `quant` on `path`. Given the quant's `head` (a
    smoke run's second path of the same files), it is reused and the shard files, whose hashes
    the first load checked, are not hashed again."""
    from harness.shard_cache import prepared_manifest
    from node.model.head import ClientHead
    from node.model.shard import ShardModel

    manifest = prepared_manifest(parts=3, quant=quant)
    verify = head is None
    head = head if head is not None else ClientHead.load(manifest, device="cpu")
    shards = [
        ShardModel.load(manifest, k, device="cpu", verify=verify, **LOAD_ARGS[path])
        for k in range(3)
    ]
    return head, shards


def decode_tok_s(head: Any, shards: list[Any], new_tokens: int) -> tuple[float, float, list[int]]:
    """Greedy decode of `new_tokens` after the prompt: (tok/s of the decode steps, ms per token
    inside the shards alone, the tokens)."""
    import torch

    with torch.inference_mode():
        ids = head.encode(PROMPT)
        caches = [s.new_cache() for s in shards]
        hidden = head.embed(ids)
        positions = torch.arange(len(ids))
        tokens: list[int] = []
        started = 0.0
        in_shards = 0.0
        for step in range(new_tokens + 1):
            t0 = time.perf_counter()
            for shard, cache in zip(shards, caches, strict=True):
                hidden = shard.forward(hidden, positions, cache)
            if step:
                in_shards += time.perf_counter() - t0
            tokens.append(int(head.logits(hidden[0, -1]).argmax()))
            if step == 0:
                started = time.perf_counter()  # prefill done: time the decode steps
            positions = torch.tensor([len(ids) + step])
            hidden = head.embed([tokens[-1]])
    rate = new_tokens / (time.perf_counter() - started)
    return rate, 1000 * in_shards / new_tokens, tokens


def llama_cpp_tok_s(gguf: Path, threads: int, new_tokens: int) -> float:
    from llama_cpp import Llama  # bench-only extra

    llm = Llama(model_path=str(gguf), n_threads=threads, n_ctx=512, verbose=False)
    llm(PROMPT, max_tokens=1, temperature=0.0)  # warm
    started = time.perf_counter()
    out = llm(PROMPT, max_tokens=new_tokens + 1, temperature=0.0)
    produced = int(out["usage"]["completion_tokens"])
    return max(produced - 1, 1) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 tokens, 1 repeat, 1 thread, each quant's files hashed once",
    )
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--threads", default=None, help="torch thread counts (default 1,2; --quick: 1)"
    )
    parser.add_argument("--gguf", type=Path, default=None, help="llama.cpp comparison (opt-in)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    import torch

    for name in ("PLANET_SHARD_PATH", "PLANET_INT8_KERNEL"):  # "auto" must mean the default
        if os.environ.pop(name, None) is not None:
            log.warning("%s ignored: this bench runs each path by name", name)
    new_tokens = args.new_tokens or (2 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 5)
    threads = [int(t) for t in (args.threads or ("1" if args.quick else "1,2")).split(",") if t]
    loaded: dict[tuple[str, str], tuple[Any, list[Any]]] = {}
    load_s: dict[str, float] = {}
    for quant, path in CONFIGS:
        t0 = time.perf_counter()
        first = loaded.get((quant, PATHS[0]))  # --quick: its head and checked files
        loaded[(quant, path)] = _circuit(quant, path, first[0] if first and args.quick else None)
        load_s[f"load_s_{path}_{_q(quant)}"] = round(time.perf_counter() - t0, 2)
    runs: dict[str, list[float]] = {}
    shard_ms: dict[str, list[float]] = {}
    tokens: dict[str, list[int]] = {}
    for repeat in range(repeats):
        for count in threads:
            torch.set_num_threads(count)
            for (quant, path), (head, shards) in loaded.items():
                key = f"{path}_{_q(quant)}_{count}t"
                rate, inside, produced = decode_tok_s(head, shards, new_tokens)
                runs.setdefault(key, []).append(rate)
                shard_ms.setdefault(key, []).append(inside)
                tokens[key] = produced
                log.info("repeat %d %s: %.1f tok/s", repeat, key, rate)
    metrics: dict[str, Any] = {}
    for key, values in runs.items():
        metrics[f"decode_tok_s_{key}"] = round(median(values), 2)
        metrics[f"decode_ms_per_token_{key}"] = round(1000 / median(values), 1)
        metrics[f"decode_ms_per_token_shards_{key}"] = round(median(shard_ms[key]), 1)
        if len(values) > 1:
            metrics[f"decode_tok_s_{key}_spread"] = spread(values)
    for count in threads:
        rate = metrics.__getitem__
        metrics[f"ratio_fast_vs_hf_fp32_{count}t"] = _ratio(
            rate(f"decode_tok_s_fast_fp32_{count}t"), rate(f"decode_tok_s_hf_fp32_{count}t")
        )
        metrics[f"ratio_int8_vs_fp32_fast_{count}t"] = _ratio(
            rate(f"decode_tok_s_fast_int8_{count}t"), rate(f"decode_tok_s_fast_fp32_{count}t")
        )
        # the shards alone (the client head's fp32 logits are the same in both)
        metrics[f"ratio_int8_vs_fp32_fast_shards_{count}t"] = _ratio(
            rate(f"decode_ms_per_token_shards_fast_fp32_{count}t"),
            rate(f"decode_ms_per_token_shards_fast_int8_{count}t"),
        )
        metrics[f"ratio_fast_vs_hf_fp32_shards_{count}t"] = _ratio(
            rate(f"decode_ms_per_token_shards_hf_fp32_{count}t"),
            rate(f"decode_ms_per_token_shards_fast_fp32_{count}t"),
        )
        metrics[f"tokens_identical_fast_vs_hf_fp32_{count}t"] = int(
            tokens[f"fast_fp32_{count}t"] == tokens[f"hf_fp32_{count}t"]
        )
        metrics[f"tokens_identical_fast_vs_hf_int8_{count}t"] = int(
            tokens[f"fast_int8_{count}t"] == tokens[f"hf_int8_{count}t"]
        )
        # the int8 default (the kernel) against fp32 and against the opt-out (de-quantized
        # weights, the default before): the shards alone
        metrics[f"ratio_int8_default_vs_fp32_fast_shards_{count}t"] = _ratio(
            rate(f"decode_ms_per_token_shards_fast_fp32_{count}t"),
            rate(f"decode_ms_per_token_shards_auto_int8_{count}t"),
        )
        metrics[f"ratio_int8_default_vs_dequant_shards_{count}t"] = _ratio(
            rate(f"decode_ms_per_token_shards_dequant_int8_{count}t"),
            rate(f"decode_ms_per_token_shards_auto_int8_{count}t"),
        )
        metrics[f"ratio_int8_default_vs_dequant_{count}t"] = _ratio(
            rate(f"decode_tok_s_auto_int8_{count}t"), rate(f"decode_tok_s_dequant_int8_{count}t")
        )
        metrics[f"tokens_identical_auto_vs_dequant_int8_{count}t"] = int(
            tokens[f"auto_int8_{count}t"] == tokens[f"dequant_int8_{count}t"]
        )
        metrics[f"tokens_identical_dequant_vs_hf_int8_{count}t"] = int(
            tokens[f"dequant_int8_{count}t"] == tokens[f"hf_int8_{count}t"]
        )
    if 1 in threads and 2 in threads:
        for quant, path in ((_q(q), p) for q, p in CONFIGS):
            metrics[f"ratio_2t_vs_1t_{path}_{quant}"] = _ratio(
                metrics[f"decode_tok_s_{path}_{quant}_2t"],
                metrics[f"decode_tok_s_{path}_{quant}_1t"],
            )
            metrics[f"ratio_2t_vs_1t_shards_{path}_{quant}"] = _ratio(
                metrics[f"decode_ms_per_token_shards_{path}_{quant}_1t"],
                metrics[f"decode_ms_per_token_shards_{path}_{quant}_2t"],
            )
    if args.gguf is not None and importlib.util.find_spec("llama_cpp") is not None:
        for count in threads:
            rate = llama_cpp_tok_s(args.gguf, count, new_tokens)
            metrics[f"decode_tok_s_llama_cpp_{count}t"] = round(rate, 2)
            metrics[f"ratio_fast_int8_vs_llama_cpp_{count}t"] = _ratio(
                metrics[f"decode_tok_s_fast_int8_{count}t"], rate
            )
    metrics.update(load_s)
    result = {
        "bench": "decode",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "parts": 3,
            "in_process": True,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "threads": threads,
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "ratio_int8_vs_fp32_fast_shards_1t": {"op": ">=", "value": 2.0},
            "ratio_2t_vs_1t_shards_fast_int8": {"op": ">=", "value": 1.3},
            "tokens_identical_fast_vs_hf_fp32_1t": {"op": "==", "value": 1},
        },
    }
    print(json.dumps(result))
    return 0


def _q(quant: str) -> str:
    return "fp32" if quant == "none" else quant


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


if __name__ == "__main__":
    exit_process(main)
