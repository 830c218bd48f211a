"""harness/lanes.py: the lanes of deploy/test.sh together run every collected test once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.lanes import (
    PLAIN_CIRCUITS,
    SHARED_DEVNET,
    SPLIT,
    WEIGHTS_GB,
    Gate,
    Queue,
    Unit,
    check,
    parse_lane,
    queue_order,
    record,
    unit_of,
)
from harness.unit_meter import CPU, MEMORY, UnitMeter, hierarchies_root, report, usage
from harness.unit_meter import ROOT as ROOT_GROUPS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

NODEIDS = [
    "tests/unit/test_a.py::test_one",
    "tests/unit/test_a.py::test_two",
    "tests/unit/test_b.py::test_one",
    "tests/integration/test_bench_smoke.py::test_bench_quick_run_prints_one_benchmark_object[zk]",
    "tests/integration/test_bench_smoke.py::test_bench_quick_run_prints_one_benchmark_object[wan]",
    "tests/integration/test_nodes.py::test_x",
    "tests/e2e/test_dapp.py::test_page",
    "tests/e2e/test_devnet.py::test_up",
    "tests/e2e/test_verification_devnet.py::test_slash",
    "tests/e2e/test_local_cli.py::test_up",
]


def _units(names: list[str], weights: dict[str, float] | None = None) -> list[Unit]:
    return [Unit(name, [], (weights or {}).get(name, 0.0)) for name in names]


@pytest.mark.parametrize("lanes", [1, 2, 3, 7])
def test_lanes_taking_from_one_queue_take_every_unit_exactly_once(
    tmp_path: Path, lanes: int, monkeypatch
) -> None:
    monkeypatch.setattr("harness.lanes.available_gb", lambda: 100.0)
    names = sorted({unit_of(n) for n in NODEIDS})
    queues = [Queue(tmp_path, i) for i in range(lanes)]
    gates = [Gate(tmp_path, i) for i in range(lanes)]
    taken: list[str] = []
    for turn in range(len(names) + lanes):  # round robin, as lanes finishing units would
        unit = queues[turn % lanes].take(_units(names), gates[turn % lanes])
        if unit is not None:
            taken.append(unit.name)
    assert sorted(taken) == names
    assert all(q.take(_units(names), g) is None for q, g in zip(queues, gates, strict=True))
    owners = json.loads((tmp_path / "queue.json").read_text())
    assert set(owners) == set(names) and set(owners.values()) <= set(range(lanes))


def test_a_module_is_one_unit_the_smokes_split_and_the_shared_devnet_is_one_unit() -> None:
    units = {n: unit_of(n) for n in NODEIDS}
    assert units["tests/unit/test_a.py::test_one"] == units["tests/unit/test_a.py::test_two"]
    dapp, devnet = "tests/e2e/test_dapp.py::test_page", "tests/e2e/test_devnet.py::test_up"
    assert units[dapp] == units[devnet]
    smokes = [n for n in NODEIDS if "bench_smoke" in n]
    assert {units[n] for n in smokes} == set(smokes)


def test_the_modules_sharing_the_plain_circuits_are_one_unit_in_collection_order() -> None:
    """tests/integration/conftest.py's circuits are kept for the next module of this unit
    (2-part: codec_http -> overlay_nodes -> pipeline_http; uneven 3-part: pipeline_http ->
    speculation_nodes), so the four run in one lane, in that (name) order, and no other module
    joins them."""
    modules = [
        "test_codec_http",
        "test_overlay_nodes",
        "test_pipeline_http",
        "test_speculation_nodes",
    ]
    ids = [f"tests/integration/{m}.py::test_x" for m in modules]
    units = {unit_of(n) for n in ids}
    assert len(units) == 1
    (unit,) = units
    assert unit.split(" + ") == [n.split("::")[0] for n in ids]  # sorted: the collection order
    assert unit_of("tests/integration/test_node_fuzz.py::test_x") == (
        "tests/integration/test_node_fuzz.py"
    )


def test_the_queue_gives_the_longest_unit_first_and_ties_by_name() -> None:
    expected = {"b.py": 5.0, "a.py": 5.0, "long.py": 600.0, "short.py": 0.1}
    assert queue_order(expected) == ["long.py", "a.py", "b.py", "short.py"]


def test_the_queue_passes_over_a_unit_that_does_not_fit_and_gives_it_when_nothing_else_is_left(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("harness.lanes.budget_gb", lambda: 14.0)
    monkeypatch.setattr("harness.lanes.available_gb", lambda: 100.0)
    (tmp_path / "gate.json").write_text('{"1": 12.0}')  # another lane holds a devnet
    units = _units(["devnet.py", "light.py"], {"devnet.py": 9.0})
    queue, gate = Queue(tmp_path, 0), Gate(tmp_path, 0)
    first = queue.take(units, gate)
    second = queue.take(units, gate)
    assert first is not None and second is not None
    assert [first.name, second.name] == ["light.py", "devnet.py"]


def test_parse_lane_refuses_out_of_range() -> None:
    assert parse_lane("2/4") == (2, 4)
    for bad in ("4/4", "-1/4", "a/b", "3", "1/0"):
        with pytest.raises(ValueError):
            parse_lane(bad)


def test_record_sums_each_unit_from_junit(tmp_path: Path) -> None:
    junit = tmp_path / "lane.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_a" name="test_one" time="1.5"/>'
        '<testcase classname="tests.unit.test_a" name="test_two" time="2.0"/>'
        '<testcase classname="tests.unit.test_c.TestGroup" name="test_in_class" time="0.25"/>'
        '<testcase classname="tests.integration.test_bench_smoke" '
        'name="test_bench_quick_run_prints_one_benchmark_object[zk]" time="30"/>'
        "</testsuite></testsuites>"
    )
    assert record([junit]) == {
        "tests/integration/test_bench_smoke.py::"
        "test_bench_quick_run_prints_one_benchmark_object[zk]": 30.0,
        "tests/unit/test_a.py": 3.5,
        "tests/unit/test_c.py": 0.2,
    }


def test_check_fails_when_the_lanes_ran_fewer_than_collected(tmp_path: Path) -> None:
    (tmp_path / "lane0.log").write_text("x\nlane 0/2: 5 of 9 tests\n")
    (tmp_path / "lane1.log").write_text("lane 1/2: 4 of 9 tests\n")
    assert check(sorted(tmp_path.glob("*.log"))) == (9, {9})
    (tmp_path / "lane1.log").write_text("lane 1/2: 3 of 9 tests\n")
    done = subprocess.run(
        [sys.executable, "-m", "harness.lanes", "check", *map(str, tmp_path.glob("*.log"))],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "lanes ran 8 tests; collected [9]" in done.stderr


def test_a_weighed_unit_waits_until_the_budget_fits_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("harness.lanes.budget_gb", lambda: 14.0)
    monkeypatch.setattr("harness.lanes.available_gb", lambda: 100.0)
    first, second = Gate(tmp_path, 0), Gate(tmp_path, 1)
    first.take(12.0)
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (second.take(9.0), taken.set()))
    waiter.start()
    assert not taken.wait(2.5)  # 12 + 9 > 14: the second lane waits
    first.give_back()
    assert taken.wait(5.0)
    waiter.join()
    assert json.loads((tmp_path / "gate.json").read_text()) == {"1": 9.0}
    assert second.waited_s >= 2.0
    first.take(3.0)  # 9 + 3 fits beside it
    assert json.loads((tmp_path / "gate.json").read_text()) == {"1": 9.0, "0": 3.0}


def test_a_weighed_unit_is_held_for_from_when_a_lane_chooses_it(
    tmp_path: Path, monkeypatch
) -> None:
    """Lane 0 chooses the 12 GB unit while it still runs its current one; lane 1 choosing next
    passes over the 8 GB unit (12 + 8 > 14) for a light one instead of taking it and waiting
    for memory while lane 0's unit runs (a lane waited 225 s so in a CI-like run)."""
    monkeypatch.setattr("harness.lanes.budget_gb", lambda: 14.0)
    monkeypatch.setattr("harness.lanes.available_gb", lambda: 100.0)
    units = [
        Unit("verification", [], 12.0),
        Unit("resilience", [], 8.0),
        Unit("light", [], 0.0),
        Unit("other light", [], 0.0),
    ]
    gates = [Gate(tmp_path, 0), Gate(tmp_path, 1)]
    queues = [Queue(tmp_path, 0), Queue(tmp_path, 1)]
    first = queues[0].take(units, gates[0])
    assert first is not None and first.name == "verification"
    second = queues[1].take(units, gates[1])
    assert second is not None and second.name == "light"
    gates[0].take(12.0)  # its first test: the reservation becomes what lane 0 holds
    assert json.loads((tmp_path / "gate.json").read_text()) == {"0": 12.0}
    gates[0].give_back()  # its last test done: the 8 GB unit fits now
    third = queues[1].take(units, gates[1])
    assert third is not None and third.name == "resilience"
    assert json.loads((tmp_path / "gate.json").read_text()) == {"1/next": 8.0}


def test_a_unit_heavier_than_the_budget_runs_alone_instead_of_never(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("harness.lanes.budget_gb", lambda: 10.0)
    monkeypatch.setattr("harness.lanes.available_gb", lambda: 100.0)
    Gate(tmp_path, 0).take(12.0)  # nothing else held: it runs
    assert json.loads((tmp_path / "gate.json").read_text()) == {"0": 12.0}


def test_a_weighed_unit_waits_while_memory_outside_the_lanes_is_short(
    tmp_path: Path, monkeypatch
) -> None:
    free = [3.0]
    monkeypatch.setattr("harness.lanes.budget_gb", lambda: 14.0)
    monkeypatch.setattr("harness.lanes.available_gb", lambda: free[0])
    gate, taken = Gate(tmp_path, 0), threading.Event()
    waiter = threading.Thread(target=lambda: (gate.take(5.0), taken.set()))
    waiter.start()
    assert not taken.wait(2.5)  # 3 GB free < 5 + 2
    free[0] = 8.0
    assert taken.wait(5.0)
    waiter.join()


def test_a_lane_runs_light_units_first_while_its_heavy_one_does_not_fit(tmp_path: Path) -> None:
    """A real pytest run as one lane of one: another lane holds 8 of the 10 GB, so the weighed
    module (first in collection) waits behind the light ones, which free the budget."""
    gate = tmp_path / f"{tmp_path.name}-gate"  # its name names the run's cgroups: unique
    gate.mkdir()
    (gate / "gate.json").write_text('{"7": 8.0}')
    order = tmp_path / "order.txt"
    (tmp_path / "conftest.py").write_text(
        "import harness.lanes as lanes\n"
        "lanes.WEIGHTS_GB = {'test_heavy.py': 5.0}\n"
        "lanes.budget_gb = lambda: 10.0\n"
        "lanes.available_gb = lambda: 100.0\n"
    )
    (tmp_path / "test_heavy.py").write_text(
        f"def test_heavy():\n    open({str(order)!r}, 'a').write('heavy\\n')\n"
    )
    (tmp_path / "test_light.py").write_text(
        f"def test_light():\n    open({str(order)!r}, 'a').write('light\\n')\n"
        "def test_other_lane_gives_back():\n"
        f"    open({str(gate / 'gate.json')!r}, 'w').write('{{}}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.lanes", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PLANET_LANE": "0/1",
             "PLANET_LANE_GATE": str(gate)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert order.read_text().split() == ["light", "heavy"]
    usage(gate)  # removes the lanes' cgroups


def test_two_lane_processes_run_every_test_once_and_say_how_many(tmp_path: Path) -> None:
    """Two real pytest lanes side by side on one queue: each test runs in exactly one of them,
    and the lanes' lines sum to every collected test."""
    ran = tmp_path / "ran.txt"
    project = tmp_path / "project"
    project.mkdir()
    gate = tmp_path / f"{tmp_path.name}-gate"  # its name names the run's cgroups: unique
    gate.mkdir()
    for module in range(6):
        body = "".join(
            f"def test_{n}():\n    open({str(ran)!r}, 'a').write('m{module}t{n}\\n')\n"
            for n in range(3)
        )
        (project / f"test_m{module}.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PLANET_LANE_GATE": str(gate)}
    lanes = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "harness.lanes", "-q", "-p", "no:cacheprovider"],
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "PLANET_LANE": f"{i}/2"},
        )
        for i in range(2)
    ]
    outputs = [lane.communicate(timeout=120)[0] for lane in lanes]
    assert all(lane.returncode == 0 for lane in lanes), outputs
    assert sorted(ran.read_text().split()) == sorted(
        f"m{m}t{n}" for m in range(6) for n in range(3)
    )
    logs = []
    for i, text in enumerate(outputs):
        logs.append(tmp_path / f"lane{i}.log")
        logs[-1].write_text(text)
    assert check(logs) == (18, {18})
    metered = usage(gate)  # and removes the lanes' cgroups
    if UnitMeter.open(tmp_path, 0) is not None:
        usage(tmp_path)
        assert sorted(metered) == [f"test_m{m}.py" for m in range(6)]


def _lane(project: Path, gate: Path, after: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "harness.lanes", "-q", "-p", "no:cacheprovider"],
        cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PLANET_LANE": "0/1",
             "PLANET_LANE_GATE": str(gate), "PLANET_LANE_AFTER": str(after)},
    )  # fmt: skip


def test_a_lane_runs_no_test_until_its_prerequisite_is_ready(tmp_path: Path) -> None:
    """deploy/test.sh compiles the contracts while the lanes collect: a lane's first test
    starts only once PREFIX.ready exists (the test writes what it saw)."""
    project, gate = tmp_path / "project", tmp_path / f"{tmp_path.name}-gate"
    project.mkdir()
    gate.mkdir()
    after = tmp_path / "compiled"
    seen = tmp_path / "seen.txt"
    ready = f"{after}.ready"
    (project / "test_x.py").write_text(
        f"import os\ndef test_x():\n"
        f"    open({str(seen)!r}, 'w').write(str(os.path.exists({ready!r})))\n"
    )
    lane = _lane(project, gate, after)
    try:
        assert lane.stdout is not None
        before = []  # the lane's lines until it says it waits (it collects first: seconds)
        for line in lane.stdout:
            before.append(line)
            if "waiting for compiled.ready" in line:
                break
        threading.Event().wait(1.0)  # waiting still a second later
        assert lane.poll() is None and not seen.exists(), before
        Path(ready).touch()
        output = "".join(before) + lane.communicate(timeout=120)[0]
    finally:
        lane.kill()
    assert lane.returncode == 0, output
    assert seen.read_text() == "True"
    assert re.search(r"lane waited [1-9]\d* s after collecting for compiled\.ready", output)


def test_a_lane_whose_prerequisite_failed_stops_with_the_reason_and_runs_nothing(
    tmp_path: Path,
) -> None:
    project, gate = tmp_path / "project", tmp_path / f"{tmp_path.name}-gate"
    project.mkdir()
    gate.mkdir()
    after = tmp_path / "compiled"
    Path(f"{after}.failed").write_text("npx hardhat compile exited 1\n")
    ran = tmp_path / "ran"
    (project / "test_x.py").write_text(f"def test_x():\n    open({str(ran)!r}, 'w')\n")
    lane = _lane(project, gate, after)
    output = lane.communicate(timeout=120)[0]
    assert lane.returncode == 3, output
    assert "compiled.failed: npx hardhat compile exited 1" in output
    assert not ran.exists()


def test_a_lane_without_its_shared_folder_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.lanes", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PLANET_LANE": "0/2",
             "PLANET_LANE_GATE": ""},
    )  # fmt: skip
    assert done.returncode != 0 and "PLANET_LANE needs PLANET_LANE_GATE" in done.stderr


BURN = """\
import time
held = b"\\x01" * (256 << 20)  # written, so its pages are the process's own
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
"""


@pytest.mark.parametrize("start", ["popen", "zygote"])
def test_the_meter_charges_a_unit_with_the_cpu_and_memory_of_what_it_started(
    tmp_path: Path, start: str
) -> None:
    """Real cgroups, from inside a network namespace as deploy/test.sh runs a lane (where /sys
    has no cgroups): a lane-like process enters a unit's groups and starts a child, by Popen or
    forked by a zygote started before the unit (as tests/conftest.py's is), that holds 256 MB,
    burns CPU and exits; the unit is charged with both after the child is gone. (The lane runs
    in a process of its own so that this test's own process stays in its groups.)"""
    if UnitMeter.open(tmp_path, 0) is None:
        pytest.skip("needs root and the cgroup-v1 cpuacct hierarchy")
    (tmp_path / "burn.py").write_text(BURN)
    child = (
        "    subprocess.run([sys.executable, '-m', 'burn'], cwd=folder, check=True, timeout=60)\n"
        if start == "popen"
        else "    with running(folder / 'zygote', preload='') as socket_path:\n"
        "        os.environ['PLANET_ZYGOTE'] = str(socket_path)\n"
        "        meter.enter('tests/unit/test_burn.py')\n"
        "        forked = spawn([sys.executable, '-m', 'burn'], stdout=1, env=os.environ,"
        " cwd=folder)\n"
        "        assert forked is not None, 'the zygote did not fork it'\n"
        "        assert forked.wait(timeout=60) == 0\n"
    )
    lane = (
        "import os, subprocess, sys\n"
        "from pathlib import Path\n"
        "from harness.unit_meter import UnitMeter\n"
        "from harness.zygote import running\n"
        "from node.zygote.client import spawn\n"
        f"folder = Path({str(tmp_path)!r})\n"
        "meter = UnitMeter.open(folder, 0)\n"
        + ("meter.enter('tests/unit/test_burn.py')\n" if start == "popen" else "")
        + "if True:\n"
        + child
        + "meter.leave()\n"
    )
    namespace = f"planet-meter-{os.getpid()}"
    # as deploy/test.sh passes it (or as it was passed to this test's own lane)
    cgroups = os.environ.get("PLANET_CGROUPS") or f"/proc/{os.getpid()}/root{ROOT_GROUPS}"
    inside = subprocess.run(["ip", "netns", "add", namespace], capture_output=True).returncode == 0
    prefix = ["ip", "netns", "exec", namespace] if inside else []
    env = {k: v for k, v in os.environ.items() if k != "PLANET_ZYGOTE"}
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", lane], cwd=ROOT, capture_output=True, text=True,
            timeout=180, env={**env, "PYTHONPATH": str(ROOT), "PLANET_CGROUPS": cgroups},
        )  # fmt: skip
    finally:
        if inside:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    assert done.returncode == 0, done.stderr
    metered = UnitMeter.open(tmp_path, 0)
    assert metered is not None
    used = usage(tmp_path)
    assert used["tests/unit/test_burn.py"].cpu_s >= 0.4
    if MEMORY in metered.hierarchies:
        peak = used["tests/unit/test_burn.py"].peak_gb
        assert peak is not None and peak >= 0.25, used
    for hierarchy in metered.hierarchies:
        assert not (hierarchies_root() / hierarchy / f"planet-{tmp_path.name}").exists()  # removed
    assert CPU in metered.hierarchies
    text = report(used)
    assert "tests/unit/test_burn.py" in text
    if MEMORY in metered.hierarchies:
        assert "Memory peak" in text


@pytest.mark.parametrize(
    ("fixture", "group"), [("shared_devnet", SHARED_DEVNET), ("plain_circuits", PLAIN_CIRCUITS)]
)
def test_every_module_using_a_session_network_is_in_its_group(fixture: str, group) -> None:
    """A module that asks for a session-scoped network but is not in its group would be its
    own unit: a lane would start a second devnet (or set of circuits) for it alone."""
    root = Path(__file__).resolve().parents[2]
    users = {
        str(path.relative_to(root))
        for folder in ("tests/e2e", "tests/integration")
        for path in (root / folder).glob("test_*.py")
        if re.search(rf"\b{fixture}\b", path.read_text())
    }
    assert users - set(SPLIT) <= group, sorted(users - set(SPLIT) - group)


@pytest.mark.parametrize("name", sorted(WEIGHTS_GB), ids=lambda name: name.split("/")[-1][:48])
def test_every_weighed_unit_is_one_the_lanes_run(name: str) -> None:
    """A weight is looked up by the unit's name: a key that names no unit (a group listed without
    one of its modules, a renamed file) leaves that unit unweighed, free to start beside the
    heaviest devnets."""
    modules = name.split(" + ")
    for module in modules:
        assert (ROOT / module.split("::")[0]).is_file(), module
    nodeid = modules[0] if "::" in modules[0] else f"{modules[0]}::test_any"
    assert unit_of(nodeid) == name
