"""`run_step`: a worker step that crashes (SIGSEGV, SIGBUS, SIGABRT) runs once more; a step
that fails, or crashes twice, raises `ZkStepError` naming the step and its exit. The worker is a
stand-in "python" (a shell script through PLANET_EZKL_PYTHON) that crashes the first `crashes`
times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.verifier.zk import engine

pytestmark = pytest.mark.unit

FAKE_PYTHON = """#!/bin/sh
# argv: WORKER STEP ARGS RESULT; counts its runs in $RUNS
runs=$(($(cat "$RUNS") + 1)); echo "$runs" > "$RUNS"
if [ "$runs" -le "$CRASHES" ]; then kill -"$SIGNAL" $$; fi
if [ "$FAIL" = 1 ]; then echo "bad settings" >&2; exit 1; fi
cp "$3" "$4"
"""


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    runs = tmp_path / "runs"
    runs.write_text("0")
    monkeypatch.setenv("PLANET_EZKL_PYTHON", str(python))
    monkeypatch.setenv("RUNS", str(runs))
    monkeypatch.setenv("FAIL", "0")

    def configure(crashes: int, fail: bool = False, signal: str = "SEGV") -> Path:
        monkeypatch.setenv("CRASHES", str(crashes))
        monkeypatch.setenv("SIGNAL", signal)
        monkeypatch.setenv("FAIL", "1" if fail else "0")
        return runs

    return configure


@pytest.mark.parametrize("signal", ["SEGV", "BUS", "ABRT"])
def test_a_step_that_crashed_once_runs_again_and_returns_its_result(worker, signal: str) -> None:
    runs = worker(crashes=1, signal=signal)
    assert engine.run_step("build", {"dir": "d"}) == {"dir": "d"}
    assert runs.read_text().strip() == "2"


def test_a_step_that_crashes_twice_is_an_error_naming_the_crash(worker) -> None:
    runs = worker(crashes=2)
    with pytest.raises(engine.ZkStepError, match=r"'build' failed \(exit -11\)"):
        engine.run_step("build", {"dir": "d"})
    assert runs.read_text().strip() == "2"


def test_a_step_that_fails_is_not_run_again(worker) -> None:
    runs = worker(crashes=0, fail=True)
    with pytest.raises(engine.ZkStepError, match=r"exit 1\).*bad settings"):
        engine.run_step("prove", {"x": 1})
    assert runs.read_text().strip() == "1"


def test_a_step_that_succeeds_runs_once(worker) -> None:
    runs = worker(crashes=0)
    assert engine.run_step("witness", {"n": [1, 2]}) == json.loads('{"n": [1, 2]}')
    assert runs.read_text().strip() == "1"
