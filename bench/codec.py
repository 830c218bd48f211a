"""Wire-codec benchmark: bytes vs teacher-forced quality of every lossy activation codec — one
JSON object on stdout, logs on stderr.

    .venv/bin/python bench/codec.py                 # SmolLM2-135M, 3 shards, the held-out text
    .venv/bin/python bench/codec.py --parts 2 --model /path/to/hf-model

The held-out text is cut in two at a paragraph boundary (`node.model.evaluate.heldout_split`):
settings are chosen on the first half (`tune_*` metrics) and every figure without a prefix is
measured on the second half, which nothing was tuned on. Each half goes through the model split
into the shards of a `--parts`-node circuit, in process (no HTTP: quality does not depend on the
transport), with the codec applied at every place a circuit puts activations on the wire
(embeddings into shard 0 and each shard's output; `codec_quality`). Teacher-forced: every
position sees the true prefix, so one near-tie cannot cascade.

Per codec: share of positions whose top-1 next token equals the uncompressed circuit's, perplexity
ratio, the rms change of the top-2 logit gap and the mean KL divergence (continuous measures:
flips are few and noisy), body bytes as a share of fp32 (measured on the encoded bodies for the
variable-rate `rq`), and the CPU microseconds of one token's encode + decode. Besides the wire
codecs: `fp16` (a cast), `bf16_probe` (a cast), `fp8_probe` (float8 e4m3 with a float32
scale per token, 25.2 % of fp32), ohq widths that are not on the wire (`ohq6_probe`,
`ohq8_probe`) and `rq` at other quality exponents (`rq<e>`), to show where the quality/bytes
curve bends.
`rq_exponent_selected` is the smallest exponent whose KL and gap error on the tuning half are
no worse than `hq9`'s; `rq` ships with `rq_exponent_default`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick

log = logging.getLogger("bench.codec")

TARGET_RATIO = 0.20
TARGET_AGREEMENT = 0.995
TARGET_PPL_RATIO = 1.005
SWEEP = (18, 20, 22, 24, 26, 27, 28, 29, 30, 32, 34)
QUICK_SWEEP = (24, 29)  # --quick: one below the default and the default


def _exponents(text: str) -> tuple[int, ...]:
    try:
        exponents = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not exponents:
        raise argparse.ArgumentTypeError("give at least one exponent")
    return exponents


def _ohq_probe(bits: int) -> Any:
    from protocol.frames import ohq

    return lambda a: ohq.decode(ohq.encode(a, bits), a.size, bits).reshape(a.shape)


def _bf16(array: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(array).to(torch.bfloat16).float().numpy()


def _fp8(array: np.ndarray) -> np.ndarray:
    """float8 e4m3 with one float32 scale per token (its absmax onto e4m3's largest, 448)."""
    import torch

    x = torch.from_numpy(array)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / 448.0
    return ((x / scale).to(torch.float8_e4m3fn).float() * scale).numpy()


class _Rq:
    """An rq round trip at one exponent that counts the bytes and values it encoded."""

    def __init__(self, exponent: int) -> None:
        self.exponent = exponent
        self.bytes = 0
        self.values = 0

    def __call__(self, array: np.ndarray) -> np.ndarray:
        from protocol.frames import rq

        body = rq.encode(array, self.exponent)
        self.bytes += len(body)
        self.values += array.size
        return rq.decode(body, array.shape[1], array.shape[2]).reshape(array.shape)

    def ratio(self) -> float:
        return self.bytes / (4 * self.values)


def _decode_step_bytes(head: Any, shards: list[Any], text: str, exponent: int) -> float:
    """Mean rq body bytes of a one-token frame (a decode step) over `text`'s boundaries."""
    import torch

    from protocol.frames import rq

    ids = head.encode(text)
    positions = torch.arange(len(ids))
    sizes = []
    with torch.inference_mode():
        hidden = head.embed(ids)
        for shard in [None, *shards]:
            if shard is not None:
                hidden = shard.forward(hidden, positions, shard.new_cache())
            rows = hidden[0].numpy()
            sizes += [len(rq.encode(rows[t : t + 1], exponent)) for t in range(len(ids))]
    return float(np.mean(sizes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument(
        "--text-chars", type=int, default=0, help="cut each half to this many characters (0: all)"
    )
    parser.add_argument(
        "--rq-sweep",
        type=_exponents,
        default=SWEEP,
        help=f"rq exponents tried on the tuning half (default {','.join(map(str, SWEEP))})",
    )
    parser.add_argument(
        "--roundtrips", type=int, default=200, help="timed encode + decode rounds per codec"
    )
    args = parse_with_quick(
        parser,
        {"text_chars": 64, "rq_sweep": QUICK_SWEEP, "roundtrips": 10},
        argv,
    )
    if args.roundtrips < 1 or args.text_chars < 0:
        parser.error("--roundtrips must be at least 1 and --text-chars at least 0")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    import torch

    from harness.shard_cache import prepared_manifest
    from node.model.evaluate import codec_quality, codec_roundtrip, heldout_split
    from node.model.head import ClientHead
    from node.model.prepare import prepare
    from node.model.shard import ShardModel
    from protocol.frames import ohq
    from protocol.frames.codecs import CODECS, COMPRESSED_CODEC, VARIABLE_CODECS, body_size
    from protocol.frames.rq import DEFAULT_EXPONENT

    torch.set_num_threads(1)
    started = time.monotonic()
    if args.model == "default":  # the shared cache's set (prepared on first use); each load
        # below checks its file's chunk hashes, so the whole set is not hashed twice
        path = prepared_manifest(parts=args.parts, quant="none")
    else:
        path = prepare(model=args.model, parts=args.parts, quant="none", progress=log.info)
    head = ClientHead.load(path, device="cpu")
    shards = [ShardModel.load(path, k, device="cpu") for k in range(args.parts)]
    hidden = shards[0].hidden_size
    tune, test = heldout_split()
    if args.text_chars:
        tune, test = tune[: args.text_chars], test[: args.text_chars]

    # 1. Tuning half: the rq exponent that matches hq9's quality at the fewest bytes.
    log.info("tuning half: rq exponents %s against hq9", args.rq_sweep)
    sweep = {f"rq{e}": _Rq(e) for e in args.rq_sweep}
    tuned = codec_quality(head, shards, tune, {"hq9": codec_roundtrip("hq9"), **sweep})
    metrics: dict[str, Any] = {f"tune_{k}": v for k, v in tuned.items()}
    for name, rq in sweep.items():
        metrics[f"tune_ratio_activation_bytes_{name}_vs_fp32"] = round(rq.ratio(), 4)
    good = [
        e
        for e in args.rq_sweep
        if tuned[f"kl_rq{e}"] <= tuned["kl_hq9"]
        and tuned[f"gap_error_rms_rq{e}"] <= tuned["gap_error_rms_hq9"]
    ]
    metrics["rq_exponent_selected"] = min(good) if good else None
    metrics["rq_exponent_default"] = DEFAULT_EXPONENT

    # 2. Test half: every codec, nothing tuned here.
    lossy = [c for c in CODECS if c != "raw"]
    table: dict[str, Any] = {c: codec_roundtrip(c) for c in lossy}
    table["rq"] = _Rq(DEFAULT_EXPONENT)  # = codec_roundtrip("rq"), counting bytes
    table["fp16"] = lambda a: a.astype(np.float16).astype(np.float32)
    table["bf16_probe"] = _bf16
    table["fp8_probe"] = _fp8
    table["ohq6_probe"] = _ohq_probe(6)
    table["ohq8_probe"] = _ohq_probe(8)
    test_sweep = {f"rq{e}": _Rq(e) for e in args.rq_sweep if e != DEFAULT_EXPONENT}
    table.update(test_sweep)
    log.info("test half: %s", list(table))
    metrics.update(codec_quality(head, shards, test, table))
    ratios = {c: body_size("float32", c, hidden) / (hidden * 4) for c in lossy}
    ratios["fp16"] = ratios["bf16_probe"] = 0.5
    ratios["fp8_probe"] = (hidden + 4) / (hidden * 4)  # one byte per value + a float32 scale
    blocks = -(-hidden // 64)
    for bits in (6, 8):
        ratios[f"ohq{bits}_probe"] = blocks * ohq.block_bytes(bits) / (hidden * 4)
    for name, roundtrip in table.items():
        if isinstance(roundtrip, _Rq):
            ratios[name] = roundtrip.ratio()  # measured: rq is variable-rate
    for name, ratio in ratios.items():
        metrics[f"ratio_activation_bytes_{name}_vs_fp32"] = round(ratio, 4)
        metrics[f"activation_bytes_per_token_{name}"] = round(ratio * hidden * 4)
    metrics["activation_bytes_per_token_raw"] = hidden * 4
    step = _decode_step_bytes(head, shards, test, DEFAULT_EXPONENT)
    metrics["activation_bytes_per_decode_token_rq"] = round(step, 1)
    metrics["ratio_activation_bytes_per_decode_token_rq_vs_fp32"] = round(step / (hidden * 4), 4)
    meeting = [
        metrics[f"ratio_activation_bytes_{c}_vs_fp32"]
        for c in table
        if c not in ("fp16", "bf16_probe")
        and metrics[f"top1_agreement_{c}"] >= TARGET_AGREEMENT
        and metrics[f"ratio_ppl_{c}_vs_raw"] <= TARGET_PPL_RATIO
    ]
    metrics["smallest_ratio_meeting_quality_targets"] = min(meeting) if meeting else None

    one = np.random.default_rng(0).standard_normal((1, 1, hidden)).astype(np.float32)
    for name in lossy:  # CPU cost of encode + decode of one decode-step row
        roundtrip = table[name] if name not in VARIABLE_CODECS else codec_roundtrip(name)
        roundtrip(one)
        t0 = time.perf_counter()
        for _ in range(args.roundtrips):
            roundtrip(one)
        elapsed = time.perf_counter() - t0
        metrics[f"roundtrip_us_per_token_{name}"] = round(elapsed / args.roundtrips * 1e6)
    c = COMPRESSED_CODEC
    metrics["ratio_activation_bytes_compressed_vs_fp32"] = metrics[
        f"ratio_activation_bytes_{c}_vs_fp32"
    ]
    metrics["top1_agreement_compressed"] = metrics[f"top1_agreement_{c}"]
    metrics["ratio_ppl_compressed_vs_raw"] = metrics[f"ratio_ppl_{c}_vs_raw"]
    metrics["wall_s"] = round(time.monotonic() - started, 1)
    body = {
        "bench": "codec",
        "machine": machine(),
        "config": {
            "model": "smollm2-135m" if args.model == "default" else args.model,
            "parts": args.parts,
            "quick": args.quick,
            "text_chars": args.text_chars,
            "wire_boundaries": args.parts + 1,
            "text": "node/model/data/heldout.txt: first half tunes (tune_*), second half "
            "measures (teacher-forced, one pass each)",
            "rq_sweep": list(args.rq_sweep),
            "roundtrips": args.roundtrips,
            "compressed_codec": COMPRESSED_CODEC,
            "torch_threads": 1,
            "note": "quality figures are deterministic; wall_s and roundtrip_us are from a "
            "shared, loaded 2-core box",
        },
        "metrics": metrics,
        "targets": {
            "ratio_activation_bytes_compressed_vs_fp32": {"op": "<=", "value": TARGET_RATIO},
            "top1_agreement_compressed": {"op": ">=", "value": TARGET_AGREEMENT},
            "ratio_ppl_compressed_vs_raw": {"op": "<=", "value": TARGET_PPL_RATIO},
        },
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
