"""Lanes: one pytest run split into N processes that run side by side (deploy/test.sh).

Each lane is `pytest tests -p harness.lanes` with `PLANET_LANE=I/N` in its environment. Every
lane collects the same tests and computes the same plan from them, then keeps its own share, so
the N lanes together run every collected test exactly once (each lane logs how many it kept of
how many; `python -m harness.lanes check LOG...` sums them).

The plan is longest-first: the units below, heaviest first, each to the lane with the least
expected time so far. Expected times come from `tests/durations.json` (seconds per unit, from a
full run's JUnit files: `python -m harness.lanes record LANE.xml... > tests/durations.json`);
a unit that file does not know gets a default by its folder. A stale file costs balance, never a
test.

Units:
- a test module (its module- and session-scoped fixtures are set up once, in one lane);
- each test of the modules in `SPLIT` on its own (independent runs without shared fixtures:
  the benchmark smokes);
- the modules in one `TOGETHER` group as one unit (they share a session-scoped network).

deploy/test.sh runs each lane in its own network namespace, so the lanes' servers, devnets and
fixed ports never meet.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
SPLIT = frozenset({"tests/integration/test_bench_smoke.py"})
# tests/e2e/conftest.py's `shared_devnet` (one per session): its modules in one lane
TOGETHER = (frozenset({"tests/e2e/test_dapp.py", "tests/e2e/test_devnet.py"}),)
DEFAULT_S = {"tests/unit": 0.1, "tests/dapp": 0.5, "tests/integration": 10.0, "tests/e2e": 60.0}
UNKNOWN_S = 5.0


def parse_lane(text: str) -> tuple[int, int]:
    """"I/N" -> (I, N), 0 <= I < N."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 0 <= int(index) < int(count)):
        raise ValueError(f"PLANET_LANE must be I/N with 0 <= I < N, got {text!r}")
    return int(index), int(count)


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in SPLIT:
        return nodeid
    for group in TOGETHER:
        if module in group:
            return " + ".join(sorted(group))
    return module


def default_seconds(nodeid: str) -> float:
    for folder, seconds in DEFAULT_S.items():
        if nodeid.startswith(folder + "/"):
            return seconds
    return UNKNOWN_S


def plan(nodeids: Sequence[str], lanes: int, known: dict[str, float]) -> dict[str, int]:
    """Unit -> lane for the units of `nodeids`, longest-first by `known` seconds per unit."""
    expected: dict[str, float] = defaultdict(float)
    for nodeid in nodeids:
        unit = unit_of(nodeid)
        if unit not in known:
            expected[unit] += default_seconds(nodeid)
    for unit in {unit_of(n) for n in nodeids}:
        if unit in known:
            expected[unit] = known[unit]
    load = [0.0] * lanes
    assigned: dict[str, int] = {}
    for unit in sorted(expected, key=lambda u: (-expected[u], u)):
        lane = min(range(lanes), key=lambda i: (load[i], i))
        assigned[unit] = lane
        load[lane] += expected[unit]
    return assigned


def known_durations(path: Path = DURATIONS) -> dict[str, float]:
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {str(k): float(v) for k, v in raw.items()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    text = os.environ.get("PLANET_LANE", "")
    if not text:
        return
    index, count = parse_lane(text)
    assigned = plan([item.nodeid for item in items], count, known_durations())
    kept = [item for item in items if assigned[unit_of(item.nodeid)] == index]
    dropped = [item for item in items if assigned[unit_of(item.nodeid)] != index]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    total = len(items)
    items[:] = kept
    # one line the run's end reads to check that the lanes together ran every test
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = f"lane {index}/{count}: {len(kept)} of {total} tests"
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, file=sys.stderr)


def record(junit_files: Iterable[Path]) -> dict[str, float]:
    """Seconds per unit from JUnit XML files (setup, call and teardown of every test case)."""
    seconds: dict[str, float] = defaultdict(float)
    for path in junit_files:
        for case in ET.parse(path).getroot().iter("testcase"):
            module = case.get("classname", "").split(".")
            # classname "tests.e2e.test_devnet" or "tests.e2e.test_devnet.TestX"
            parts = [p for p in module if not p[:1].isupper()]
            file = "/".join(parts) + ".py"
            nodeid = f"{file}::{case.get('name', '')}"
            seconds[unit_of(nodeid)] += float(case.get("time", "0"))
    return {unit: round(s, 1) for unit, s in sorted(seconds.items())}


def check(logs: Iterable[Path]) -> tuple[int, set[int]]:
    """(tests kept by all lanes together, the distinct totals the lanes saw)."""
    kept, totals = 0, set()
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if " tests" in line and line.split(":", 1)[0].startswith("lane "):
                words = line.split()
                kept += int(words[2])
                totals.add(int(words[4]))
    return kept, totals


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["record"] and len(argv) > 1:
        print(json.dumps(record(Path(a) for a in argv[1:]), indent=1, sort_keys=True))
        return 0
    if argv[:1] == ["check"] and len(argv) > 1:
        kept, totals = check(Path(a) for a in argv[1:])
        if len(totals) != 1 or kept != next(iter(totals)):
            print(f"lanes ran {kept} tests; collected {sorted(totals)}", file=sys.stderr)
            return 1
        print(f"lanes ran {kept} of {kept} tests", file=sys.stderr)
        return 0
    print("usage: python -m harness.lanes record LANE.xml... | check LANE.log...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
