"""A compute node's extra cost for commit-reveal: `ServedLog.record` time vs its decode time.

The middle shard (10 layers) of SmolLM2-135M fp32, 3 parts, CPU: a 32-position prompt prefill
then `--positions` − 32 decode steps, one position per forward, exactly what the node's worker
thread does per frame: `ShardModel.forward`, then `ServedLog.record` (fingerprint top-k of the
outputs, a copy of the inputs, and at each completed block of 32 positions: encode, keccak256,
a random salt and one 108-byte spool append). Medians over --repeats.

    .venv/bin/python bench/served.py [--positions 256] [--repeats 3]

Metrics (wall, and `_cpu_` = this thread's CPU time, steadier on a shared box):
decode_ms_per_position (the forward alone, so the fraction is an upper bound of the
node's: its decode also parses and encodes frames and answers HTTP), served_ms_per_position,
served_overhead_fraction (target ≤ 0.02), spool_bytes_per_block, served_bytes_per_position
(memory held for tickets).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread

log = logging.getLogger("bench.served")


def one_run(circuit, ids: list[int], directory: Path) -> dict[str, float]:
    from node.server.served import ServedLog

    head, first, shard = circuit.head, circuit.shards[0], circuit.shards[1]
    with torch.inference_mode():
        hidden0 = first.forward(head.embed(ids), torch.arange(len(ids)), first.new_cache())
    inputs = hidden0.numpy()
    from protocol.frames.sessions import session_tag

    served = ServedLog(directory, shard=1)
    tag = session_tag("bench-served-capability-0001")
    cache = shard.new_cache()
    prompt = 32
    wall = {"decode": 0.0, "served": 0.0}
    cpu = {"decode": 0.0, "served": 0.0}  # this thread's CPU time: steadier on a busy box

    def step(start: int, count: int) -> None:
        chunk = np.ascontiguousarray(inputs[:, start : start + count])
        positions = np.arange(start, start + count)
        began, began_cpu = time.perf_counter(), time.thread_time()
        with torch.inference_mode():
            out = shard.forward(torch.from_numpy(chunk), torch.from_numpy(positions), cache)
        middle, middle_cpu = time.perf_counter(), time.thread_time()
        served.record(tag, chunk, positions, out.numpy())
        wall["decode"] += middle - began
        wall["served"] += time.perf_counter() - middle
        cpu["decode"] += middle_cpu - began_cpu
        cpu["served"] += time.thread_time() - middle_cpu

    step(0, prompt)
    for key in ("decode", "served"):
        wall[key] = cpu[key] = 0.0
    for t in range(prompt, len(ids)):
        step(t, 1)
    decoded = len(ids) - prompt
    stats = served.stats()
    if stats["blocks"] != (len(ids)) // 32:
        raise RuntimeError(f"recorded {stats['blocks']} blocks, expected {len(ids) // 32}")
    spool = sum(p.stat().st_size for p in directory.glob("served-*.bin"))
    return {
        "decode_ms_per_position": 1000 * wall["decode"] / decoded,
        "served_ms_per_position": 1000 * wall["served"] / decoded,
        "decode_cpu_ms_per_position": 1000 * cpu["decode"] / decoded,
        "served_cpu_ms_per_position": 1000 * cpu["served"] / decoded,
        "blocks": int(stats["blocks"]),
        "spool_bytes": spool,
        "served_bytes": int(stats["bytes"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, default=256, help="prompt 32 + decode steps")
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_quick(parser, {"positions": 64, "repeats": 1}, argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if args.positions < 64 or args.positions % 32:
        parser.error("--positions must be a multiple of 32, at least 64")
    load_start = os.getloadavg()[0]
    torch.manual_seed(0)
    from node.server.run import configure_torch_threads

    configure_torch_threads(0)  # what the node uses (half the cores, 1 to 4)

    from node.model.evaluate import heldout_text
    from node.verifier.measure import load_circuit

    circuit = load_circuit("none")
    ids = circuit.head.encode(heldout_text())[: args.positions]
    runs = []
    for index in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="planet-bench-served-") as directory:
            runs.append(one_run(circuit, ids, Path(directory)))
        log.info("repeat %d: %s", index + 1, runs[-1])
    decode = [r["decode_ms_per_position"] for r in runs]
    served = [r["served_ms_per_position"] for r in runs]
    fractions = [s / d for s, d in zip(served, decode, strict=True)]
    cpu_fractions = [
        r["served_cpu_ms_per_position"] / r["decode_cpu_ms_per_position"] for r in runs
    ]
    metrics = {
        "decode_ms_per_position": round(median(decode), 3),
        "served_ms_per_position": round(median(served), 4),
        "served_overhead_fraction": round(median(fractions), 4),
        "served_overhead_fraction_spread": spread(fractions, 4),
        "decode_cpu_ms_per_position": round(
            median([r["decode_cpu_ms_per_position"] for r in runs]), 3
        ),
        "served_cpu_ms_per_position": round(
            median([r["served_cpu_ms_per_position"] for r in runs]), 4
        ),
        "served_overhead_fraction_cpu": round(median(cpu_fractions), 4),
        "served_overhead_fraction_cpu_spread": spread(cpu_fractions, 4),
        "spool_bytes_per_block": round((runs[0]["spool_bytes"] - 8) / runs[0]["blocks"], 1),
        "served_bytes_per_position": round(runs[0]["served_bytes"] / len(ids), 1),
        "blocks": runs[0]["blocks"],
    }
    print(
        json.dumps(
            {
                "bench": "served",
                "machine": {**machine(), "loadavg_1m_at_start": round(load_start, 2)},
                "config": {
                    "model": "smollm2-135m",
                    "shards": 3,
                    "shard": 1,
                    "quant": "none",
                    "positions": len(ids),
                    "prompt": 32,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "threads": torch.get_num_threads(),
                    "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
                },
                "metrics": metrics,
                "targets": {"served_overhead_fraction": {"op": "<=", "value": 0.02}},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
