"""CPU seconds a fresh interpreter spends importing the EVM stack (web3), with and without
node/lazy_bls.py's finder (py_ecc's pairing tables built at import, or not).

Each repeat runs `python -c CODE` and reads the child's user + system CPU from `resource`.
Prints one JSON object (BENCHMARKS.md); CPU, not wall: the machine is shared.

    .venv/bin/python bench/start_cpu.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # metric name prefix -> the child's code
    "bare_interpreter": "pass",
    "web3_py_ecc_tables_built": "import web3",
    "node_web3_lazy_bls": "import node, web3",
}


def child_cpu_s(code: str) -> float:
    """User + system CPU seconds of one `python -c code`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_with_quick(parser, {"repeats": 1}, argv)
    metrics: dict[str, object] = {}
    for name, code in CASES.items():
        runs = [child_cpu_s(code) for _ in range(args.repeats)]
        metrics[f"{name}_cpu_s"] = round(median(runs), 3)
        metrics[f"{name}_cpu_s_spread"] = spread(runs, 3)
    config = {"repeats": args.repeats, "cases": CASES}
    print(json.dumps({"bench": "start_cpu", "machine": machine(), "config": config,
                      "metrics": metrics}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
