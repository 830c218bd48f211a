"""Wire-codec benchmark: bytes vs teacher-forced quality of every lossy activation codec — one
JSON object on stdout, logs on stderr.

    python bench/codec.py                 # SmolLM2-135M, 3 shards, the held-out text
    python bench/codec.py --parts 2 --model /path/to/hf-model

The held-out text goes through the model split into the shards of a `--parts`-node circuit, in
process (no HTTP: quality does not depend on the transport), with the codec applied at every
place a circuit puts activations on the wire (embeddings into shard 0 and each shard's output;
node/model/evaluate.py `codec_quality`). Teacher-forced: every position sees the true prefix,
so one near-tie cannot cascade into a different continuation. Reported per codec: share of
positions whose top-1 next token equals the uncompressed chain's, perplexity ratio against the
uncompressed chain, body bytes as a share of fp32, and the CPU microseconds of one token's
encode + decode. Besides the registered wire codecs it measures `fp16` (a cast) and ohq widths
that are not on the wire (`ohq6_probe`, `ohq8_probe`), to show where the quality/bytes curve
bends.
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

from bench._common import machine

log = logging.getLogger("bench.codec")

TARGET_RATIO = 0.20
TARGET_AGREEMENT = 0.995
TARGET_PPL_RATIO = 1.005


def _ohq_probe(bits: int) -> Any:
    from protocol.frames import decode_ohq, encode_ohq

    return lambda a: decode_ohq(encode_ohq(a, bits), a.size, bits).reshape(a.shape)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--parts", type=int, default=3)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    import torch

    from node.model.evaluate import codec_quality, codec_roundtrip, heldout_text
    from node.model.head import ClientHead
    from node.model.prepare import prepare
    from node.model.shard import ShardModel
    from protocol.frames import CODECS, COMPRESSED_CODEC, body_size, ohq_block_bytes

    torch.set_num_threads(1)
    started = time.monotonic()
    path = prepare(model=args.model, parts=args.parts, quant="none", progress=log.info)
    head = ClientHead.load(path, device="cpu")
    shards = [ShardModel.load(path, k, device="cpu") for k in range(args.parts)]
    hidden = shards[0].hidden_size
    lossy = [c for c in CODECS if c != "raw"]
    table = {c: codec_roundtrip(c) for c in lossy}
    table["fp16"] = lambda a: a.astype(np.float16).astype(np.float32)
    table["ohq6_probe"] = _ohq_probe(6)
    table["ohq8_probe"] = _ohq_probe(8)
    ratios = {c: body_size("float32", c, hidden) / (hidden * 4) for c in lossy}
    ratios["fp16"] = 0.5
    blocks = -(-hidden // 64)
    for bits in (6, 8):
        ratios[f"ohq{bits}_probe"] = blocks * ohq_block_bytes(bits) / (hidden * 4)
    log.info("teacher-forced quality of %s over the held-out text", list(table))
    metrics: dict[str, Any] = codec_quality(head, shards, heldout_text(), table)
    for name, ratio in ratios.items():
        metrics[f"ratio_activation_bytes_{name}_vs_fp32"] = round(ratio, 4)
        metrics[f"activation_bytes_per_token_{name}"] = round(ratio * hidden * 4)
    metrics["activation_bytes_per_token_raw"] = hidden * 4
    one = np.random.default_rng(0).standard_normal((1, 1, hidden)).astype(np.float32)
    for name in lossy:  # CPU cost of encode + decode of one decode-step row
        roundtrip = table[name]
        roundtrip(one)
        t0 = time.perf_counter()
        for _ in range(200):
            roundtrip(one)
        metrics[f"roundtrip_us_per_token_{name}"] = round((time.perf_counter() - t0) / 200 * 1e6)
    metrics["compressed_codec"] = COMPRESSED_CODEC
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
            "wire_boundaries": args.parts + 1,
            "text": "node/model/data/heldout.txt (teacher-forced, one pass)",
            "torch_threads": 1,
            "note": "quality figures are deterministic; wall_s is from a shared, loaded 2-core box",
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
