"""The client's credit file under payment (node/client/credit_wallet.py): one JSON object.

Paying takes one credit per charging hop and chunk of positions while an answer runs, so a take
sits on the answer's critical path. For wallets of --sizes credits (threshold BLS: 88 bytes,
176 hex chars each on disk) it times --takes takes of one credit by the same wallet
(`take_ms_<n>`, the paying client's case: the parsed file stays cached) and the first take of
a fresh reader (`first_take_ms_<n>`: a new process parses the file once), and reports the
file's size. Medians; the spread of the repeated takes is kept. Real files and fsyncs in a
temporary directory, so the disk's fsync time is most of a take.

    .venv/bin/python bench/credit_wallet.py          # ~10 s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread
from node.client.credit_wallet import CreditWallet
from protocol import bls
from protocol.blind_bls import ThresholdCredit

SIGMA = bls.g1_bytes(bls.g1_generator())  # a valid point: the file is parsed strictly


def _credits(count: int) -> list[ThresholdCredit]:
    return [ThresholdCredit(5, os.urandom(32), SIGMA) for _ in range(count)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            path = Path(tmp) / f"credits-{size}.json"
            wallet = CreditWallet(path)
            wallet.add(_credits(size))
            times = []
            for _ in range(args.takes):
                started = time.perf_counter()
                wallet.take(1)
                times.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            CreditWallet(path).take(1)
            metrics[f"take_ms_{size}"] = round(median(times), 3)
            metrics[f"take_ms_{size}_spread"] = spread(times, 3)
            metrics[f"first_take_ms_{size}"] = round((time.perf_counter() - started) * 1000, 3)
            metrics[f"file_bytes_{size}"] = path.stat().st_size
    return {
        "bench": "credit_wallet",
        "machine": machine(),
        "config": {"sizes": args.sizes, "takes": args.takes, "form": "threshold BLS"},
        "metrics": metrics,
        "targets": {},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[100, 1000, 5000],
        help="wallet sizes in credits, comma-separated (100,1000,5000)",
    )
    parser.add_argument("--takes", type=int, default=20, help="takes timed per size (20)")
    args = parse_with_quick(parser, {"sizes": [10, 100], "takes": 3}, argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
