"""Concurrency sweep: 1 / 8 / 32 sessions at once through one 3-node SmolLM2 circuit on CPU —
aggregate decode tok/s and p99 inter-token time — one JSON object on stdout, logs on stderr.

    .venv/bin/python bench/concurrency.py     # sessions 1,8,32; 16 new tokens each
    .venv/bin/python bench/concurrency.py --sessions 1,8 --new-tokens 8
    .venv/bin/python bench/concurrency.py --quick  # 2 shards, sessions 1,2 × 4 tokens, no warm-up,
                                                   # the cached shards (each node checks its hash)

Real node processes (started as `planet local up` starts them, via node/server/launcher.py) on
loopback ports picked free at start, driven by the real CircuitClient (node-to-node forwarding,
one WebSocket per link): every session is
one `generate` call, all sessions of a sweep point run concurrently on one event loop over the
same links (so all come from one client address: the nodes are started with per-peer quotas
raised to the sweep's largest point, otherwise the node's default of 16 sessions per peer would
answer `busy`). Decode steps of sessions that reach a shard together run as one batched forward
(node/server/batcher.py); the nodes' batch statistics are reported.
A failed session fails the run (its error is logged and counted in `failed_sessions_<n>`).

Aggregate rate = tokens decoded after each session's first token, summed over sessions, over
the wall time from the first session's first token to the last session's last token.
Inter-token time = gap between consecutive tokens of one session (all sessions pooled).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

log = logging.getLogger("bench.concurrency")

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain in a few sentences how a bicycle works.",
    "List three fruits and say what colour each one is.",
    "What makes a good cup of tea?",
)
PORTS = (20800, 21000)
# The GPU sweep (a Llama-3-8B-shaped model with random weights, bf16 and int4, 4 shards
# on one GPU): bench/gpu_sweep.py.
GPU_COMMAND = (
    ".venv/bin/python bench/gpu_sweep.py --quants bf16,int8,int4 --sessions 32 --new-tokens 64"
)


async def _session(client: Any, head: Any, ids: list[int], new_tokens: int) -> list[float]:
    """Timestamps of each generated token of one session."""
    stamps: list[float] = []
    async for _token in client.generate(head, ids, max_new_tokens=new_tokens, stop_on_eos=False):
        stamps.append(time.perf_counter())
    return stamps


async def sweep_point(hops: list[Any], head: Any, sessions: int, new_tokens: int) -> dict[str, Any]:
    from node.client.circuit import CircuitClient

    prompts = [
        head.chat_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        for i in range(sessions)
    ]
    client = CircuitClient(hops, hidden_size=head.hidden_size, request_timeout_s=600.0)
    async with client:
        results = await asyncio.gather(
            *(_session(client, head, ids, new_tokens) for ids in prompts),
            return_exceptions=True,
        )
    failed = [r for r in results if isinstance(r, BaseException)]
    for error in failed[:3]:
        log.error("session failed: %r", error)
    stamps = [r for r in results if not isinstance(r, BaseException)]
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s)]
    decoded = sum(len(s) - 1 for s in stamps)
    window = max(s[-1] for s in stamps) - min(s[0] for s in stamps) if stamps else 0.0
    return {
        "failed": len(failed),
        "tok_s": decoded / window if window > 0 else 0.0,
        "p50_ms": float(np.percentile(gaps, 50) * 1000) if gaps else 0.0,
        "p99_ms": float(np.percentile(gaps, 99) * 1000) if gaps else 0.0,
        "wall_s": window,
    }


def _batch_stats(hops: list[Any]) -> tuple[int, int]:
    """(forward calls, rows computed) summed over the nodes' /info."""
    import json
    import urllib.request

    batches = rows = 0
    for hop in hops:
        with urllib.request.urlopen(f"{hop.url}/info", timeout=10) as answer:
            load = json.loads(answer.read())["load"]
        batches += int(load["batches"])
        rows += int(load["batched_rows"])
    return batches, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,8,32", help="sweep points (default 1,8,32)")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens per session (16)")
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument("--model", default="default", help="'default' or a local HF directory")
    parser.add_argument("--quant", default="none", help="none, int8 or int4 shards")
    parser.add_argument("--device", default="cpu", help="nodes' device: cpu (default) or cuda")
    parser.add_argument(
        "--warm-ups", type=int, default=1, help="one 4-token session first, untimed (1)"
    )
    # --quick: the smallest circuit that forwards node to node (2 shards), no warm-up
    args = parse_with_quick(
        parser, {"sessions": "1,2", "new_tokens": 4, "parts": 2, "warm_ups": 0}, argv
    )
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    points = [int(p) for p in args.sessions.split(",")]

    from node.client.types import Hop
    from node.model.head import ClientHead
    from node.model.prepare import prepare
    from node.server.launcher import free_ports, start_node, stop_pid, wait_healthy
    from node.server.run import configure_torch_threads

    configure_torch_threads(0)
    load_start = [round(x, 2) for x in __import__("os").getloadavg()]
    most = max(points)
    quota = [
        "--max-sessions", str(max(64, 2 * most)),
        "--max-sessions-per-peer", str(2 * most),
        "--max-inflight-per-peer", str(2 * most),
        "--max-cache-mb-per-peer", "2048",
        "--max-batch", str(max(1, most)),
        "--device", args.device,
    ]  # fmt: skip
    if args.quick and args.model == "default":  # the cached shards, not hashed here first:
        from harness.shard_cache import prepared_manifest  # each node checks its shard's hash

        manifest = prepared_manifest(parts=args.parts, quant=args.quant)
    else:
        manifest = Path(
            prepare(
                model=args.model,
                parts=args.parts,
                quant=args.quant,
                progress=lambda m: log.info(m),
            )
        )
    run_dir = Path(tempfile.mkdtemp(prefix="planet-bench-conc-"))
    ports = free_ports(args.parts, *PORTS)
    quota += ["--next-hops", ",".join(f"http://127.0.0.1:{port}" for port in ports)]
    nodes = [
        start_node(manifest=manifest, shard=k, port=port, run_dir=run_dir, extra_args=quota)
        for k, port in enumerate(ports)
    ]
    metrics: dict[str, Any] = {}
    try:
        wait_healthy(nodes, timeout_s=300)
        head = ClientHead.load(manifest, device="cpu")
        hops = [Hop(url=n.url, shard=n.shard) for n in nodes]
        for _ in range(args.warm_ups):
            asyncio.run(sweep_point(hops, head, 1, 4))
        for n in points:
            log.info("%d concurrent sessions x %d tokens", n, args.new_tokens)
            before = _batch_stats(hops)
            result = asyncio.run(sweep_point(hops, head, n, args.new_tokens))
            after = _batch_stats(hops)
            batches = after[0] - before[0]
            metrics[f"mean_batch_rows_sessions_{n}"] = (
                round((after[1] - before[1]) / batches, 2) if batches else 0.0
            )
            log.info("  %s", {k: round(v, 2) for k, v in result.items()})
            metrics[f"decode_tok_s_sessions_{n}"] = round(result["tok_s"], 2)
            metrics[f"p50_inter_token_ms_sessions_{n}"] = round(result["p50_ms"], 1)
            metrics[f"p99_inter_token_ms_sessions_{n}"] = round(result["p99_ms"], 1)
            metrics[f"failed_sessions_{n}"] = result["failed"]
        if 1 in points and most > 1 and metrics["decode_tok_s_sessions_1"] > 0:
            metrics[f"ratio_aggregate_{most}_vs_1"] = round(
                metrics[f"decode_tok_s_sessions_{most}"] / metrics["decode_tok_s_sessions_1"], 3
            )
    finally:
        for node in nodes:
            stop_pid(node.pid)
    body = {
        "bench": "concurrency",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m" if args.model == "default" else args.model,
            "quant": args.quant,
            "device": args.device,
            "parts": args.parts,
            "sessions": points,
            "quick": args.quick,
            "new_tokens_per_session": args.new_tokens,
            "warm_ups": args.warm_ups,
            "codec": "raw",
            "loadavg_start": load_start,
            "loadavg_end": [round(x, 2) for x in __import__("os").getloadavg()],
            "node_flags": quota,
            "client": "one CircuitClient, all sessions on one event loop (one peer address)",
            "note": "shared 2-core box under load from other engineers; absolute rates noisy",
            "gpu_sweep_command": GPU_COMMAND,
            "gpu_sweep_status": "not run here: no GPU lent to this task",
        },
        "metrics": metrics,
        "targets": {f"failed_sessions_{n}": {"op": "==", "value": 0} for n in points}
        | {"ratio_aggregate_32_vs_1": {"op": ">=", "value": 10.0, "device": "cuda"}},
    }
    print(__import__("json").dumps(body))
    return 0 if all(metrics.get(f"failed_sessions_{n}", 1) == 0 for n in points) else 1


if __name__ == "__main__":
    sys.exit(main())
