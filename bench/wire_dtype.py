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

Then what an honest circuit scores in the verifier's checks on float16 and float32 frames
(`verifier_checks`, `--challenges` windows of the held-out text): echo and full-vocabulary KL
with the calibrated maps' credibility, and sampled-check mismatches replayed as the verifier
replays them (`Reference.served_logits`) and, for comparison, on one prefill.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
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


def _wire(hidden: Any, dtype: str) -> Any:
    """A [1, T, H] tensor as a receiver decodes it from a raw `dtype` frame."""
    import torch

    from protocol.frames.codecs import wire_values

    return torch.from_numpy(wire_values(hidden.float().contiguous().numpy(), dtype, "raw"))


def greedy(
    head: Any,
    shards: list[Any],
    ids: list[int],
    tokens: int,
    dtype: str,
    pick: Callable[[np.ndarray], int] | None = None,
) -> list[int]:
    """`tokens` tokens through `shards` (greedy, or `pick` on each step's logits), every
    boundary as a raw `dtype` frame carries it."""
    import torch

    caches = [shard.new_cache() for shard in shards]
    out: list[int] = []
    step, start = list(ids), 0
    with torch.inference_mode():
        while len(out) < tokens:
            hidden = _wire(torch.from_numpy(np.asarray(head.embed_np(step))), dtype)
            positions = torch.arange(start, start + len(step), dtype=torch.long)
            for shard, cache in zip(shards, caches, strict=True):
                hidden = _wire(shard.forward(hidden, positions, cache), dtype)
            logits = head.logits_np(hidden[0, -1].numpy())
            token = int(np.argmax(logits)) if pick is None else pick(logits)
            out.append(token)
            start += len(step)
            step = [token]
    return out


def prefill_logits(head: Any, shards: list[Any], ids: list[int], dtype: str) -> Any:
    """[T, V] logits of one prefill through `shards`, boundaries as `dtype` frames carry them."""
    import torch

    with torch.inference_mode():
        hidden = _wire(head.embed(ids), dtype)
        positions = torch.arange(len(ids))
        for shard in shards:
            hidden = _wire(shard.forward(hidden, positions, shard.new_cache()), dtype)
        return head.all_logits(hidden)


def _sampler(config: Any) -> Callable[[np.ndarray], int]:
    """The client's sampler (node.client.sampling.sample), one generator per answer."""
    from node.client.sampling import sample

    rng = config.rng()
    return lambda logits: sample(logits, config, rng)


def verifier_checks(
    circuits: dict[str, Any],
    count: int,
    sampled_tokens: int,
    prompt_tokens: int = 32,
    continuation_tokens: int = 64,
) -> dict[str, Any]:
    """What an honest circuit scores in the verifier's checks on float16 and on float32 frames,
    the verifier's reference rounding as the same frames do (`scoring.reference_logits`,
    `planet verifier serve --wire-dtype`): the echo and full-vocabulary KL against the fp32
    model (calibrate_echo's and calibrate's challenges: held-out windows, 32 prompt + 64
    continuation tokens) with the credibility the calibrated maps give, and the sampled check
    (temperature 1, a fixed seed per challenge, decoded as nodes serve, replayed on the
    circuit's own quant on the same schedule, as `Reference.served_logits` does).
    `*_prefill_replay`: replayed on one rounded prefill instead; `*_vs_fp32_reference`: float16
    answers replayed on one prefill that does not round (a verifier whose --wire-dtype is not
    its gateway's)."""
    from node.client.sampling import SamplingConfig
    from node.model.evaluate import heldout_text
    from node.verifier.calibration import CALIBRATION_FILE, load_calibration
    from node.verifier.echo import echo_gap, simulated_answer
    from node.verifier.measure import text_challenges
    from node.verifier.sampled import SampledAnswer, SampledMap, replay
    from node.verifier.scoring import compare_logits, reference_logits, served_logits
    from node.verifier.service import echo_map

    calibration = load_calibration()
    echo_credibility = echo_map(CALIBRATION_FILE)
    fp32 = circuits["fp32"]
    challenges = text_challenges(
        fp32.head,
        heldout_text(),
        count=count,
        prompt_tokens=prompt_tokens,
        continuation_tokens=continuation_tokens,
    )
    out: dict[str, Any] = {
        "echo_full_credit_micro": echo_credibility.full_micro,
        "kl_full_credit_micro": calibration.credibility_map.full_micro,
    }
    sampled_map = SampledMap()

    def sampled(head: Any, shards: list[Any], prompt: list[int], index: int, dtype: str) -> Any:
        config = SamplingConfig(temperature=1.0, seed=1000 + index)
        tokens = greedy(head, shards, prompt, sampled_tokens, dtype, _sampler(config))
        answer = SampledAnswer(tuple(tokens), False)
        checks = {}
        for reference_dtype in ("float32", "float16"):
            own = reference_logits(head, shards, prompt + tokens, reference_dtype)
            checks[reference_dtype] = replay(own, len(prompt), answer, config, frozenset())
        own = served_logits(head, shards, prompt, tokens, dtype)
        checks["decode"] = replay(own, len(prompt), answer, config, frozenset())
        return checks

    for dtype, short in (("float32", "fp32wire"), ("float16", "fp16wire")):
        references = [reference_logits(fp32.head, fp32.shards, c.ids, dtype) for c in challenges]
        for label, circuit in circuits.items():
            head, shards = circuit.head, circuit.shards
            echo, full = [], []
            # reference dtype (or "decode": the nodes' schedule): mismatched, seen
            counts = {"float32": [0, 0], "float16": [0, 0], "decode": [0, 0]}
            for index, challenge in enumerate(challenges):
                logits = prefill_logits(head, shards, list(challenge.ids), dtype)
                reference = references[index]
                echo.append(echo_gap(challenge, simulated_answer(challenge, logits), reference))
                full.append(compare_logits(challenge, logits, reference))
                checks = sampled(head, shards, list(challenge.prompt_ids), index, dtype)
                for reference_dtype, check in checks.items():
                    counts[reference_dtype][0] += check.mismatched
                    counts[reference_dtype][1] += check.observed
                worst = sampled_map.credibility(checks["decode"])  # what the verifier replays
                key = f"sampled_min_credibility_{label}_{short}"
                out[key] = min(out.get(key, worst), worst)
            out[f"echo_kl_max_micro_{label}_{short}"] = round(max(g.kl for g in echo) * 1e6, 1)
            out[f"kl_max_micro_{label}_{short}"] = round(max(g.kl for g in full) * 1e6, 1)
            out[f"echo_min_credibility_{label}_{short}"] = min(
                echo_credibility.credibility(g) for g in echo
            )
            out[f"sampled_mismatches_{label}_{short}"] = counts["decode"][0]
            out[f"sampled_observed_{label}_{short}"] = counts["decode"][1]
            out[f"sampled_mismatches_{label}_{short}_prefill_replay"] = counts[dtype][0]
            if dtype == "float16":
                out[f"sampled_mismatches_{label}_{short}_vs_fp32_reference"] = counts["float32"][0]
            log.info("%s %s: %s", label, short, {k: v for k, v in out.items() if label in k})
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, default=64, help="greedy tokens per prompt (64; 0: no greedy runs)"
    )
    parser.add_argument("--quants", default="fp32,int8", help="shard quants (fp32,int8)")
    parser.add_argument("--prompts", type=int, default=0, help="first N prompts (0: all)")
    parser.add_argument(
        "--challenges", type=int, default=6, help="verifier challenges per circuit (6; 0: none)"
    )
    parser.add_argument("--sampled-tokens", type=int, default=32, help="sampled check's tokens")
    parser.add_argument(
        "--window",
        type=int,
        nargs=2,
        default=(32, 64),
        metavar=("PROMPT", "CONTINUATION"),
        help="a challenge's held-out window: prompt and continuation tokens (32 64, the "
        "verifier's calibration windows)",
    )
    args = parse_with_quick(
        parser,
        {
            "tokens": 4,
            "quants": "fp32",
            "prompts": 1,
            "challenges": 1,
            "sampled_tokens": 4,
            "window": (8, 8),
        },
        argv,
    )
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    from node.verifier.measure import load_circuit

    chosen = list(prompts().items())[: args.prompts or None]
    metrics: dict[str, Any] = {}
    circuits = {label: load_circuit(QUANTS[label]) for label in args.quants.split(",")}
    if "fp32" not in circuits and args.challenges:
        circuits = {"fp32": load_circuit("none"), **circuits}  # the verifier's reference
    for label in args.quants.split(",") if args.tokens else ():
        circuit = circuits[label]
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
    if args.challenges:
        metrics.update(
            verifier_checks(circuits, args.challenges, args.sampled_tokens, *args.window)
        )
    result = {
        "bench": "wire_dtype",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m",
            "parts": 3,
            "tokens": args.tokens,
            "prompts": [name for name, _ in chosen],
            "challenges": args.challenges,
            "window": list(args.window),
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
