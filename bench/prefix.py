"""Prefix cache: first-token time and prefill compute of a question behind a shared system prompt,
served from the node's prefix cache (hit) vs computed whole (cold), and the hit rate of a
workload of several system prompts (issue 44, node/server/prefix_cache.py).

    python bench/prefix.py --quick     # smoke run: a 200-token system prompt, 1 repeat, a
                                       # workload of 2 prompts × 2 turns (≤ 20 s on a quiet box)
    python bench/prefix.py             # 200- and 1,000-token system prompts, medians of 5
                                       # interleaved repeats, 8 prompts × 6 turns

The 3 shards of the SmolLM2-135M fp32 circuit (the prepared cache) run in this process through
the node's own code: `ModelShardBackend` (what a node computes with) and one `PrefixCache` per
shard (what the node's batcher calls for a prefill), with the client head's embedding and greedy
logits around them, as a circuit does without its network hops. First token = the prompt's
prefill through the 3 shards + the head's logits. "cold": the backends alone; "hit": the caches
hold the system prompt (an earlier question with another user turn filled them). Each repeat
runs cold and hit of the same question back to back, so the machine's noise hits both alike.

Prints one BENCHMARKS.md-shaped JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, median, parse_with_quick, spread
from node.procs import exit_process

log = logging.getLogger("bench.prefix")
QUESTIONS = (
    " What is the capital of France?",
    " Name three primary colours.",
    " How many legs does a spider have?",
    " Translate 'good morning' into Spanish.",
    " Why is the sky blue?",
    " Give me a word that rhymes with light.",
    " What is seven times eight?",
    " Who wrote Romeo and Juliet?",
)
CACHE_BYTES = 256 * 1024**2


def system_text(index: int) -> str:
    """A long, distinct system prompt (numbered rules; `index` varies its persona and wording)."""
    personas = ("librarian", "chemist", "pilot", "gardener", "judge", "chef", "sailor", "poet")
    persona = personas[index % len(personas)]
    rules = " ".join(
        f"Rule {n}: as a {persona} you answer question {n * (index + 3)} carefully, cite "
        f"source {n + index} when you can, and never invent fact number {n * 7 + index}."
        for n in range(1, 60)
    )
    return f"You are assistant {index}, a patient {persona}. {rules}"


class Circuit:
    """The 3 shards in process, each with the node's prefix cache."""

    def __init__(self) -> None:
        from harness.shard_cache import prepared_manifest
        from node.model.head import ClientHead
        from node.model.manifest import Manifest
        from node.server.backend import ModelShardBackend
        from node.server.prefix_cache import PrefixCache

        manifest = prepared_manifest(parts=3, quant="none")
        self.head = ClientHead.load(manifest, device="cpu")
        shards = [s.shard_id for s in Manifest.load(manifest).shards]
        self.shards = [ModelShardBackend(manifest, k, "cpu") for k in shards]
        self.caches = [PrefixCache(s, CACHE_BYTES) for s in self.shards]

    def first_token(self, ids: list[int], *, cached: bool) -> tuple[float, int, int]:
        """(seconds to the first token, positions the first hop computed, the token)."""
        import numpy as np

        t0 = time.perf_counter()
        hidden = self.head.embed_np(ids).reshape(1, len(ids), -1)
        before = self.caches[0].stats.hit_positions
        for shard, prefix in zip(self.shards, self.caches, strict=True):
            cache = shard.new_cache()
            if cached:
                hidden = prefix.forward(prefix.chain(), hidden, 0, cache)
            else:
                hidden = shard.forward(hidden, np.arange(len(ids), dtype=np.int64), cache)
        token = int(np.argmax(self.head.logits_np(hidden[0, -1])))
        seconds = time.perf_counter() - t0
        reused = self.caches[0].stats.hit_positions - before
        return seconds, len(ids) - reused, token


def measure_length(circuit: Circuit, length: int, repeats: int) -> dict[str, Any]:
    """Cold vs hit first token behind a `length`-token system prompt."""
    system = circuit.head.encode(system_text(0))[:length]
    if len(system) < length:
        raise SystemExit(f"error: the system prompt has only {len(system)} tokens")
    circuit.first_token(system + circuit.head.encode(QUESTIONS[-1]), cached=True)  # fills
    cold: list[float] = []
    hit: list[float] = []
    computed: dict[str, int] = {}
    same = True
    for repeat in range(repeats):
        ids = system + circuit.head.encode(QUESTIONS[repeat % (len(QUESTIONS) - 1)])
        cold_s, computed["cold"], cold_token = circuit.first_token(ids, cached=False)
        hit_s, computed["hit"], hit_token = circuit.first_token(ids, cached=True)
        cold.append(cold_s * 1000)
        hit.append(hit_s * 1000)
        same = same and cold_token == hit_token
        log.info("L=%d repeat %d: cold %.0f ms, hit %.0f ms", length, repeat, cold[-1], hit[-1])
    out: dict[str, Any] = {
        f"first_token_ms_cold_{length}": round(median(cold), 1),
        f"first_token_ms_hit_{length}": round(median(hit), 1),
        f"ratio_first_token_hit_vs_cold_{length}": round(median(hit) / median(cold), 3),
        f"prefill_positions_cold_{length}": computed["cold"],
        f"prefill_positions_hit_{length}": computed["hit"],
        f"ratio_prefill_positions_hit_vs_cold_{length}": round(
            computed["hit"] / computed["cold"], 3
        ),
        f"first_token_identical_{length}": int(same),
    }
    if repeats > 1:
        out[f"first_token_ms_cold_{length}_spread"] = spread(cold, 1)
        out[f"first_token_ms_hit_{length}_spread"] = spread(hit, 1)
    return out


def measure_workload(circuit: Circuit, prompts: int, turns: int, length: int) -> dict[str, Any]:
    """`prompts` system prompts × `turns` random user questions each, in random order, all through
    the same caches (fresh ones): hit rate and memory held."""
    from node.server.prefix_cache import PrefixCache

    circuit.caches = [PrefixCache(s, CACHE_BYTES) for s in circuit.shards]
    systems = [circuit.head.encode(system_text(k))[:length] for k in range(prompts)]
    rng = random.Random(44)
    order = [k for k in range(prompts) for _ in range(turns)]
    rng.shuffle(order)
    positions = 0
    for k in order:
        ids = systems[k] + circuit.head.encode(rng.choice(QUESTIONS))
        circuit.first_token(ids, cached=True)
        positions += len(ids)
    stats = circuit.caches[0].stats
    return {
        "workload_questions": len(order),
        "workload_hit_rate_positions": round(stats.hit_positions / positions, 3),
        "workload_hit_rate_questions": round(stats.hit_frames / len(order), 3),
        "workload_cache_bytes_first_shard": circuit.caches[0].bytes,
        "workload_cache_bytes_all_shards": sum(c.bytes for c in circuit.caches),
        "workload_cache_blocks_first_shard": len(circuit.caches[0]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="200,1000", help="system prompt tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8, help="workload: system prompts")
    parser.add_argument("--turns", type=int, default=6, help="workload: questions per prompt")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: a shared box)"
    )
    quick = {"lengths": "200", "repeats": 1, "prompts": 2, "turns": 2}
    args = parse_with_quick(parser, quick, argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    import torch

    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",") if n]
    t0 = time.perf_counter()
    circuit = Circuit()
    metrics: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 2)}
    for length in lengths:
        metrics.update(measure_length(circuit, length, args.repeats))
    metrics.update(measure_workload(circuit, args.prompts, args.turns, lengths[0]))
    metrics["prefix_block_bytes_first_shard"] = circuit.caches[0].block_bytes
    result = {
        "bench": "prefix",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "parts": 3,
            "quant": "none",
            "in_process": True,
            "lengths": lengths,
            "repeats": args.repeats,
            "workload": f"{args.prompts} system prompts x {args.turns} turns",
            "block_positions": circuit.caches[0].block,
            "threads": args.threads,
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "ratio_first_token_hit_vs_cold_1000": {"op": "<=", "value": 0.3},
            "first_token_identical_1000": {"op": "==", "value": 1},
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_process(main)
