"""How much quantization costs: perplexity on held-out text, shard bytes, decode latency.

`perplexity(head, shards, text)` is teacher-forced: the whole text goes through the shards
in one forward pass (in-process, fresh caches), and the client head scores every next token.
`quant_report()` prepares the same split for each quant and returns flat metrics in the
BENCHMARKS.md naming (`ppl_fp32`, `shard_bytes_int8`, `ratio_shard_bytes_int4_vs_fp32`, ...).

    python -m node.model.evaluate [--model default] [--parts 3]   # prints one JSON object

The held-out text (`data/heldout.txt`) is original prose written for this repository, so no
model could have trained on it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.model.shard import ShardModel
from protocol.errors import UsageError
from protocol.frames.codecs import decode_values, encode_body

# A lossy round trip of one [1, T, H] float32 activation array (encode, then decode).
Roundtrip = Callable[[np.ndarray], np.ndarray]

# Metric-name spelling of each quant ("none" is the fp32 baseline).
QUANT_LABEL = {"none": "fp32", "int8": "int8", "int4": "int4"}


def heldout_text() -> str:
    """The repository's held-out English text (~575 words)."""
    return resources.files("node.model").joinpath("data/heldout.txt").read_text(encoding="utf-8")


def heldout_split() -> tuple[str, str]:
    """The held-out text cut at a paragraph boundary into (tuning half, test half): choose a
    codec's settings on the first, report its quality on the second."""
    paragraphs = [p.strip() for p in heldout_text().split("\n\n") if p.strip()]
    half = len(paragraphs) // 2
    return "\n\n".join(paragraphs[:half]), "\n\n".join(paragraphs[half:])


@torch.inference_mode()
def perplexity(head: ClientHead, shards: Sequence[ShardModel], text: str) -> float:
    """exp(mean next-token cross-entropy) of `text` through the shards (teacher forced)."""
    ids = head.encode(text)
    if len(ids) < 2:
        raise UsageError("perplexity needs a text of at least two tokens")
    hidden = head.embed(ids)
    positions = torch.arange(len(ids))
    for shard in shards:
        hidden = shard.forward(hidden, positions, shard.new_cache())
    logits = head.all_logits(hidden)[:-1]  # [T-1, V]: position t predicts token t+1
    targets = torch.tensor(ids[1:], dtype=torch.long)
    loss = torch.nn.functional.cross_entropy(logits.float(), targets)
    return math.exp(float(loss))


def codec_roundtrip(codec: str) -> Roundtrip:
    """The wire codec `codec` (protocol/frames/codecs.py) as an encode-then-decode function."""

    def roundtrip(array: np.ndarray) -> np.ndarray:
        shape = (1, int(array.shape[1]), int(array.shape[2]))
        return decode_values("float32", codec, shape, encode_body(array, "float32", codec))

    return roundtrip


@torch.inference_mode()
def circuit_logits(
    head: ClientHead,
    shards: Sequence[ShardModel],
    ids: Sequence[int],
    roundtrip: Roundtrip | None = None,
) -> torch.Tensor:
    """Teacher-forced logits [T-1, V] of `ids` through the shards, with `roundtrip` applied
    where a circuit puts activations on the wire: the embeddings going to the first shard and
    every shard's output (the client relays a body to the next hop unchanged, so that is one
    encode per boundary: len(shards) + 1 in all)."""

    def wire(hidden: torch.Tensor) -> torch.Tensor:
        if roundtrip is None:
            return hidden
        return torch.from_numpy(np.ascontiguousarray(roundtrip(hidden.float().numpy())))

    hidden = wire(head.embed(ids))
    positions = torch.arange(len(ids))
    for shard in shards:
        hidden = wire(shard.forward(hidden, positions, shard.new_cache()))
    return head.all_logits(hidden)[:-1].float()


@torch.inference_mode()
def codec_quality(
    head: ClientHead,
    shards: Sequence[ShardModel],
    text: str,
    codecs: Mapping[str, Roundtrip] | Sequence[str],
) -> dict[str, Any]:
    """Teacher-forced quality of lossy wire codecs against the uncompressed circuit.

    For each codec: `top1_agreement_<c>` (share of positions whose argmax next token is the
    uncompressed circuit's; one near-tie cannot cascade because every position sees the true
    prefix), `flips_<c>`, `ppl_<c>`, `ratio_ppl_<c>_vs_raw`, and two continuous measures that
    rank codecs where flips are too few to: `gap_error_rms_<c>` (rms change of the gap between
    the uncompressed circuit's top-2 logits) and `kl_<c>` (mean KL divergence, nats). Also
    `ppl_raw`, `positions` and
    `near_ties_raw` (positions whose top-2 logits differ by < 0.05, where any noise may flip)."""
    table = {c: codec_roundtrip(c) for c in codecs} if not isinstance(codecs, Mapping) else codecs
    ids = head.encode(text)
    if len(ids) < 2:
        raise UsageError("codec quality needs a text of at least two tokens")
    targets = torch.tensor(ids[1:], dtype=torch.long)
    base = circuit_logits(head, shards, ids)
    base_loss = float(torch.nn.functional.cross_entropy(base, targets))
    top2 = base.topk(2, dim=-1).values
    metrics: dict[str, Any] = {
        "positions": len(ids) - 1,
        "ppl_raw": round(math.exp(base_loss), 4),
        "near_ties_raw": int(((top2[:, 0] - top2[:, 1]) < 0.05).sum()),
    }
    best = base.argmax(dim=-1)
    runner_up = base.topk(2, dim=-1).indices[:, 1:]
    base_logp = torch.log_softmax(base, dim=-1)
    for name, roundtrip in table.items():
        logits = circuit_logits(head, shards, ids, roundtrip)
        loss = float(torch.nn.functional.cross_entropy(logits, targets))
        flips = int((logits.argmax(dim=-1) != best).sum())
        metrics[f"top1_agreement_{name}"] = round(1.0 - flips / len(best), 5)
        metrics[f"flips_{name}"] = flips
        metrics[f"ppl_{name}"] = round(math.exp(loss), 4)
        metrics[f"ratio_ppl_{name}_vs_raw"] = round(math.exp(loss - base_loss), 5)
        # Continuous measures (flips are few and noisy): how far the top-2 gap moved, and the
        # mean KL divergence of the codec's next-token distribution from the uncompressed one.
        gap = (logits.gather(1, best[:, None]) - logits.gather(1, runner_up))[:, 0]
        moved = gap - (top2[:, 0] - top2[:, 1])
        metrics[f"gap_error_rms_{name}"] = round(float(moved.pow(2).mean().sqrt()), 5)
        kl = (base_logp.exp() * (base_logp - torch.log_softmax(logits, dim=-1))).sum(-1)
        metrics[f"kl_{name}"] = float(f"{float(kl.mean()):.3g}")
    return metrics


@torch.inference_mode()
def decode_latency_ms(
    shard: ShardModel, *, prompt_tokens: int = 32, steps: int = 16, seed: int = 0
) -> float:
    """Median milliseconds of one single-token decode step of `shard` after a prefill of
    `prompt_tokens` random hidden states (what a node does per generated token)."""
    generator = torch.Generator().manual_seed(seed)
    cache = shard.new_cache()
    prompt = torch.randn(1, prompt_tokens, shard.hidden_size, generator=generator)
    shard.forward(prompt, torch.arange(prompt_tokens), cache)
    times = []
    for step in range(steps):
        token = torch.randn(1, 1, shard.hidden_size, generator=generator)
        started = time.perf_counter()
        shard.forward(token, torch.tensor([prompt_tokens + step]), cache)
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def quant_report(
    model: str | Path = "default",
    parts: int = 3,
    quants: Sequence[str] = ("none", "int8", "int4"),
    *,
    text: str | None = None,
    device: str = "auto",
    latency_steps: int = 16,
    latency_repeats: int = 3,
    packed: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Flat metrics per quant: `ppl_<q>`, `shard_bytes_<q>` (shard 0's file), `shard_layers`,
    `decode_ms_per_shard_<q>` and ratios vs fp32, plus the manifests used.

    Latency: shard 1 of each quant is timed round-robin (`latency_repeats` rounds of
    `latency_steps` single-token steps, median), so a busy machine slows all quants alike.
    With `packed`, quantized shards are also timed kept packed (the library de-quantizing in
    every forward: `decode_ms_per_shard_<q>_packed`); `runtime="auto"` (what nodes use) keeps
    them packed on CUDA and, on CPU, de-quantizes them once at load (int8 stays int8, with
    torch's int8 kernel on the fast shard path, unless `PLANET_INT8_KERNEL=0`)."""
    text = heldout_text() if text is None else text
    metrics: dict[str, Any] = {}
    manifests: dict[str, str] = {}
    timed: dict[str, ShardModel] = {}
    for quant in quants:
        label = QUANT_LABEL[quant]
        kwargs = {} if progress is None else {"progress": progress}
        path = prepare(model=model, parts=parts, quant=quant, **kwargs)
        manifests[label] = str(path)
        manifest = Manifest.load(path)
        head = ClientHead.load(path, device=device)
        shards = [ShardModel.load(path, k, device=device) for k in range(parts)]
        metrics[f"ppl_{label}"] = round(perplexity(head, shards, text), 4)
        metrics["heldout_tokens"] = len(head.encode(text))
        metrics[f"shard_bytes_{label}"] = manifest.shards[0].size
        metrics["shard_layers"] = manifest.shards[0].num_layers
        timed[label] = shards[min(1, parts - 1)]
        if quant != "none" and packed:
            timed[f"{label}_packed"] = ShardModel.load(
                path, min(1, parts - 1), device=device, runtime="packed"
            )
        del shards, head
    samples: dict[str, list[float]] = {label: [] for label in timed}
    for _ in range(latency_repeats):
        for label, shard in timed.items():
            steps = max(2, latency_steps // 4) if label.endswith("_packed") else latency_steps
            samples[label].append(decode_latency_ms(shard, steps=steps))
    for label, values in samples.items():
        metrics[f"decode_ms_per_shard_{label}"] = round(statistics.median(values), 2)
    if "fp32" in {QUANT_LABEL[q] for q in quants}:
        for label in ("int8", "int4"):
            if f"shard_bytes_{label}" in metrics:
                metrics[f"ratio_shard_bytes_{label}_vs_fp32"] = round(
                    metrics[f"shard_bytes_{label}"] / metrics["shard_bytes_fp32"], 4
                )
                metrics[f"ratio_ppl_{label}_vs_fp32"] = round(
                    metrics[f"ppl_{label}"] / metrics["ppl_fp32"], 4
                )
    return {"metrics": metrics, "manifests": manifests}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m node.model.evaluate",
        description="Perplexity, shard bytes and decode latency of fp32 / int8 / int4 shards "
        "(one JSON object on stdout).",
    )
    parser.add_argument("--model", default="default")
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument("--quants", default="none,int8,int4")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    started = time.monotonic()
    report = quant_report(args.model, args.parts, quants, device=args.device)
    import platform

    from node.model.device import resolve_device

    device = resolve_device(args.device)
    body = {
        "bench": "quant",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "torch": torch.__version__,
            "device": device.type,
        },
        "config": {"model": args.model, "parts": args.parts, "quants": quants},
        "metrics": {**report["metrics"], "wall_s": round(time.monotonic() - started, 1)},
        "targets": {
            "ratio_shard_bytes_int8_vs_fp32": {"op": "<=", "value": 0.30},
            "ratio_shard_bytes_int4_vs_fp32": {"op": "<=", "value": 0.18},
            "ratio_ppl_int8_vs_fp32": {"op": "<=", "value": 1.02},
            "ratio_ppl_int4_vs_fp32": {"op": "<=", "value": 1.10},
        },
        "manifests": report["manifests"],
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
