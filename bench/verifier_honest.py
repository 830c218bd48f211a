"""False positives of the verifier on honest pools, end to end — one JSON object on stdout.

    python bench/verifier_honest.py [--quants none,int8,int4] [--epochs 6] [--challenges 4]

Per quant: a real network (harness/verifier_net.py: anvil + contracts, one CometBFT
validator, three honest staked SmolLM2 nodes over 2 shards of that quant, the gateway,
`planet verifier serve` with the pool's registered manifest as its reference) runs until the
verifier has scored challenges in `--epochs` epochs. Counted: challenges, challenges with
C < 10^6 (false positives), the largest coarsened KL seen, the lowest reputation any honest
node had at any poll (1 s) and polls where one was untrusted.

`--quick` (the smoke run): the int8 pool only, two honest nodes (one per shard), epochs of 5
blocks, challenges of 8 prompt + 4 continuation tokens and 4-token sampled checks, until one
challenge has been scored (its log and the reputations read every 0.2 s, not every second).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from node.procs import exit_process

log = logging.getLogger("bench.verifier_honest")
# --quick: short challenges and sampled checks (the reference writes ~70 ms of CPU per token)
QUICK_VERIFIER_ARGS = (
    "--prompt-tokens",
    "8",
    "--continuation-tokens",
    "4",
    "--sampled-tokens",
    "4",
)
LINE = re.compile(r"challenge epoch=(\d+) circuit=\[[^\]]*\] kl=([0-9.]+) top1=[0-9.]+ C=(\d+)")


def run_pool(
    quant: str,
    epochs: int,
    challenges: int,
    timeout_s: float,
    epoch_blocks: int,
    honest: list[int],
    verifier_args: tuple[str, ...] = (),
    poll_s: float = 1.0,
) -> dict[str, Any]:
    from harness.shard_cache import prepared_manifest
    from harness.verifier_net import VerifierNet

    manifest = prepared_manifest(parts=2, quant=quant)
    with tempfile.TemporaryDirectory(prefix=f"verifier-honest-{quant}-") as tmp:
        net = VerifierNet.start(
            Path(tmp),
            manifest,
            honest=honest,
            challenges=challenges,
            epoch_blocks=epoch_blocks,
            verifier_args=verifier_args,
        )
        try:
            keys = [c.public for c in net.honest]
            lowest, untrusted_polls, polls = 10**6, 0, 0
            deadline = time.monotonic() + timeout_s
            seen: list[tuple[int, float, int]] = []
            while time.monotonic() < deadline:
                net.alive()
                reps = net.reputations()  # every page of /reputations
                for key in keys:
                    record = reps.get(key)
                    if record is not None:
                        lowest = min(lowest, record["r"])
                        untrusted_polls += record["untrusted"]
                polls += 1
                seen = [
                    (int(m[1]), float(m[2]), int(m[3])) for m in LINE.finditer(net.log.read_text())
                ]
                if len({e for e, _, _ in seen}) >= epochs:
                    break
                time.sleep(poll_s)
            applied = {key: record for key, record in net.reputations().items() if key in keys}
        finally:
            net.close()
    return {
        "challenges": len(seen),
        "epochs_challenged": len({e for e, _, _ in seen}),
        "false_positive_challenges": sum(1 for _, _, c in seen if c < 10**6),
        "max_kl": max((k for _, k, _ in seen), default=None),
        "min_reputation": lowest,
        "untrusted_polls": untrusted_polls,
        "polls": polls,
        "epochs_applied_per_node": sorted(r["epochs"] for r in applied.values()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quants", default="none,int8,int4")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--challenges", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pool")
    parser.add_argument("--epoch-blocks", type=int, default=50, help="committee epoch length")
    parser.add_argument(
        "--honest", default="0,1,1", help="the honest nodes' shards (default 0,1,1)"
    )
    quick = {
        "quants": "int8",
        "epochs": 1,
        "challenges": 1,
        "timeout": 300.0,
        "epoch_blocks": 5,
        "honest": "0,1",
    }
    args = parse_with_quick(parser, quick)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    metrics: dict[str, Any] = {}
    short = QUICK_VERIFIER_ARGS if args.quick else ()
    for quant in args.quants.split(","):
        started = time.monotonic()
        honest = [int(shard) for shard in args.honest.split(",")]
        result = run_pool(
            quant,
            args.epochs,
            args.challenges,
            args.timeout,
            args.epoch_blocks,
            honest,
            short,
            poll_s=0.2 if args.quick else 1.0,
        )
        label = {"none": "fp32"}.get(quant, quant)
        for name, value in result.items():
            metrics[f"{name}_{label}"] = value
        metrics[f"run_s_{label}"] = round(time.monotonic() - started, 1)
        log.info("pool %s: %s", quant, result)
    print(
        json.dumps(
            {
                "bench": "verifier_honest",
                "machine": machine(),
                "config": {
                    "model": "smollm2-135m",
                    "shards": 2,
                    "honest_nodes": len(args.honest.split(",")),
                    "honest_shards": args.honest,
                    "epochs": args.epochs,
                    "challenges_per_epoch": args.challenges,
                    "epoch_blocks": args.epoch_blocks,
                    "verifier_args": list(short),
                    "quick": args.quick,
                },
                "metrics": metrics,
                "targets": {
                    f"false_positive_challenges_{q}": {"op": "==", "value": 0}
                    for q in ("fp32", "int8", "int4")
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    exit_process(main)
