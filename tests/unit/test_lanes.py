"""harness/lanes.py: the lanes of deploy/test.sh together run every collected test once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.lanes import Gate, check, lane_order, parse_lane, plan, record, unit_of

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


@pytest.mark.parametrize("lanes", [1, 2, 3, 4, 7, 20])
def test_every_test_is_in_exactly_one_lane_and_lanes_agree(lanes: int) -> None:
    known = {"tests/e2e/test_verification_devnet.py": 600.0, "tests/unit/test_b.py": 3.0}
    assigned = plan(NODEIDS, lanes, known)
    again = plan(list(reversed(NODEIDS)), lanes, dict(reversed(list(known.items()))))
    assert assigned == again  # every lane computes the same plan, whatever the order
    per_lane = [[n for n in NODEIDS if assigned[unit_of(n)] == i] for i in range(lanes)]
    assert sorted(n for lane in per_lane for n in lane) == sorted(NODEIDS)
    assert all(0 <= lane < lanes for lane in assigned.values())


def test_a_module_stays_in_one_lane_the_smokes_split_and_the_shared_devnet_is_one_unit() -> None:
    assigned = plan(NODEIDS, 4, {})
    lane_of = {n: assigned[unit_of(n)] for n in NODEIDS}
    assert lane_of["tests/unit/test_a.py::test_one"] == lane_of["tests/unit/test_a.py::test_two"]
    dapp, devnet = "tests/e2e/test_dapp.py::test_page", "tests/e2e/test_devnet.py::test_up"
    assert lane_of[dapp] == lane_of[devnet]
    smokes = [n for n in NODEIDS if "bench_smoke" in n]
    assert {unit_of(n) for n in smokes} == set(smokes)


def test_longest_first_puts_the_long_modules_apart() -> None:
    known = {
        "tests/e2e/test_verification_devnet.py": 600.0,
        "tests/e2e/test_local_cli.py": 500.0,
        "tests/e2e/test_dapp.py + tests/e2e/test_devnet.py": 400.0,
    }
    assigned = plan(NODEIDS, 3, known)
    heavy = [assigned[u] for u in known]
    assert sorted(heavy) == [0, 1, 2]


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


def test_heavy_units_run_first_in_even_lanes_and_last_in_odd_ones() -> None:
    units = [
        "tests/dapp/test_x.py",
        "tests/e2e/test_verification_devnet.py",
        "tests/unit/test_y.py",
    ]
    expected = {units[0]: 5.0, units[1]: 400.0, units[2]: 1.0}
    assert lane_order(units, expected, 0) == [units[1], units[0], units[2]]
    assert lane_order(units, expected, 1) == [units[0], units[2], units[1]]


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
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "gate.json").write_text('{"7": 8.0}')
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
        f"    open({str(tmp_path / 'gate' / 'gate.json')!r}, 'w').write('{{}}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.lanes", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PLANET_LANE": "0/1",
             "PLANET_LANE_GATE": str(tmp_path / "gate")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert order.read_text().split() == ["light", "heavy"]
