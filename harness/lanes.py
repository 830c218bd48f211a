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

Memory: a python process that imports torch (the CUDA build) holds ~300 MB of its own before it
loads a weight, so a devnet with verifiers holds 10+ GB. Units listed in `WEIGHTS_GB` take their
weight from one budget shared by the lanes (`PLANET_LANE_GATE`: a folder for the budget's file)
before their first test and give it back after their last; a lane whose next unit does not fit
waits (and says how long at the end). An even lane runs its heavy units first, an odd lane
last, so they rarely wait.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
SPLIT = frozenset({"tests/integration/test_bench_smoke.py"})
# tests/e2e/conftest.py's `shared_devnet` (one per session): its modules in one lane
TOGETHER = (frozenset({"tests/e2e/test_dapp.py", "tests/e2e/test_devnet.py"}),)
DEFAULT_S = {"tests/unit": 0.1, "tests/dapp": 0.5, "tests/integration": 10.0, "tests/e2e": 60.0}
UNKNOWN_S = 5.0
HEAVY_FOLDER, HEAVY_S = "tests/e2e/", 100.0  # a whole devnet for this long: see lane_order
# peak GB a unit's processes hold (nodes ~0.9, verifiers ~1.5, gateways ~0.7 each), measured
# on this machine's runs; every other unit is taken as fitting beside them
WEIGHTS_GB = {
    "tests/e2e/test_verification_devnet.py": 12.0,  # 4 verifiers, 6 nodes, the gateway
    "tests/e2e/test_devnet_hosts.py": 9.0,  # 4 verifiers, 3 nodes, the gateway
    "tests/e2e/test_dapp.py + tests/e2e/test_devnet.py": 5.0,  # 3 nodes, joiners, Chromium
    "tests/e2e/test_verifier_network.py": 5.0,  # 3 nodes, a verifier, the gateway
    "tests/e2e/test_spotcheck_network.py": 4.0,
    "tests/e2e/test_local_cli.py": 3.0,
    "tests/integration/test_bench_smoke.py::"
    "test_bench_quick_run_prints_one_benchmark_object[resilience]": 8.0,  # 9 nodes
}
RESERVED_GB = 9.0  # the lanes' own pytest processes and the units not weighed
SPARE_GB = 2.0  # free beyond a unit's weight before it starts
WAIT_S = 900.0  # after this long a unit starts when the budget fits it, whatever is free


def parse_lane(text: str) -> tuple[int, int]:
    """`I/N` -> (I, N), 0 <= I < N."""
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


def expected_seconds(nodeids: Sequence[str], known: dict[str, float]) -> dict[str, float]:
    """Seconds each unit of `nodeids` is expected to take: `known`'s, or its tests' defaults."""
    expected: dict[str, float] = defaultdict(float)
    for nodeid in nodeids:
        unit = unit_of(nodeid)
        if unit in known:
            expected[unit] = known[unit]
        else:
            expected[unit] += default_seconds(nodeid)
    return dict(expected)


def plan(nodeids: Sequence[str], lanes: int, known: dict[str, float]) -> dict[str, int]:
    """Unit -> lane for the units of `nodeids`, longest-first by `known` seconds per unit."""
    expected = expected_seconds(nodeids, known)
    load = [0.0] * lanes
    assigned: dict[str, int] = {}
    for unit in sorted(expected, key=lambda u: (-expected[u], u)):
        lane = min(range(lanes), key=lambda i: (load[i], i))
        assigned[unit] = lane
        load[lane] += expected[unit]
    return assigned


def lane_order(units: Sequence[str], expected: dict[str, float], index: int) -> list[str]:
    """`units` (one lane's, in collection order) with its devnets placed so that the lanes do
    not all hold one at once: an even lane runs its heavy units first, an odd lane last. Each
    devnet is ~20 processes and several GB; four at once filled this 23 GiB machine."""
    heavy = [u for u in units if is_heavy(u, expected[u])]
    light = [u for u in units if u not in heavy]
    return heavy + light if index % 2 == 0 else light + heavy


def is_heavy(unit: str, seconds: float) -> bool:
    return unit.startswith(HEAVY_FOLDER) and seconds >= HEAVY_S


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
    nodeids = [item.nodeid for item in items]
    known = known_durations()
    assigned = plan(nodeids, count, known)
    expected = expected_seconds(nodeids, known)
    mine: dict[str, list[pytest.Item]] = {}
    dropped = []
    for item in items:
        unit = unit_of(item.nodeid)
        if assigned[unit] == index:
            mine.setdefault(unit, []).append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    total = len(items)
    items[:] = [item for unit in lane_order(list(mine), expected, index) for item in mine[unit]]
    kept = items
    folder = os.environ.get("PLANET_LANE_GATE", "")
    if folder:
        order = lane_order(list(mine), expected, index)
        _LANE.gate = Gate(Path(folder), index)
        _LANE.units = [(mine[unit], WEIGHTS_GB.get(unit, 0.0)) for unit in order]
    # one line the run's end reads to check that the lanes together ran every test
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = f"lane {index}/{count}: {len(kept)} of {total} tests"
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, file=sys.stderr)


@dataclass
class _Lane:
    """This lane's gate and units (items, GB), once collection chose them."""

    gate: Gate | None = None
    units: list[tuple[list[pytest.Item], float]] = field(default_factory=list)


_LANE = _Lane()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With a gate: run this lane's units one after another, each whole, and when the next
    weighed unit does not fit the memory budget now, run a unit that does first (every unit
    still runs once; a unit's tests keep their order, so its fixtures are set up once)."""
    gate = _LANE.gate
    if gate is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    pending = list(_LANE.units)
    current = _next_unit(pending, gate)
    while current is not None:
        items, weight = current
        if weight:
            gate.take(weight)
        following = None
        for position, item in enumerate(items):
            if position + 1 < len(items):
                nextitem: pytest.Item | None = items[position + 1]
            else:  # the unit's last test: which unit comes next decides what it tears down
                following = _next_unit(pending, gate)
                nextitem = following[0][0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        if weight:
            gate.give_back()
        current = following
    return True


def _next_unit(
    pending: list[tuple[list[pytest.Item], float]], gate: Gate
) -> tuple[list[pytest.Item], float] | None:
    """The first pending unit that needs no memory or fits it now; else the first (its lane
    then waits for the budget). Taken out of `pending`."""
    for position, (_items, weight) in enumerate(pending):
        if not weight or gate.fits(weight):
            return pending.pop(position)
    return pending.pop(0) if pending else None


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _LANE.gate is not None:
        terminalreporter.write_line(f"lane waited {_LANE.gate.waited_s:.0f} s for memory")


def budget_gb() -> float:
    """GB the weighed units may hold at once: the machine's memory less `RESERVED_GB`, and never
    less than the heaviest unit (which then runs alone)."""
    total_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total_kb = int(line.split()[1])
    return max(max(WEIGHTS_GB.values()), total_kb / 2**20 - RESERVED_GB)


def available_gb() -> float:
    """MemAvailable, in GB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


class Gate:
    """The lanes' shared memory budget: a JSON file of {lane: GB held}, read and written under
    an exclusive lock on its folder's lock file."""

    def __init__(self, folder: Path, lane: int) -> None:
        self.lock, self.state, self.lane = folder / "gate.lock", folder / "gate.json", str(lane)
        self.waited_s = 0.0

    def fits(self, gb: float) -> bool:
        """Whether `gb` would be taken now (nothing is taken)."""
        return self._update(None, gb, dry=True)

    def _update(
        self, change: dict[str, float] | None, fits: float | None, dry: bool = False
    ) -> bool:
        with open(self.lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = json.loads(self.state.read_text()) if self.state.is_file() else {}
            others = sum(v for k, v in held.items() if k != self.lane)
            if fits is not None and others and others + fits > budget_gb():
                return False
            if fits is not None and available_gb() < fits + SPARE_GB and self.waited_s < WAIT_S:
                return False  # something outside the lanes holds the memory (another run)
            if dry:
                return True
            held.pop(self.lane, None)
            held.update(change or {})
            self.state.write_text(json.dumps(held))
            return True

    def take(self, gb: float) -> None:
        start, before = time.monotonic(), self.waited_s
        while not self._update({self.lane: gb}, gb):
            time.sleep(1.0)
            self.waited_s = before + time.monotonic() - start
        self.waited_s = before + time.monotonic() - start

    def give_back(self) -> None:
        self._update(None, None)


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
