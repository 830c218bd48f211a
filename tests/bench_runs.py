"""Running a benchmark as docs/ and the README tell a person to, and checking what it prints:
`.venv/bin/python bench/NAME.py ...` from the repository root with no PYTHONPATH, one JSON object
of the ../shared/BENCHMARKS.md shape on stdout. Used by tests/integration/test_bench_smoke.py and
by the e2e test that measures the shared devnet (tests/e2e/test_devnet.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the interpreter the docs name; a checkout without .venv (the suite run by another python) uses
# the one running the tests
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable


def bench_env() -> dict[str, str]:
    """The caller's environment as a person's shell has it: no PYTHONPATH (a bench finds its
    repository by itself), OMP threads that yield the shared cores."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "OMP_WAIT_POLICY": "PASSIVE"}


def is_metric_value(value: object) -> bool:
    """A finite int or float, null, or a list of those (a spread: [min, max] of repeats)."""
    if value is None:
        return True
    if isinstance(value, list):
        return all(is_metric_value(item) and not isinstance(item, list) for item in value)
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def one_benchmark_object(
    completed: subprocess.CompletedProcess[str], name: str, *, flat: bool = True
) -> None:
    """A bench run exited 0 and printed exactly one benchmark object; with `flat`, every metric
    is a finite number, a spread or null."""
    tail = completed.stderr[-3000:]
    assert completed.returncode == 0, f"{name} exited {completed.returncode}:\n{tail}"
    try:
        body = json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError(f"{name}: stdout is not one JSON object ({error})") from None
    assert isinstance(body, dict), f"{name}: stdout is not a JSON object"
    assert {"bench", "machine", "config", "metrics"} <= set(body), sorted(body)
    assert isinstance(body["metrics"], dict) and body["metrics"], f"{name}: no metrics"
    assert isinstance(body["machine"], dict) and isinstance(body["config"], dict)
    wrong = {k: v for k, v in body["metrics"].items() if flat and not is_metric_value(v)}
    assert not wrong, f"{name}: metrics that are not finite numbers, spreads or null: {wrong}"


def run_bench(name: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/python bench/NAME.py ARGS` as a person runs it (cwd the repository root)."""
    return subprocess.run(
        [PYTHON, f"bench/{name}.py", *args],
        cwd=ROOT,
        env=bench_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
