"""Wire-dtype benchmark: what fp16 activations on the wire do to greedy answers — one JSON object
on stdout, logs on stderr.

    .venv/bin/python bench/wire_dtype.py              # fp32 and int8 shards, 11 prompts, 64 tokens
    .venv/bin/python bench/wire_dtype.py --quick      # fp32 shards, one prompt, 4 tokens

SmolLM2-135M split into 3 shards, in process (no sockets: the numbers do not depend on the
transport), served the way nodes serve a question: the prompt in one prefill, then one position
per forward, each shard with its own KV cache. At every place a circuit puts activations on the
wire (the client's embeddings, each shard's output) the values are what a receiver decodes from a
raw frame of that dtype (`protocol.frames.codecs.wire_values`: float32 as is, float16 rounded).
Greedy, EOS ignored, so every prompt yields `--tokens` tokens in both runs.

Per shard quant (fp32 = "none", int8): over the prompt sets of bench/pipeline.py and bench/wan.py
(`bench/_prompt_sets.py`), how many prompts give identical tokens with a float16 wire as with a
float32 one, the share of token positions identical up to the first divergence
(`token_agreement_*`: tokens before the first divergence / tokens generated; after a divergence
the texts differ and positions no longer compare) and the first divergence step per prompt.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

log = logging.getLogger("bench.wire_dtype")

QUANTS = {"fp32": "none", "int8": "int8"}


def prompts() -> dict[str, list[dict[str, str]]]:
    """bench/pipeline.py's check prompts and speed prompt, and the wan bench's two sets."""
    from bench._prompt_sets import heldout_prompts, repetitive_prompts
    from bench.pipeline import CHECK_PROMPTS, SPEED_PROMPT

    out = {f"check{i}": messages for i, messages in enumerate(CHECK_PROMPTS)}
    out["speed"] = [{"role": "user", "content": SPEED_PROMPT}]
    out.update(heldout_prompts())
    out.update(repetitive_prompts())
    return out


def greedy(head: Any, shards: list[Any], ids: list[int], tokens: int, dtype: str) -> list[int]:
    """`tokens` greedy tokens through `shards`, every boundary as a raw `dtype` frame carries it."""
    import torch

    from protocol.frames.codecs import wire_values

    def wire(hidden: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(wire_values(hidden.numpy(), dtype, "raw"))

    caches = [shard.new_cache() for shard in shards]
    out: list[int] = []
    step, start = list(ids), 0
    with torch.inference_mode():
        while len(out) < tokens:
            hidden = wire(torch.from_numpy(np.asarray(head.embed_np(step), dtype=np.float32)))
            positions = torch.arange(start, start + len(step), dtype=torch.long)
            for shard, cache in zip(shards, caches, strict=True):
                hidden = wire(shard.forward(hidden, positions, cache).float().contiguous())
            token = int(np.argmax(head.logits_np(hidden[0, -1].numpy())))
            out.append(token)
            start += len(step)
            step = [token]
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt (64)")
    parser.add_argument("--quants", default="fp32,int8", help="shard quants (fp32,int8)")
    parser.add_argument("--prompts", type=int, default=0, help="first N prompts (0: all)")
    args = parse_with_quick(parser, {"tokens": 4, "quants": "fp32", "prompts": 1}, argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    from node.verifier.measure import load_circuit

    chosen = list(prompts().items())[: args.prompts or None]
    metrics: dict[str, Any] = {}
    for label in args.quants.split(","):
        circuit = load_circuit(QUANTS[label])
        same = 0
        agreed = 0
        divergences: list[int] = []
        for name, messages in chosen:
            ids = circuit.head.chat_ids(messages)
            exact = greedy(circuit.head, circuit.shards, ids, args.tokens, "float32")
            half = greedy(circuit.head, circuit.shards, ids, args.tokens, "float16")
            step = first_divergence(exact, half)
            log.info("%s %s: first divergence %s", label, name, step)
            same += step is None
            agreed += args.tokens if step is None else step
            divergences.append(args.tokens if step is None else step)
        metrics[f"prompts_identical_{label}"] = same
        metrics[f"prompts_{label}"] = len(chosen)
        metrics[f"token_agreement_{label}"] = round(agreed / (args.tokens * len(chosen)), 4)
        # per prompt, the step of the first different token (`tokens` where none differs)
        metrics[f"first_divergence_steps_{label}"] = divergences
    result = {
        "bench": "wire_dtype",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "parts": 3,
            "tokens": args.tokens,
            "prompts": [name for name, _ in chosen],
            "compared": "float16 vs float32 raw frames at every boundary, greedy, EOS ignored",
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
