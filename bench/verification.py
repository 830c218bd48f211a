"""Verification benchmark: one-pass teacher-forced challenges vs one request per answer token,
fingerprint size, spot-check cost, and a node's cost of fingerprinting — one JSON object on
stdout, logs on stderr.

    .venv/bin/python bench/verification.py            # 3 repeats
    .venv/bin/python bench/verification.py --quick    # a smoke run: 16-token answer, 64 served
                                                      # positions, 1 repeat, no warm-up; fp32
                                                      # stands in for int8 in the sampled check
                                                      # (honest and one layer skipped, 8
                                                      # tokens) and the epoch (1 challenge, 1
                                                      # node)

One challenge = a 32-token natural prompt + a 100-token answer (held-out text), SmolLM2-135M,
3 fp32 shards in this process (no HTTP: both methods would pay the same hops per request, so
leaving them out favours the per-token method).

- one pass (ours): the circuit runs prompt + answer as ONE prefill, the verifier runs its own
  reference over the same ids in ONE pass and compares (KL per token, `node.verifier.scoring`).
  `verifications_per_min_one_pass` counts both sides (the nodes' prefill and the verifier's
  pass, as the per-token figure counts the nodes' 100 requests); `…_verifier_side` counts only
  the verifier's own pass and comparison. `ratio_…_reference_reused`: the same ratio when the
  verifier's reference for a challenge is computed once and reused for several nodes (one
  pass's cost is then the circuit's prefill alone).
- per token (PlanetServe's reference code): one completion request per answer token, each a
  stateless prefill of prompt + answer[:i] returning top-50 logprobs, plus the same reference
  pass. By default 10 of the 100 requests are timed (i = 5, 15, …, 95, whose lengths average
  the same as all 100) and their sum is multiplied by 10; `--full-per-token` times all 100.
- spot check: a node serves 128 positions (prompt prefill + one position per forward) on its
  middle shard; the verifier recomputes the block [96, 128) from the ticket's inputs in one
  prefill of 128 positions. Cost per checked position vs serving cost per position.
- fingerprint overhead: the node's `FingerprintRecorder.add` time over its decode steps.
- the same ratio with a 200-token answer (`ratio_one_pass_vs_per_token_answer_200`): the
  per-token method's cost grows with the square of the answer, one pass's linearly; with both
  sides counted the ratio is bounded by token counts near answer/2 (50× for 100 tokens).
- seed-synchronised sampling (node/verifier/sampled.py): the registered model is int8; each
  served circuit — honest int8, int4 (where int8 is registered), one layer skipped (layer 15 of
  30), 10 % noise on every 4th position — samples `--sampled-tokens` tokens at temperature 1
  from `--sampled-runs` prompts, each with its own seed, one position per forward as a node
  serves; the verifier replays the seed on its int8 reference (one pass). Per circuit and n
  tokens observed: `sampled_detection_<circuit>_<n>` = share of runs whose first n tokens have
  more mismatches than `SampledMap` allows (honest: the false-positive rate), and
  `sampled_mismatch_per_mille_<circuit>` over all positions.
- verifier CPU per epoch (`verifier_cpu_s_per_epoch`): 3 echo challenges (their text written by
  the reference from the seed, 3 reference passes), 1 sampled check, and the spot checks of 3
  nodes at the floor rate (one 128-position shard prefill each), measured in this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, spread

log = logging.getLogger("bench.verification")

PER_TOKEN_SAMPLE = 10
SPOT_CHECK_RATE = 0.05  # share of a node's layer batches spot-checked (DESIGN.md default)
SAMPLED_CHECKPOINTS = (8, 16, 32, 64, 128, 256)  # tokens observed
EPOCH_CHALLENGES = 3
EPOCH_NODES = 3  # spot-checked once each at the floor rate


def one_pass(circuit, challenge) -> tuple[float, float, float]:
    """(wall seconds for the whole verification, wall seconds of it on the verifier's side,
    CPU seconds of this process for the whole verification)."""
    from node.verifier.measure import run_prefill
    from node.verifier.scoring import compare_logits

    head = circuit.head
    cpu = time.process_time()
    started = time.perf_counter()
    ids = challenge.ids
    served = head.all_logits(run_prefill(circuit.shards, head.embed(ids)))  # the circuit's side
    middle = time.perf_counter()
    reference = head.all_logits(run_prefill(circuit.shards, head.embed(ids)))  # the verifier's
    compare_logits(challenge, served, reference)
    ended = time.perf_counter()
    return ended - started, ended - middle, time.process_time() - cpu


def sampled_steps(count: int, sample: int = PER_TOKEN_SAMPLE) -> list[int]:
    """The answer prefixes timed of `count`, about `sample` of them evenly spread (i = 5, 15,
    …, 95 of 100: their lengths average the same as all of them)."""
    stride = max(1, count // sample)
    return list(range(min(5, count - 1), count, stride))


def per_token(
    circuit, challenge, full: bool, sample: int = PER_TOKEN_SAMPLE
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one verification the per-token way (sampled requests
    scaled to all of them unless `full`)."""
    from node.verifier.measure import run_prefill

    head = circuit.head
    prompt = list(challenge.prompt_ids)
    answer = list(challenge.continuation_ids)
    count = len(answer)
    steps = list(range(count)) if full else sampled_steps(count, sample)
    cpu = time.process_time()
    started = time.perf_counter()
    for i in steps:
        ids = prompt + answer[:i]
        logits = head.logits(run_prefill(circuit.shards, head.embed(ids)))
        torch.topk(torch.log_softmax(logits, -1), 50)
    requests = time.perf_counter() - started
    requests_cpu = time.process_time() - cpu
    cpu = time.process_time()
    started = time.perf_counter()
    head.all_logits(run_prefill(circuit.shards, head.embed(prompt + answer)))  # reference
    reference = time.perf_counter() - started
    reference_cpu = time.process_time() - cpu
    scale = count / len(steps)
    return requests * scale + reference, requests_cpu * scale + reference_cpu


@torch.inference_mode()
def serving_and_spot_check(circuit, ids: list[int]) -> dict[str, float]:
    from node.verifier.fingerprint import FingerprintRecorder

    head = circuit.head
    shard = circuit.shards[1]
    first = circuit.shards[0]
    hidden0 = first.forward(head.embed(ids), torch.arange(len(ids)), first.new_cache())
    prompt = 32
    cache = shard.new_cache()
    recorder = FingerprintRecorder()
    inputs = [hidden0[:, :prompt]]
    out = shard.forward(hidden0[:, :prompt], torch.arange(prompt), cache)
    recorder.add(out, torch.arange(prompt))
    decode_s = fingerprint_s = 0.0
    for t in range(prompt, len(ids)):
        step = hidden0[:, t : t + 1]
        inputs.append(step)
        started = time.perf_counter()
        out = shard.forward(step, torch.tensor([t]), cache)
        middle = time.perf_counter()
        recorder.add(out, torch.tensor([t]))
        fingerprint_s += time.perf_counter() - middle
        decode_s += middle - started
    decoded = len(ids) - prompt
    recorded = torch.cat(inputs, dim=1)
    started = time.perf_counter()
    shard.forward(recorded, torch.arange(len(ids)), shard.new_cache())
    recompute_s = time.perf_counter() - started
    checked = 32
    return {
        "decode_ms_per_position": 1000 * decode_s / decoded,
        "fingerprint_ms_per_position": 1000 * fingerprint_s / decoded,
        "recompute_ms_per_checked_position": 1000 * recompute_s / checked,
        "blocks": len(recorder.blocks),
        "block_bytes": len(recorder.blocks[0]),
    }


@torch.inference_mode()
def sample_served(circuit, shards, prompt: list[int], tokens: int, seed: int) -> list[int]:
    """What a circuit with `shards` samples as nodes serve (prompt prefill, then one position
    per forward) and the gateway samples (one seeded generator per answer, temperature 1)."""
    from node.client.sampling import SamplingConfig, sample

    head = circuit.head
    config = SamplingConfig(1.0, 1.0, seed)
    rng = config.rng()
    caches = [shard.new_cache() for shard in shards]
    hidden, positions, out = head.embed(prompt), torch.arange(len(prompt)), []
    for _ in range(tokens):
        for shard, cache in zip(shards, caches, strict=True):
            hidden = shard.forward(hidden, positions, cache)
        logits = head.all_logits(hidden[:, -1:])[-1].to(torch.float32).numpy()
        token = sample(logits, config, rng)
        out.append(token)
        hidden = head.embed([token])
        positions = torch.tensor([len(prompt) + len(out) - 1])
    return out


def sampled_detection(reference, served: dict, prompts, tokens: int) -> dict[str, float]:
    """Detection rate vs tokens observed for each served circuit (module docstring)."""
    from node.client.sampling import SamplingConfig
    from node.verifier.measure import run_prefill
    from node.verifier.sampled import SampledAnswer, SampledMap, replay, sampling_seed

    head, scores = reference.head, SampledMap()
    stops = frozenset(head.eos_token_ids)
    metrics: dict[str, float] = {}
    for name, shards in served.items():
        checks = []
        for run, prompt in enumerate(prompts):
            seed = sampling_seed(b"bench-sampled".ljust(32, b"\0"), 1, run)
            answer = sample_served(reference, shards, list(prompt), tokens, seed)
            logits = head.all_logits(run_prefill(reference.shards, head.embed([*prompt, *answer])))
            config = SamplingConfig(1.0, 1.0, seed)
            check = replay(logits, len(prompt), SampledAnswer(tuple(answer), False), config, stops)
            checks.append(check)
            log.info("sampled %s run %d: %d of %d mismatched", name, run, check.mismatched, tokens)
        for n in (n for n in SAMPLED_CHECKPOINTS if n <= tokens):
            caught = sum(scores.credibility(c.first(n)) != 1_000_000 for c in checks)
            metrics[f"sampled_detection_{name}_{n}"] = round(caught / len(checks), 3)
        mismatched = sum(c.mismatched for c in checks)
        metrics[f"sampled_mismatch_per_mille_{name}"] = round(
            1000 * mismatched / (tokens * len(checks)), 1
        )
    return metrics


@torch.inference_mode()
def verifier_cpu_per_epoch(
    reference,
    challenges,
    count: int = EPOCH_CHALLENGES,
    nodes: int = EPOCH_NODES,
    window: tuple[int, int] = (32, 64),
) -> dict[str, float]:
    """CPU seconds of one verifier's epoch (module docstring), by part."""
    from node.client.sampling import SamplingConfig
    from node.verifier.challenges import generated_text, text_length
    from node.verifier.echo import vocabulary_index
    from node.verifier.measure import run_prefill
    from node.verifier.sampled import SampledAnswer, replay

    class Model:  # the Reference shape generated_text drives
        head, shards = reference.head, reference.shards
        vocab = vocabulary_index(
            [str(reference.head.tokenizer.decode([t])) for t in range(reference.head.vocab_size)]
        )

    def cpu(action) -> float:
        started = time.process_time()
        action()
        return time.process_time() - started

    length = text_length(count, *window)
    text_s = cpu(lambda: generated_text(Model, b"\x05" * 32, 1, length))
    head, shards = reference.head, reference.shards
    echo_s = cpu(
        lambda: [
            head.all_logits(run_prefill(shards, head.embed(list(c.ids[:96]))))
            for c in challenges[:count]
        ]
    )
    ids = list(challenges[0].ids[:64])
    config = SamplingConfig(1.0, 1.0, 7)
    answer = SampledAnswer(tuple(ids[32:]), False)
    sampled_s = cpu(
        lambda: replay(
            head.all_logits(run_prefill(shards, head.embed(ids))), 32, answer, config, frozenset()
        )
    )
    middle = shards[1]
    hidden = torch.randn(1, 128, head.hidden_size)
    spot_s = cpu(
        lambda: [
            middle.forward(hidden, torch.arange(128), middle.new_cache()) for _ in range(nodes)
        ]
    )
    return {
        "verifier_cpu_s_per_epoch": round(text_s + echo_s + sampled_s + spot_s, 2),
        "verifier_cpu_s_per_epoch_challenge_text": round(text_s, 2),
        "verifier_cpu_s_per_epoch_echo": round(echo_s, 2),
        "verifier_cpu_s_per_epoch_sampled": round(sampled_s, 2),
        "verifier_cpu_s_per_epoch_spot_checks": round(spot_s, 2),
    }


def sampled_and_epoch(args: argparse.Namespace, challenges, registered) -> dict[str, float]:
    """The sampled-detection table and the verifier's CPU per epoch, on the registered model
    (int8; --quick: the fp32 circuit already loaded, the honest and the skipping circuit only,
    one challenge and one node per epoch)."""
    from node.model.evaluate import heldout_text
    from node.verifier import cheats
    from node.verifier.measure import load_circuit

    honest = "honest_fp32" if args.quick else "honest_int8"
    served = {
        honest: registered.shards,
        **({} if args.quick else {"int4_for_int8": load_circuit("int4").shards}),
        "skip_one_layer": [
            registered.shards[0],
            cheats.drop_layer(registered.shards[1], 5, confirm=cheats.CHEAT),
            registered.shards[2],
        ],
        "noise_every_4th": [
            registered.shards[0],
            cheats.NoisyShard(registered.shards[1], 0.1, 4, seed=1, confirm=cheats.CHEAT),
            registered.shards[2],
        ],
    }
    if args.quick:
        del served["noise_every_4th"]
    ids = registered.head.encode(heldout_text())
    step = max(1, (len(ids) - 32) // max(1, args.sampled_runs))
    prompts = [tuple(ids[i * step : i * step + 32]) for i in range(args.sampled_runs)]
    metrics = sampled_detection(registered, served, prompts, args.sampled_tokens)
    if args.quick:  # one challenge of a 16-token text, one node
        metrics.update(verifier_cpu_per_epoch(registered, challenges, 1, 1, (8, 8)))
    else:
        metrics.update(verifier_cpu_per_epoch(registered, challenges))
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-per-token", action="store_true", help="time all 100 requests")
    parser.add_argument("--sampled-runs", type=int, default=6, help="prompts per circuit")
    parser.add_argument("--sampled-tokens", type=int, default=128, help="tokens per answer")
    args = parser.parse_args(argv)
    # the challenge's answer, the positions a node serves for the spot check (blocks of 32;
    # the last one is recomputed; from the long challenge), untimed warm-ups, per-token
    # requests timed
    args.answer_tokens, args.served_positions, args.warm_ups = 100, 128, 1
    args.per_token_sample = PER_TOKEN_SAMPLE
    if args.quick:  # the fp32 circuit stands in for the registered int8 one: loaded once
        args.sampled_runs, args.sampled_tokens = 1, 8
        args.answer_tokens, args.served_positions, args.warm_ups = 16, 64, 0
        args.per_token_sample = 3
    if args.sampled_runs < 1 or args.sampled_tokens < 1:
        parser.error("--sampled-runs and --sampled-tokens must be at least 1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    repeats = 1 if args.quick else args.repeats
    load_start = os.getloadavg()[0]
    torch.manual_seed(0)

    from node.model.evaluate import heldout_text
    from node.verifier.measure import load_circuit, text_challenges

    circuit = load_circuit("none")
    answer = args.answer_tokens
    challenges = text_challenges(
        circuit.head, heldout_text(), count=max(2, repeats), continuation_tokens=answer
    )
    for _ in range(args.warm_ups):  # first forwards initialise lazily: not timed
        one_pass(circuit, challenges[0])
    one, per, verifier_side, one_cpu, per_cpu = [], [], [], [], []
    for index in range(repeats):
        challenge = challenges[index]
        total, own, cpu = one_pass(circuit, challenge)
        one.append(total)
        verifier_side.append(own)
        one_cpu.append(cpu)
        wall, cpu = per_token(circuit, challenge, args.full_per_token, args.per_token_sample)
        per.append(wall)
        per_cpu.append(cpu)
        log.info("repeat %d: one pass %.2f s, per token %.2f s", index + 1, one[-1], per[-1])
    long = text_challenges(circuit.head, heldout_text(), count=1, continuation_tokens=2 * answer)[0]
    served_ids = list(long.ids[: args.served_positions])
    spot = [serving_and_spot_check(circuit, served_ids) for _ in range(repeats)]
    long_one, _, _ = one_pass(circuit, long)
    long_per, _ = per_token(circuit, long, args.full_per_token, args.per_token_sample)
    if not args.quick:
        del circuit  # the fp32 circuit: the rest runs on the registered int8 model and its cheats
        circuit = load_circuit("int8")
    extra = sampled_and_epoch(args, challenges, circuit)
    one_s, per_s = median(one), median(per)
    decode_ms = median([s["decode_ms_per_position"] for s in spot])
    fingerprint_ms = median([s["fingerprint_ms_per_position"] for s in spot])
    recompute_ms = median([s["recompute_ms_per_checked_position"] for s in spot])
    verifier_vs_serving = recompute_ms / decode_ms
    metrics = {
        "verifications_per_min_one_pass": round(60.0 / one_s, 2),
        "verifications_per_min_per_token": round(60.0 / per_s, 3),
        "ratio_one_pass_vs_per_token": round(per_s / one_s, 1),
        "verifications_per_min_one_pass_verifier_side": round(60.0 / median(verifier_side), 2),
        "ratio_one_pass_vs_per_token_reference_reused": round(
            median([p / (o - v) for p, o, v in zip(per, one, verifier_side, strict=True)]), 1
        ),
        "verification_s_one_pass": round(one_s, 3),
        "verification_cpu_s_one_pass": round(median(one_cpu), 3),
        "verification_cpu_s_per_token": round(median(per_cpu), 2),
        "ratio_one_pass_vs_per_token_cpu": round(median(per_cpu) / median(one_cpu), 1),
        "verifications_per_min_one_pass_cpu_bound": round(
            60.0 * torch.get_num_threads() / median(one_cpu), 2
        ),
        "threads": torch.get_num_threads(),
        "verification_s_per_token": round(per_s, 2),
        "verification_s_one_pass_spread": spread(one, 3),
        "verification_s_per_token_spread": spread(per, 2),
        "fingerprint_bytes_per_32_positions": spot[0]["block_bytes"],
        "serving_ms_per_position": round(decode_ms, 2),
        "verifier_ms_per_checked_position": round(recompute_ms, 2),
        "ratio_verifier_vs_serving_per_position": round(verifier_vs_serving, 3),
        "spot_check_cost_fraction": round(SPOT_CHECK_RATE * verifier_vs_serving, 4),
        "fingerprint_ms_per_position": round(fingerprint_ms, 3),
        "fingerprint_overhead_fraction": round(fingerprint_ms / decode_ms, 4),
        "ratio_one_pass_vs_per_token_answer_200": round(long_per / long_one, 1),
        **extra,
    }
    n = args.served_positions
    body = {
        "bench": "verification",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "shards": 3,
            "quant": "none",
            "quick": args.quick,
            "prompt_tokens": 32,
            "answer_tokens": answer,
            "answer_tokens_long": 2 * answer,  # ratio_one_pass_vs_per_token_answer_200
            "served_positions": args.served_positions,
            "warm_ups": args.warm_ups,
            "repeats": repeats,
            "per_token_requests_timed": answer
            if args.full_per_token
            else len(sampled_steps(answer, args.per_token_sample)),
            "spot_check_rate": SPOT_CHECK_RATE,
            "spot_check": f"middle shard (10 layers), block [{n - 32}, {n}) recomputed by one "
            f"{n}-position prefill",
            "shared_box": "2 CPU cores shared with ~5 engineers running tests and devnets",
            "sampled_runs": args.sampled_runs,
            "sampled_tokens": args.sampled_tokens,
            "sampled_registered": "none (fp32)" if args.quick else "int8",
            "epoch_challenges_nodes": [1, 1] if args.quick else [EPOCH_CHALLENGES, EPOCH_NODES],
            "epoch_text_window": [8, 8] if args.quick else [32, 64],
            "load_average_start": round(load_start, 2),
            "load_average_end": round(os.getloadavg()[0], 2),
        },
        "metrics": metrics,
        "targets": {
            "ratio_one_pass_vs_per_token": {"op": ">=", "value": 50},
            "ratio_one_pass_vs_per_token_answer_200": {"op": ">=", "value": 50},
            "verifications_per_min_one_pass": {"op": ">=", "value": 600},
            "fingerprint_bytes_per_32_positions": {"op": "<=", "value": 258},
            "fingerprint_overhead_fraction": {"op": "<=", "value": 0.02},
        },
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
