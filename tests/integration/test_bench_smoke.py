"""Every benchmark still runs as docs/ and the README tell a person to run it: each
`.venv/bin/python bench/NAME.py --quick` (tiny sizes, one repeat, no extra arguments), as its own
process from the repository root with no PYTHONPATH, exits 0 and prints exactly one JSON object of
the BENCHMARKS.md shape (`bench`, `machine`, `config`, `metrics`) on stdout, every metric a finite
number, a list of them (a spread) or null (NOT_FLAT_YET aside). And `npx hardhat run bench/gas.js`.

Benches share the prepared SmolLM2 shards in $PLANET_HOME/models (prepared on first use, as the
benches themselves do). Those that start whole networks (CometBFT validators, anvil, node
processes, the devnet) or ezkl are also marked slow. A bench added without a row here fails
`test_every_bench_has_a_smoke_run`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SLOW = pytest.mark.slow
E2E_LANE = pytest.mark.e2e_lane  # deploy/test.sh: the devnet's ports, or evening the two lanes

# bench -> marks; each runs as `bench/NAME.py --quick`, nothing more
SMOKE: dict[str, tuple[pytest.MarkDecorator, ...]] = {
    "abci_tx_cost": (),
    "codec": (),
    "credits": (),
    "credit_wallet": (),  # real files and fsyncs, ~1 s
    "committee": (SLOW,),
    "concurrency": (SLOW, E2E_LANE),
    "devnet": (SLOW, E2E_LANE),  # `planet devnet up`: the devnets' ports
    "epoch": (),
    "evm_client": (),
    "gateway": (SLOW, E2E_LANE),
    "gpu_sweep": (),
    "links": (SLOW,),
    "paid_circuit": (),  # two tiny in-process nodes
    "pipeline": (SLOW, E2E_LANE),
    "resilience": (SLOW, E2E_LANE),  # 9 node processes
    "route_capture": (),  # the real Router in process, no sockets, ~1 s
    "served": (),
    "settlement": (),
    "spotcheck_cost": (),
    "spotcheck_detection": (),
    "threshold_credits": (),  # in process, no ports
    "verification": (),  # in process, no ports: in the shorter lane
    "verifier_honest": (SLOW,),  # in process, no ports: evens the lanes
    "wan": (SLOW,),  # 3 node processes behind delaying proxies, 0 and 20 ms links
    "zk": (SLOW, E2E_LANE),
}
TIMEOUT_S = 900
# Benches whose metrics still hold text, nested lists or dicts (a per-latency table, a codec's
# name, [start, end] load pairs): every other bench's metrics must be flat numbers. Take a name
# out once its metrics are (issue 41).
NOT_FLAT_YET = frozenset({"links", "pipeline", "resilience", "wan"})
# the interpreter the docs name; a checkout without .venv (the suite run by another python) uses
# the one running the tests
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable


def _env() -> dict[str, str]:
    """The caller's environment as a person's shell has it: no PYTHONPATH (a bench finds its
    repository by itself), OMP threads that yield the shared cores."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "OMP_WAIT_POLICY": "PASSIVE"}


def _is_metric_value(value: object) -> bool:
    """A finite int or float, null, or a list of those (a spread: [min, max] of repeats)."""
    if value is None:
        return True
    if isinstance(value, list):
        return all(_is_metric_value(item) and not isinstance(item, list) for item in value)
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _one_benchmark_object(
    completed: subprocess.CompletedProcess[str], name: str, *, flat: bool = True
) -> None:
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
    wrong = {k: v for k, v in body["metrics"].items() if flat and not _is_metric_value(v)}
    assert not wrong, f"{name}: metrics that are not finite numbers, spreads or null: {wrong}"


def test_every_bench_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SMOKE)
    assert set(SMOKE) >= NOT_FLAT_YET


def test_metric_values_are_finite_numbers_spreads_or_null() -> None:
    for good in (0, 1.5, -2, None, [0.1, 0.9], []):
        assert _is_metric_value(good), good
    for bad in ("hq9", True, float("nan"), float("inf"), {"a": 1}, [[1, 2]], ["x"], [True]):
        assert not _is_metric_value(bad), bad


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks, id=name) for name, marks in SMOKE.items()]
)
def test_bench_quick_run_prints_one_benchmark_object(name: str) -> None:
    completed = subprocess.run(
        [PYTHON, f"bench/{name}.py", "--quick"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _one_benchmark_object(completed, name, flat=name not in NOT_FLAT_YET)
    assert json.loads(completed.stdout)["bench"] == name


def test_bench_gas_js_under_hardhat_prints_one_benchmark_object() -> None:
    npx = shutil.which("npx") or "npx"
    compiled = subprocess.run(  # as gas.js says: compile first (its log goes to stdout)
        [npx, "hardhat", "compile", "--quiet"], cwd=ROOT, capture_output=True, timeout=TIMEOUT_S
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    completed = subprocess.run(
        [npx, "hardhat", "run", "bench/gas.js"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    _one_benchmark_object(completed, "gas")
