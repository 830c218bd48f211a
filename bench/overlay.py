"""The overlay's clove layer (protocol.sida, (n, k) S-IDA) in-process: one JSON object.

Per message size (a token's text, a batch of tokens, a prompt, a long prompt):

- `clove_prepare_ms_{size}`: disperse (pad, AES-256-GCM, Reed–Solomon IDA through zfec,
  GF(2^8) Shamir of the key, digests), CPU time per message;
- `clove_recover_ms_{size}`: k cloves back to the message (digest checks, Shamir, IDA decode,
  AES-GCM), CPU time per message;
- `wire_bytes_{size}`: the n cloves' bytes on the wire, and `ratio_wire_bytes_vs_ideal_{size}`:
  those bytes ÷ (n/k × the message's bytes), the seed's dispersal cost with nothing added
  (the issue's target: ≤ 1.2 for what the overlay carries, which needs tokens batched into
  messages of a few hundred bytes: a clove's fixed part is its header, n digests and a key share).

The paths through relays, the relays and the hosts-devnet figures of issue 43 (first token and
decode tok/s with and without the overlay at 20 and 50 ms links) are not built yet; this bench
measures the part that is.

    .venv/bin/python bench/overlay.py            # ~5 s
    .venv/bin/python bench/overlay.py --quick    # ~1 s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, parse_with_quick
from protocol import sida

SIZES = {"token": 6, "batch16": 96, "prompt": 1000, "long": 16000}


def per_message_ms(action, repeats: int, inner: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(inner):
            action()
        samples.append((time.process_time() - start) * 1000 / inner)
    return round(median(samples), 4)


def measure(size: int, n: int, k: int, repeats: int, inner: int) -> dict[str, float]:
    message = bytes(i % 251 for i in range(size))
    cloves = sida.disperse(message, n, k)
    assert sida.recover(cloves[n - k :]) == message
    wire = sum(len(c.to_bytes()) for c in cloves)
    return {
        "prepare": per_message_ms(lambda: sida.disperse(message, n, k), repeats, inner),
        "recover": per_message_ms(lambda: sida.recover(cloves[n - k :]), repeats, inner),
        "wire": wire,
        "ratio": round(wire / (n / k * size), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4, help="cloves per message (seed: 4)")
    parser.add_argument("--k", type=int, default=3, help="cloves needed (seed: 3)")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats")
    parser.add_argument("--inner", type=int, default=200, help="messages per timed repeat")
    args = parse_with_quick(parser, {"repeats": 3, "inner": 20}, argv)
    metrics: dict[str, float] = {}
    for name, size in SIZES.items():
        got = measure(size, args.n, args.k, args.repeats, args.inner)
        metrics[f"clove_prepare_ms_{name}"] = got["prepare"]
        metrics[f"clove_recover_ms_{name}"] = got["recover"]
        metrics[f"wire_bytes_{name}"] = got["wire"]
        metrics[f"ratio_wire_bytes_vs_ideal_{name}"] = got["ratio"]
    body: dict[str, Any] = {
        "bench": "overlay",
        "machine": machine(),
        "config": {
            "n": args.n,
            "k": args.k,
            "message_bytes": SIZES,
            "repeats": args.repeats,
            "inner": args.inner,
            "parts": "cloves only (paths, relays and the hosts devnet: not built)",
            "quick": args.quick,
        },
        "metrics": metrics,
        "targets": {
            "clove_prepare_ms_prompt": {"op": "<=", "value": 0.3},
            "clove_recover_ms_prompt": {"op": "<=", "value": 0.3},
            "ratio_wire_bytes_vs_ideal_prompt": {"op": "<=", "value": 1.2},
        },
    }
    print(json.dumps(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
