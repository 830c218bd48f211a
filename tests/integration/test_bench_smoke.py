"""Every benchmark still runs as docs/ and the README tell a person to run it: each
`.venv/bin/python bench/NAME.py --quick` (tiny sizes, one repeat, no extra arguments), as its own
process from the repository root with no PYTHONPATH, exits 0 and prints exactly one JSON object of
the BENCHMARKS.md shape (`bench`, `machine`, `config`, `metrics`) on stdout, every metric a finite
number, a list of them (a spread) or null (NOT_FLAT_YET aside). And `npx hardhat run bench/gas.js`
with PLANET_BENCH_QUICK=1 (its smoke run: `hardhat run` passes no arguments).

Benches share the prepared SmolLM2 shards in $PLANET_HOME/models (prepared on first use, as the
benches themselves do). Those that start whole networks (CometBFT validators, anvil, node
processes, the devnet) or ezkl are also marked slow. A bench added without a row here fails
`test_every_bench_has_a_smoke_run`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.bench_runs import bench_env, is_metric_value, one_benchmark_object, run_bench

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
    "decode": (SLOW,),  # 6 × 3 SmolLM2 shards (fp32, int8; 4 paths) in process, 1 thread, no ports
    "committee": (SLOW,),
    "concurrency": (SLOW, E2E_LANE),
    "epoch": (),
    "evm_client": (),
    "gateway": (SLOW, E2E_LANE),
    "gpu_sweep": (),
    "hop_probe_cost": (),  # 2 SmolLM2 int8 shards in process, no ports, ~5 s
    "int8_kernel": (SLOW,),  # 5 SmolLM2 shard sets (3 quants) in process, no ports (~14 CPU-s)
    "links": (SLOW,),
    "overlay": (SLOW,),  # cloves in process; 2 node and 8 relay processes at 0 ms, ~12 s
    "paid_circuit": (),  # two tiny in-process nodes
    "pipeline": (SLOW,),  # its --quick takes ports from PLANET_TEST_PORTS
    "placement": (),  # in process: the placement and rebalancing rules, no torch, < 1 s
    "prefix": (),  # 3 SmolLM2 shards in process with the node's prefix caches, no ports, ~10 s
    "query_cost": (),  # the in-process app, 200 registrations, ~2 s
    "resilience": (SLOW, E2E_LANE),  # 9 node processes
    "route_capture": (),  # the real Router in process, no sockets, ~1 s
    "served": (),
    "settlement": (),
    "spotcheck_cost": (),
    "spotcheck_detection": (),
    "start_cpu": (),  # 3 fresh interpreters importing web3, ~3 CPU-s
    "threshold_credits": (),  # in process, no ports
    "verification": (),  # in process, no ports: in the shorter lane
    "verifier_honest": (SLOW,),  # a verifier network (harness/verifier_net.py): evens the lanes
    "wan": (SLOW,),  # 3 node processes behind delaying proxies, 0 and 20 ms links
    "wire_dtype": (SLOW,),  # 3 SmolLM2 shards in process, no ports, ~10 s
    "zk": (SLOW, E2E_LANE),
    "zygote_start": (SLOW,),  # 2 node processes and a zygote, ~10 CPU-s
}
TIMEOUT_S = 900
# Benches smoked elsewhere, against a network the suite already runs: bench/devnet.py --quick
# --devnet measures the session's shared devnet (a devnet of its own costs ~80 s of set-up).
SMOKED_ELSEWHERE = {
    "devnet": "tests/e2e/test_devnet.py::test_bench_devnet_quick_measures_the_shared_devnet",
}
# Benches whose metrics still hold text, nested lists or dicts (a per-latency table, a codec's
# name, [start, end] load pairs): every other bench's metrics must be flat numbers. Take a name
# out once its metrics are (issue 41).
NOT_FLAT_YET = frozenset({"links", "pipeline", "resilience", "wan"})


def test_every_bench_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SMOKE) | set(SMOKED_ELSEWHERE)
    assert not set(SMOKE) & set(SMOKED_ELSEWHERE)
    assert set(SMOKE) >= NOT_FLAT_YET


def test_metric_values_are_finite_numbers_spreads_or_null() -> None:
    for good in (0, 1.5, -2, None, [0.1, 0.9], []):
        assert is_metric_value(good), good
    for bad in ("hq9", True, float("nan"), float("inf"), {"a": 1}, [[1, 2]], ["x"], [True]):
        assert not is_metric_value(bad), bad


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=marks, id=name) for name, marks in SMOKE.items()]
)
def test_bench_quick_run_prints_one_benchmark_object(name: str) -> None:
    completed = run_bench(name, "--quick", timeout_s=TIMEOUT_S)
    one_benchmark_object(completed, name, flat=name not in NOT_FLAT_YET)
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
        env={**bench_env(), "PLANET_BENCH_QUICK": "1"},  # its --quick (`hardhat run` takes none)
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    one_benchmark_object(completed, "gas")
