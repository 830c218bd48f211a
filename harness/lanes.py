"""Lanes: one pytest run split into N processes that run side by side (deploy/test.sh).

Each lane is `pytest tests -p harness.lanes` with `PLANET_LANE=I/N` and `PLANET_LANE_GATE=DIR`
(a folder the lanes share) in its environment. Every lane collects the same tests and cuts them
into the same units; then each lane takes units from one queue (`DIR/queue.json`, under a lock)
until none is left: the longest unit no lane has taken first, by `tests/durations.json`
(seconds per unit, from a full run's JUnit files: `python -m harness.lanes record LANE.xml... >
tests/durations.json`; a unit that file does not know gets a default by its folder). Taking
from a queue rather than from a plan made up front, a lane that runs slower than the file says
takes fewer units, so the lanes end together and the run ends on short units. Each lane logs
how many tests it ran of how many; `python -m harness.lanes check LOG...` checks that they sum
to every collected test.

Units:
- a test module (its module- and session-scoped fixtures are set up once, in one lane);
- each test of the modules in `SPLIT` on its own (independent runs without shared fixtures:
  the benchmark smokes);
- the modules in one `TOGETHER` group as one unit (they share a session-scoped network).

deploy/test.sh runs each lane in its own network namespace, so the lanes' servers, devnets and
fixed ports never meet.

Memory: the heaviest units hold 2-4 GB at their peak beyond what their zygote shares
(harness/unit_meter.py measures it in every metered run). Units listed in `WEIGHTS_GB` take their
weight from one budget shared by the lanes (`DIR/gate.json`) before their first test and give it
back after their last. A lane takes the longest unit that fits the budget now, and waits (and
says how long at the end) only when no unit left fits.

Prerequisite: with `PLANET_LANE_AFTER=PREFIX`, a lane collects its tests, then runs none until
`PREFIX.ready` exists (deploy/test.sh compiles the contracts meanwhile: the devnets deploy
them), and stops with the reason when `PREFIX.failed` does.

CPU and memory: as root, each unit runs in cgroups of its own (harness/unit_meter.py), so the
run ends with the CPU seconds and the memory peak of every unit, its servers and devnets
included (`python -m harness.unit_meter DIR`).
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

from harness.unit_meter import UnitMeter

DURATIONS = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
SPLIT = frozenset({"tests/integration/test_bench_smoke.py"})
# tests/e2e/conftest.py's `shared_devnet` (one per session): its modules in one lane
SHARED_DEVNET = frozenset(
    {
        "tests/e2e/test_dapp.py",
        "tests/e2e/test_devnet.py",
        "tests/e2e/test_rebalance_devnet.py",
        "tests/e2e/test_second_model_devnet.py",
        "tests/e2e/test_span_devnet.py",
    }
)
# tests/integration/conftest.py's `plain_circuits` (one per session): the 2-part circuit serves
# test_codec_http, test_overlay_nodes and test_pipeline_http, the uneven 3-part one
# test_pipeline_http then test_speculation_nodes (collection order: by name). Apart, in other
# lanes or in another order in one, each module started its own (up to 7 node processes more,
# ~3.4 CPU-s each).
PLAIN_CIRCUITS = frozenset(
    {
        "tests/integration/test_codec_http.py",
        "tests/integration/test_overlay_nodes.py",
        "tests/integration/test_pipeline_http.py",
        "tests/integration/test_speculation_nodes.py",
    }
)
TOGETHER = (SHARED_DEVNET, PLAIN_CIRCUITS)


def group_unit(group: frozenset[str]) -> str:
    """The name of the unit a group of modules runs as."""
    return " + ".join(sorted(group))


DEFAULT_S = {"tests/unit": 0.1, "tests/dapp": 0.5, "tests/integration": 10.0, "tests/e2e": 60.0}
UNKNOWN_S = 5.0
# GB a unit takes from the budget; every other unit is taken as fitting beside them. These are
# well above what the units hold: harness/unit_meter.py's peaks (clean clones, 2-core 23 GiB
# machine, 2026-12-07) were 3.1-3.9 GB for the verification devnet, 2.0-2.2 for the hosts and
# shared devnets, under 0.8 for the rest here, 1.8-2.0 at most for any unit not listed. They
# are kept so because they also keep the verification and hosts devnets apart (12 + 9 GB do
# not fit a 23 GiB machine's budget): weights from the peaks (4, 3, 3 GB) let the three
# devnets start together, and that run took 1,151 s against 1,032 with these (its units 1,960
# CPU-s against 1,744: a devnet costs CPU for as long as it runs, and contention stretches it),
# one run each.
WEIGHTS_GB = {
    "tests/e2e/test_verification_devnet.py": 12.0,  # 4 verifiers, 6 nodes, the gateway
    "tests/e2e/test_devnet_hosts.py": 9.0,  # 4 verifiers, 3 nodes, the gateway
    # the shared devnet: 3 nodes, joiners, a moving node, Chromium
    group_unit(SHARED_DEVNET): 5.0,
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
            return group_unit(group)
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
    folder = os.environ.get("PLANET_LANE_GATE", "")
    if not folder:
        raise pytest.UsageError("PLANET_LANE needs PLANET_LANE_GATE: the lanes' shared folder")
    nodeids = [item.nodeid for item in items]
    expected = expected_seconds(nodeids, known_durations())
    grouped: dict[str, list[pytest.Item]] = {}
    for item in items:
        grouped.setdefault(unit_of(item.nodeid), []).append(item)
    _LANE.index, _LANE.count, _LANE.total = index, count, len(items)
    _LANE.gate = Gate(Path(folder), index)
    _LANE.queue = Queue(Path(folder), index)
    _LANE.meter = UnitMeter.open(Path(folder), index)
    _LANE.units = [
        Unit(name, grouped[name], WEIGHTS_GB.get(name, 0.0)) for name in queue_order(expected)
    ]


@dataclass
class Unit:
    """Tests that run together in one lane, and the memory they hold (GB, 0 if not weighed)."""

    name: str
    items: list[pytest.Item]
    weight: float


@dataclass
class _Lane:
    """This lane's place, gate, queue and meter, and every unit in the order lanes take them."""

    index: int = 0
    count: int = 1
    total: int = 0
    ran: int = 0
    waited_after_s: float = 0.0  # for PLANET_LANE_AFTER's prerequisite, after collecting
    gate: Gate | None = None
    queue: Queue | None = None
    meter: UnitMeter | None = None
    units: list[Unit] = field(default_factory=list)


_LANE = _Lane()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Take units from the lanes' shared queue until none is left, each whole (its tests in
    order, so its fixtures are set up once). The next unit is taken before the current one's
    last test, which tears down what the next does not share."""
    gate, queue = _LANE.gate, _LANE.queue
    if gate is None or queue is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    after = os.environ.get("PLANET_LANE_AFTER", "")
    if after:
        _LANE.waited_after_s = wait_for_prerequisite(Path(after))
    current = queue.take(_LANE.units, gate)
    while current is not None:
        if current.weight:
            gate.take(current.weight)
        if _LANE.meter is not None:
            _LANE.meter.enter(current.name)
        following = None
        for position, item in enumerate(current.items):
            if position + 1 < len(current.items):
                nextitem: pytest.Item | None = current.items[position + 1]
            else:
                following = queue.take(_LANE.units, gate)
                nextitem = following.items[0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            _LANE.ran += 1
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        if current.weight:
            gate.give_back()
        current = following
    return True


def wait_for_prerequisite(prefix: Path, poll_s: float = 0.2, limit_s: float = 1800.0) -> float:
    """Seconds waited until `PREFIX.ready` exists; `pytest.exit` (naming `PREFIX.failed`'s
    text) when that exists instead, or after `limit_s`."""
    started = time.monotonic()
    ready, failed = Path(f"{prefix}.ready"), Path(f"{prefix}.failed")
    if not ready.exists():  # said at once: whoever watches the run sees why the lane is idle
        print(f"lane collected; waiting for {ready.name}", file=sys.stderr, flush=True)
    while not ready.exists():
        if failed.exists():
            reason = failed.read_text(errors="replace").strip() or "no reason given"
            pytest.exit(f"lane stopped before its first test: {failed.name}: {reason}", 3)
        if time.monotonic() - started > limit_s:
            pytest.exit(f"lane stopped before its first test: no {ready.name} in {limit_s:g} s", 3)
        time.sleep(poll_s)
    return time.monotonic() - started


def queue_order(expected: dict[str, float]) -> list[str]:
    """Every unit, longest first (ties by name): the order the lanes take them in, so the
    run ends on short units whatever the lanes' speeds."""
    return sorted(expected, key=lambda unit: (-expected[unit], unit))


class Queue:
    """Which lane took which unit: a JSON file {unit: lane} beside the gate's, changed under the
    same lock. Every lane collects the same units and takes the first one no lane has taken
    (in `queue_order`), so together the lanes run each unit exactly once."""

    def __init__(self, folder: Path, lane: int) -> None:
        self.lock, self.state, self.lane = folder / "gate.lock", folder / "queue.json", lane

    def take(self, units: Sequence[Unit], gate: Gate) -> Unit | None:
        """The first unit not taken that needs no memory or fits the gate now; else the first
        not taken (its lane then waits for the budget); None when every unit is taken."""
        with open(self.lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            taken = json.loads(self.state.read_text()) if self.state.is_file() else {}
            free = [unit for unit in units if unit.name not in taken]
            if not free:
                return None
            fitting = next(
                (u for u in free if not u.weight or gate.fits(u.weight, locked=True)), None
            )
            chosen = fitting or free[0]
            if fitting is not None and fitting.weight:
                # held for it from now, not from its first test: another lane choosing while
                # this lane's current unit ends would otherwise see the budget free, take a
                # unit that does not fit beside this one, and wait for memory (225 s of a lane
                # in one run) where a unit that fits was left
                gate.reserve(fitting.weight)
            taken[chosen.name] = self.lane
            self.state.write_text(json.dumps(taken))
            return chosen


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _LANE.gate is None:
        return
    terminalreporter.write_line(f"lane waited {_LANE.gate.waited_s:.0f} s for memory")
    if os.environ.get("PLANET_LANE_AFTER"):
        terminalreporter.write_line(
            f"lane waited {_LANE.waited_after_s:.0f} s after collecting for "
            f"{Path(os.environ['PLANET_LANE_AFTER']).name}.ready"
        )
    # the line `check` sums: the lanes together must have run every collected test once
    line = f"lane {_LANE.index}/{_LANE.count}: {_LANE.ran} of {_LANE.total} tests"
    terminalreporter.write_line(line)
    if _LANE.meter is not None:
        _LANE.meter.leave()


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
    """The lanes' shared memory budget: a JSON file of {lane: GB held, "lane/next": GB held for
    the unit the lane takes next}, read and written under an exclusive lock on its folder's
    lock file. A lane's own entries never keep its own units out (its current unit ends before
    the next starts)."""

    def __init__(self, folder: Path, lane: int) -> None:
        self.lock, self.state, self.lane = folder / "gate.lock", folder / "gate.json", str(lane)
        self.waited_s = 0.0

    def fits(self, gb: float, *, locked: bool = False) -> bool:
        """Whether `gb` would be taken now (nothing is taken). `locked`: the caller already
        holds the folder's lock (the queue choosing a unit)."""
        if locked:
            return self._decide(self._held(), gb)
        return self._update(None, gb, dry=True)

    def _held(self) -> dict[str, float]:
        return json.loads(self.state.read_text()) if self.state.is_file() else {}

    def _decide(self, held: dict[str, float], gb: float) -> bool:
        others = sum(v for k, v in held.items() if k.split("/")[0] != self.lane)
        if others and others + gb > budget_gb():
            return False
        # something outside the lanes may hold the memory (another run)
        return available_gb() >= gb + SPARE_GB or self.waited_s >= WAIT_S

    def _update(
        self, change: dict[str, float] | None, fits: float | None, dry: bool = False
    ) -> bool:
        with open(self.lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = self._held()
            if fits is not None and not self._decide(held, fits):
                return False
            if dry:
                return True
            held.pop(self.lane, None)
            if change:  # taking: the unit's reservation becomes what the lane holds
                held.pop(f"{self.lane}/next", None)
                held.update(change)
            self.state.write_text(json.dumps(held))
            return True

    def reserve(self, gb: float) -> None:
        """Hold `gb` for the unit this lane takes next (the caller holds the folder's lock:
        the queue choosing it)."""
        held = self._held()
        held[f"{self.lane}/next"] = gb
        self.state.write_text(json.dumps(held))

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
