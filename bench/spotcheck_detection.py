"""Spot-check detection table: a noisy node is caught at the rate 1 − (1 − p)^n.

Two parts, both on the real protocol code:

1. **Real checks.** SmolLM2-135M, 3 shards in-process. The middle node serves natural text the
   way a node serves users (prompt prefill, then one position per forward) — honestly (fp32 or
   int8) or noisily (`cheats.NoisyShard`: 10 % noise on every k-th position). For every full
   32-position block it served, the node's ticket is built, signed and sealed exactly as on the
   wire (`protocol.tickets`), the verifier opens it and runs `node.verifier.tickets.check_ticket`
   (one-prefill recomputation against the node's commitment, calibrated tolerance). Each block's
   outcome (passed / failed) is recorded.
2. **Many runs of the selection.** A run = a node commits n blocks (distinct random session tags),
   one fresh epoch seed per run; `protocol.spotcheck.select` draws the checked triples at rate p;
   the node is caught when a drawn block's real check failed. The check of a block is
   deterministic (same inputs, same recomputation), so each measured block's outcome is reused
   for the triples mapped to it instead of recomputing it every run.

    .venv/bin/python bench/spotcheck_detection.py [--runs 2000] [--sequences 4] [--out table.json]

Prints one JSON object (BENCHMARKS.md): flat metrics (`detection_rate_<node>_p<ppm>_n<n>`, its
`expected_…`, blocks checked and failed per node, false positives per honest node) and, beside
them, `table`: per (node, p, n) runs, caught, detection rate, expected 1 − (1 − p)^n and the 95 %
interval of a binomial with that mean.

`--quick` (a smoke run): one 64-token text, the fp32 nodes only (noisy every 4th and 32nd,
honest), 20 runs per cell.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from nacl.signing import SigningKey

from bench._common import machine, parse_with_quick
from node.model.evaluate import heldout_text
from node.verifier import cheats
from node.verifier.calibration import load_calibration
from node.verifier.fingerprint import fingerprint_bytes
from node.verifier.measure import load_circuit, serve_trace, text_challenges
from node.verifier.tickets import check_ticket
from protocol.eip712 import commitment_value
from protocol.fingerprint import BLOCK_POSITIONS
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Outcome, Triple, select
from protocol.tickets import TicketRequest, encode_ticket, seal

NODE_KEY = SigningKey(hashlib.sha256(b"bench node").digest())
VERIFIER_KEY = SigningKey(hashlib.sha256(b"bench verifier").digest())
RATES_PPM = (20_000, 50_000, 100_000)
BLOCK_COUNTS = (1, 5, 10, 20, 50, 100)


def block_outcomes(
    served_shard: Any,
    reference_shard: Any,
    inputs: torch.Tensor,
    quant: str,
    prompt: int,
    block_rule_failed: list[bool],
) -> list[Outcome]:
    """Serve `inputs` ([1, T, H], what the middle shard receives) on `served_shard` like a node,
    then check every full block's ticket against `reference_shard` (the verifier's copy)."""
    trace = serve_trace([served_shard], inputs, prompt_len=prompt)
    outputs = trace.outputs[0]
    tolerance = load_calibration().tolerance(quant)
    node = NODE_KEY.verify_key.encode().hex()
    verifier = VERIFIER_KEY.verify_key.encode().hex()
    session = secrets.token_bytes(32)
    outcomes: list[Outcome] = []
    chain = inputs_digests(inputs.numpy())  # the inputs bound into each block's commitment
    for block in range(inputs.shape[1] // BLOCK_POSITIONS):
        start, end = block * BLOCK_POSITIONS, (block + 1) * BLOCK_POSITIONS
        fingerprint = fingerprint_bytes(outputs[:, start:end], start)
        salt = secrets.token_bytes(32)
        bound = served_output_hash(fingerprint, chain[block])
        commitment = commitment_value(session, block, 1, bound, salt)
        plain = encode_ticket(block, salt, fingerprint, inputs[:, :end].numpy())
        request = TicketRequest(
            Triple(node, "0x" + session.hex(), block, 1), "0x" + "00" * 32, verifier
        ).signed(VERIFIER_KEY)
        sealed = seal(plain, request, NODE_KEY)
        result = check_ticket(
            sealed,
            request,
            VERIFIER_KEY,
            shard=reference_shard,
            commitment=commitment,
            tolerance=tolerance,
        )
        outcomes.append(result.outcome)
        block_rule_failed.append(result.verdict is not None and not result.verdict.passed)
    return outcomes


def simulate(
    outcomes: list[Outcome], rate_ppm: int, blocks: int, runs: int, label: str = ""
) -> dict[str, Any]:
    """`runs` runs of `blocks` committed blocks, a fresh seed each; caught: a drawn block failed."""
    node = NODE_KEY.verify_key.encode().hex()
    caught = checked = 0
    for run in range(runs):
        seed = hashlib.sha256(f"{label} run {run} p {rate_ppm} n {blocks}".encode()).digest()
        triples = [
            Triple(node, "0x" + hashlib.sha256(f"{run}/{i}".encode()).hexdigest(), i % 4, 1)
            for i in range(blocks)
        ]
        index = {t: i % len(outcomes) for i, t in enumerate(triples)}
        drawn = select(seed, triples, rate_ppm)
        checked += len(drawn)
        if any(outcomes[index[t]] is Outcome.FAILED for t in drawn):
            caught += 1
    p = rate_ppm / 1e6
    noisy = sum(outcomes[i % len(outcomes)] is Outcome.FAILED for i in range(blocks))
    expected = 1 - (1 - p) ** noisy  # n_noisy = committed blocks whose real check fails
    half = 1.96 * math.sqrt(expected * (1 - expected) / runs)
    return {
        "p": p,
        "n": blocks,
        "n_noisy": noisy,
        "runs": runs,
        "caught": caught,
        "rate": round(caught / runs, 4),
        "expected": round(expected, 4),
        "interval95": [round(max(0.0, expected - half), 4), round(min(1.0, expected + half), 4)],
        "within95": abs(caught / runs - expected) <= half + 1e-12,
        "blocks_checked_per_run": round(checked / runs, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per (p, n) cell")
    parser.add_argument("--sequences", type=int, default=4, help="texts served (4)")
    parser.add_argument(
        "--answer-tokens", type=int, default=100, help="tokens served after a 32-token prompt"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parse_with_quick(parser, {"runs": 20, "sequences": 1, "answer_tokens": 32})
    torch.set_num_threads(1)
    load_start = list(os.getloadavg())
    t0 = time.perf_counter()
    fp32 = load_circuit("none")
    head = fp32.head
    texts = text_challenges(
        head, heldout_text(), count=args.sequences, continuation_tokens=args.answer_tokens
    )
    c = cheats.CHEAT
    nodes = {
        "noisy_every_4th": (cheats.NoisyShard(fp32.shards[1], 0.1, 4, 7, confirm=c), fp32, "none"),
        "noisy_every_16th": (
            cheats.NoisyShard(fp32.shards[1], 0.1, 16, 7, confirm=c),
            fp32,
            "none",
        ),
        "noisy_every_32nd": (
            cheats.NoisyShard(fp32.shards[1], 0.1, 32, 7, confirm=c),
            fp32,
            "none",
        ),
        "honest_fp32": (fp32.shards[1], fp32, "none"),
    }
    if args.quick:
        del nodes["noisy_every_16th"]
    else:
        int8, int4 = load_circuit("int8"), load_circuit("int4")
        nodes["honest_int8"] = (int8.shards[1], int8, "int8")
        nodes["honest_int4"] = (int4.shards[1], int4, "int4")
    measured: dict[str, list[Outcome]] = {name: [] for name in nodes}
    block_rule: dict[str, list[bool]] = {name: [] for name in nodes}
    with torch.inference_mode():
        for text in texts:
            ids = list(text.ids)
            for name, (served, circuit, quant) in nodes.items():
                first = circuit.shards[0]
                embedded = circuit.head.embed(ids)
                inputs = first.forward(embedded, torch.arange(len(ids)), first.new_cache())
                measured[name] += block_outcomes(
                    served, circuit.shards[1], inputs, quant, len(text.prompt_ids), block_rule[name]
                )
    t_checks = time.perf_counter() - t0
    per_node = {
        name: {
            "blocks": len(outs),
            "failed": sum(o is Outcome.FAILED for o in outs),
            "failed_by_block_rule_alone": sum(block_rule[name]),
        }
        for name, outs in measured.items()
    }
    table = [
        {"node": name, **simulate(measured[name], rate, n, args.runs, name)}
        for name in ("noisy_every_4th", "noisy_every_32nd")
        for rate in RATES_PPM
        for n in BLOCK_COUNTS
    ]
    z2 = [
        (row["rate"] - row["expected"]) ** 2
        / (row["expected"] * (1 - row["expected"]) / row["runs"])
        for row in table
        if 0 < row["expected"] < 1
    ]
    false_positives = {
        name: simulate(measured[name], 50_000, 100, args.runs, name)["caught"]
        for name in nodes
        if name.startswith("honest_")
    }
    flat: dict[str, Any] = {}
    for name, counts in per_node.items():
        flat[f"blocks_checked_{name}"] = counts["blocks"]
        flat[f"blocks_failed_{name}"] = counts["failed"]
        flat[f"blocks_failed_by_block_rule_alone_{name}"] = counts["failed_by_block_rule_alone"]
    for row in table:
        cell = f"{row['node']}_p{round(row['p'] * 1e6)}_n{row['n']}"
        flat[f"detection_rate_{cell}"] = row["rate"]
        flat[f"expected_detection_rate_{cell}"] = row["expected"]
    for name, caught in false_positives.items():
        flat[f"false_positive_runs_p5_n100_{name}"] = caught
    result = {
        "bench": "spotcheck_detection",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "shards": 3,
            "checked_shard": 1,
            "noise": "10 % of the position's RMS on every k-th position",
            "sequences": args.sequences,
            "answer_tokens": args.answer_tokens,
            "nodes": list(nodes),
            "runs_per_cell": args.runs,
            "quick": args.quick,
            "command": ".venv/bin/python bench/spotcheck_detection.py " + " ".join(sys.argv[1:]),
            "loadavg_start": load_start,
        },
        "metrics": {
            **flat,
            "cells_within_95pct": sum(row["within95"] for row in table),
            "cells": len(table),
            "sum_z2": round(sum(z2), 1),
            "sum_z2_cells": len(z2),
            "real_checks_s": round(t_checks, 1),
            "total_s": round(time.perf_counter() - t0, 1),
            "loadavg_end": list(os.getloadavg()),
        },
        "targets": {"detection_rate": {"op": "~=", "value": "1 - (1 - p)^n"}},
        "table": table,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
