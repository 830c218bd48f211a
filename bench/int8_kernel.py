"""int8 kernel benchmark: is torch's packed int8 kernel verifiable? One JSON object on stdout.

    .venv/bin/python bench/int8_kernel.py            # 6 windows x 32 sampled tokens, 12 prompts
    .venv/bin/python bench/int8_kernel.py --quick    # 2 windows x 4 sampled (4 decoded), 1 prompt,
                                                     # 2 batched steps

SmolLM2-135M int8, 3 shards in process. The kernel (`Int8Linear`: `torch._weight_int8pack_mm` on
bf16 activations) is what an int8 node runs on CPU by default and what the verifiers' reference
recomputes (node/verifier/reference.py). Measured:
- `kernel_rows_*`: the kernel's output rows do not depend on how many rows one call carries (1 to
  33) nor on the thread count (1, 2): a one-position decode step, a batched step and a prefill
  compute every row alike (fp32 `F.linear` for comparison);
- `fingerprint_*`: a node serving a window as nodes do (one prefill, one position per forward)
  against the verifier's one-prefill recomputation of each shard (`recompute`), per node kind:
  honest (kernel), the opt-out (`PLANET_INT8_KERNEL=0`, de-quantized fp32), fp32 and int4
  shards claiming int8; blocks passing the calibrated int8 tolerance and the ULP distances;
- `batched_*`: decode steps of 3 sessions in one `forward_batch` against each alone, bitwise;
- `sampled_*`: a node serving 2 sessions batched (float16 frames, temperature 1, a seed per
  window), replayed by a separately loaded reference on the nodes' schedule
  (`Reference.served_logits`' computation): mismatched draws, on the kernel reference and on a
  de-quantized one;
- `greedy_*`: greedy tokens of the kernel against the de-quantized fp32 path over the prompt
  sets of bench/wire_dtype.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

log = logging.getLogger("bench.int8_kernel")


def kernel_rows() -> dict[str, Any]:
    """Row invariance of `_weight_int8pack_mm` (and of fp32 `F.linear`) on random weights."""
    import torch
    from torch.nn import functional as F

    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-127, 128, (1536, 576), dtype=torch.int8, generator=generator)
    ones = torch.ones(1536, dtype=torch.bfloat16)
    rows = torch.randn(40, 576, generator=generator).to(torch.bfloat16)
    threads = torch.get_num_threads()
    out: dict[str, Any] = {}
    for label, run in (
        ("int8pack", lambda x: torch._weight_int8pack_mm(x, weight, ones)),
        ("fp32_linear", lambda x: F.linear(x.float(), weight.float())),
    ):
        full = {}
        differing = 0
        for count in (1, 2):
            torch.set_num_threads(count)
            full[count] = run(rows)
        torch.set_num_threads(threads)
        for m in (1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33):
            for start in range(0, 40 - m + 1, 3):
                if not torch.equal(
                    run(rows[start : start + m].contiguous()), full[1][start : start + m]
                ):
                    differing += 1
        out[f"kernel_rows_{label}_calls_differing"] = differing
        # 1 when every thread count gave the same bits
        out[f"kernel_rows_{label}_threads_equal"] = int(
            all(torch.equal(full[1], f) for f in full.values())
        )
    return out


@functools.cache
def _prepared(quant: str) -> Path:
    """The shard set's manifest in the shared cache (prepared on first use); its files' hashes
    are checked as they load, once a run (the first `_load` of the set)."""
    from harness.shard_cache import prepared_manifest

    return prepared_manifest(parts=3, quant=quant)


def _head() -> Any:
    from node.model.head import ClientHead

    return ClientHead.load(_prepared("int8"), device="cpu", verify=True)


_VERIFIED: set[str] = set()  # the quants whose shard files were hash-checked at load


def _load(quant: str, int8_kernel: bool | None = None) -> list[Any]:
    """A fresh copy of the 3 shards of `quant` (each circuit its own modules): the first copy
    of a set checks its files' chunk hashes, the later copies load the same files unchecked."""
    from node.model.shard import ShardModel

    path = _prepared(quant)
    verify = quant not in _VERIFIED
    _VERIFIED.add(quant)
    return [
        ShardModel.load(path, k, device="cpu", verify=verify, int8_kernel=int8_kernel)
        for k in range(3)
    ]


def fingerprints(circuits: dict[str, list[Any]], reference: list[Any], head: Any, challenge: Any):
    """Per node kind: blocks passing the calibrated int8 tolerance against the kernel reference."""
    import torch

    from node.verifier.calibrate import block_stats, passes, summarize_blocks
    from node.verifier.calibration import load_calibration
    from node.verifier.measure import recompute, serve_trace

    tolerance = load_calibration().tolerance("int8")
    hidden = head.embed(challenge.ids)
    prompt = len(challenge.prompt_ids)
    out: dict[str, Any] = {"fingerprint_tolerance_int8_max_ulp": tolerance.max_ulp}
    for name, shards in circuits.items():
        trace = serve_trace(shards, hidden, prompt)
        blocks, equal, positions = [], 0, 0
        for k, own_shard in enumerate(reference):
            own = recompute(own_shard, trace.inputs[k])
            served = trace.outputs[k]
            equal += int(sum(torch.equal(served[0, t], own[0, t]) for t in range(own.shape[1])))
            positions += own.shape[1]
            blocks.extend(block_stats(served, own, 0))
        summary = summarize_blocks(blocks)
        out[f"fingerprint_{name}_blocks_passed"] = sum(passes(blocks, tolerance))
        out[f"fingerprint_{name}_blocks"] = len(blocks)
        out[f"fingerprint_{name}_exact_values_per_mille"] = summary["exact_values_per_mille"]
        out[f"fingerprint_{name}_ulp_max_matched_64"] = summary["ulp_max_matched_64"]
        out[f"fingerprint_{name}_bitwise_positions"] = equal
        out[f"fingerprint_{name}_positions"] = positions
        log.info("fingerprint %s: %s", name, {k: v for k, v in out.items() if name in k})
    return out


def batched(shards: list[Any], hidden_size: int, steps: int) -> bool:
    """3 sessions (prompts of 5, 9, 13 positions) decoded `steps` steps in one forward_batch
    per shard against each decoded alone: every output bitwise equal."""
    import torch

    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randn(1, n, hidden_size, generator=generator) for n in (5, 9, 13)]
    inputs = [torch.randn(3, 1, hidden_size, generator=generator) for _ in range(steps)]
    with torch.inference_mode():
        for shard in shards:
            together = [shard.new_cache() for _ in prompts]
            alone = [shard.new_cache() for _ in prompts]
            for p, a, b in zip(prompts, together, alone, strict=True):
                shard.forward(p, torch.arange(p.shape[1]), a)
                shard.forward(p, torch.arange(p.shape[1]), b)
            for x in inputs:
                positions = torch.tensor([shard.cache_length(c) for c in together])
                rows = shard.forward_batch(x, positions, together)
                for b in range(3):
                    single = shard.forward(x[b : b + 1], positions[b : b + 1], alone[b])
                    if not torch.equal(rows[b : b + 1], single):
                        return False
    return True


def _wire(hidden: Any) -> Any:
    import torch

    from protocol.frames.codecs import wire_values

    return torch.from_numpy(wire_values(hidden.float().contiguous().numpy(), "float16", "raw"))


def serve_batched(head: Any, shards: list[Any], prompts: list[list[int]], tokens: int, configs):
    """Sessions served as a node's batcher serves them: each prompt in its own prefill, then
    every session's next position in one `forward_batch` per shard; float16 frames; each
    session samples with its own seed (the client's sampler)."""
    import torch

    from node.client.sampling import sample

    rngs = [c.rng() for c in configs]
    caches = [[s.new_cache() for s in shards] for _ in prompts]
    last = []
    with torch.inference_mode():
        for prompt, own in zip(prompts, caches, strict=True):
            hidden = _wire(head.embed(prompt))
            for shard, cache in zip(shards, own, strict=True):
                hidden = _wire(shard.forward(hidden, torch.arange(len(prompt)), cache))
            last.append(hidden[:, -1:])
        answers: list[list[int]] = [[] for _ in prompts]
        for _ in range(tokens):
            for b, h in enumerate(last):
                logits = head.logits_np(h[0, -1].numpy())
                answers[b].append(sample(np.asarray(logits), configs[b], rngs[b]))
            if len(answers[0]) == tokens:
                break
            hidden = _wire(torch.cat([head.embed([a[-1]]) for a in answers]))
            positions = [len(p) + len(a) - 1 for p, a in zip(prompts, answers, strict=True)]
            for k, shard in enumerate(shards):
                hidden = _wire(
                    shard.forward_batch(hidden, torch.tensor(positions), [c[k] for c in caches])
                )
            last = [hidden[b : b + 1] for b in range(len(prompts))]
    return answers


def sampled(node, references: dict[str, Any], head: Any, challenges, tokens: int) -> dict:
    """Mismatched draws of the batched node's answers replayed on each reference."""
    from node.client.sampling import SamplingConfig
    from node.verifier.sampled import SampledAnswer, replay
    from node.verifier.scoring import served_logits

    counts = {name: 0 for name in references}
    observed = 0
    for first in range(0, len(challenges), 2):
        pair = challenges[first : first + 2]
        prompts = [list(c.prompt_ids) for c in pair]
        configs = [SamplingConfig(temperature=1.0, seed=1000 + first + i) for i in range(len(pair))]
        answers = serve_batched(head, node, prompts, tokens, configs)
        for prompt, answer, config in zip(prompts, answers, configs, strict=True):
            for name, shards in references.items():
                own = served_logits(head, shards, prompt, answer, "float16")
                check = replay(
                    own, len(prompt), SampledAnswer(tuple(answer), False), config, frozenset()
                )
                counts[name] += check.mismatched
            observed += len(answer)
    out = {f"sampled_mismatches_vs_{name}_reference": n for name, n in counts.items()}
    out["sampled_observed"] = observed
    out["sampled_windows"] = len(challenges)
    return out


def greedy_tokens(head, kernel, dequantized, count: int, tokens: int) -> dict[str, Any]:
    from bench.wire_dtype import greedy, prompts

    chosen = list(prompts().items())[:count]
    same, differing = 0, 0
    for _name, messages in chosen:
        ids = head.chat_ids(messages)
        a = greedy(head, kernel, ids, tokens, "float32")
        b = greedy(head, dequantized, ids, tokens, "float32")
        same += a == b
        differing += sum(x != y for x, y in zip(a, b, strict=True))
    return {
        "greedy_prompts_identical": same,
        "greedy_prompts": len(chosen),
        "greedy_tokens_differing": differing,
        "greedy_tokens": tokens * len(chosen),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=6, help="held-out windows (6)")
    parser.add_argument("--sampled-tokens", type=int, default=32)
    parser.add_argument("--decode", type=int, default=64, help="decoded positions per window")
    parser.add_argument("--prompts", type=int, default=12, help="greedy prompts (12)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    args = parse_with_quick(
        parser,
        {"windows": 2, "sampled_tokens": 4, "decode": 4, "prompts": 1, "tokens": 4},
        argv,
    )
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    import torch

    from node.model.evaluate import heldout_text
    from node.verifier.measure import text_challenges

    torch.set_num_threads(1)
    metrics: dict[str, Any] = kernel_rows()
    head = _head()
    kernel = _load("int8", int8_kernel=True)
    reference = _load("int8", int8_kernel=True)  # the verifier's own copy
    dequantized = _load("int8", int8_kernel=False)
    fp32 = _load("none")
    int4 = _load("int4")
    assert type(kernel[0].module.model.layers[str(0)].self_attn.q_proj).__name__ == "Int8Linear"
    challenges = text_challenges(
        head, heldout_text(), count=args.windows, continuation_tokens=args.decode
    )
    nodes = {"kernel": kernel, "dequantized": dequantized, "fp32": fp32, "int4": int4}
    metrics.update(fingerprints(nodes, reference, head, challenges[0]))
    for name, shards in (("kernel", kernel), ("fp32", fp32)):
        # 1 when every batched step equals its sessions' steps alone, bit for bit
        steps = 2 if args.quick else 4
        metrics[f"batched_bitwise_{name}"] = int(batched(shards, head.embed([1]).shape[-1], steps))
    metrics.update(
        sampled(
            kernel,
            {"kernel": reference, "dequantized": dequantized},
            head,
            challenges,
            args.sampled_tokens,
        )
    )
    metrics.update(greedy_tokens(head, kernel, dequantized, args.prompts, args.tokens))
    print(
        json.dumps(
            {
                "bench": "int8_kernel",
                "machine": machine(),
                "config": {"model": "smollm2-135m", "parts": 3, "threads": 1, **vars(args)},
                "metrics": metrics,
                "targets": {
                    "sampled_mismatches_vs_kernel_reference": 0,
                    "fingerprint_kernel_blocks_passed": "all",
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
