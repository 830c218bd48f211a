"""Calibrate the echo path: the coarsened KL a verifier measures through `/v1/completions` echo.

    python -m node.verifier.calibrate_echo [--challenges 6] [--continuation 64]
        # adds "echo_map" (+ "echo_gaps", "echo_simulation") to node/verifier/calibration.json

The same circuits as `calibrate` (honest fp32 / int8 / int4; layers skipped, truncated depth,
int4 weights with 2 % noise, 10 % noise on every 4th position of the middle shard), scored
the way the gateway answers (float64 log-softmax of the circuit's logits, the true token and
the top-5 per position: `echo.simulated_answer`) against the fp32 reference (`echo.echo_gap`).
The map is chosen by the same rule as the full-vocabulary one (`calibrate.choose_map`):
full credit up to 2 × the largest honest KL_S, zero from the smallest substitute KL_S.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from node.verifier.calibrate import (
    DEFAULT_OUT,
    HONEST,
    QUANT_OF,
    choose_map,
    noisy_int4,
    simulate,
    substitutes,
)
from node.verifier.echo import echo_gap, simulated_answer
from node.verifier.measure import load_circuit, run_prefill, text_challenges
from node.verifier.scoring import Gap

log = logging.getLogger(__name__)


def measure(count: int, prompt_tokens: int, continuation: int) -> dict[str, list[Gap]]:
    from node.model.evaluate import heldout_text

    circuits = {name: load_circuit(QUANT_OF[name]) for name in HONEST}
    head = circuits["fp32"].head
    shards = {name: c.shards for name, c in circuits.items()}
    shards.update(substitutes(circuits["fp32"], noisy_int4()))
    challenges = text_challenges(
        head,
        heldout_text(),
        count=count,
        prompt_tokens=prompt_tokens,
        continuation_tokens=continuation,
    )
    gaps: dict[str, list[Gap]] = {name: [] for name in shards}
    for index, challenge in enumerate(challenges):
        ids = challenge.ids
        reference = head.all_logits(run_prefill(shards["fp32"], head.embed(ids)))
        for name, circuit in shards.items():
            logits = (
                reference
                if name == "fp32"
                else head.all_logits(run_prefill(circuit, head.embed(ids)))
            )
            gaps[name].append(echo_gap(challenge, simulated_answer(challenge, logits), reference))
        log.info("challenge %d/%d scored", index + 1, count)
    return gaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.verifier.calibrate_echo")
    parser.add_argument("--challenges", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--continuation", type=int, default=64)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    started = time.perf_counter()
    gaps = measure(args.challenges, args.prompt, args.continuation)
    mapping = choose_map(gaps)
    table: dict[str, Any] = json.loads(args.out.read_text(encoding="utf-8"))
    table["echo_map"] = {
        "full_micro": mapping.full_micro,
        "zero_micro": mapping.zero_micro,
        "metric": "mean KL over {true token} ∪ top-5 ∪ {rest} per continuation token "
        "(the gateway's echo + logprobs 5), micro-nats",
        "challenges": {
            "count": args.challenges,
            "prompt_tokens": args.prompt,
            "continuation_tokens": args.continuation,
        },
        "command": "python -m node.verifier.calibrate_echo " + " ".join(argv or sys.argv[1:]),
        "measure_s": round(time.perf_counter() - started, 1),
    }
    table["echo_gaps"] = {
        name: {
            "kl": [round(g.kl, 6) for g in gs],
            "nll_gap": [round(g.nll_gap, 5) for g in gs],
            "top1": [round(g.top1, 2) for g in gs],
            "credibility": [mapping.credibility(g) for g in gs],
        }
        for name, gs in gaps.items()
    }
    table["echo_simulation"] = simulate(gaps, mapping)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps(table["echo_map"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
