"""`deploy.devnet.processes.exited`: how `planet devnet up` tells that a helper it just spawned
(the hosts' keeper) has died. A child whose `exec` is still under way shows an empty command
line for a moment: clean-clone CI of a44f9d7 took that for a dead keeper, failed `devnet up
--hosts` and left the lab's namespaces behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from deploy.devnet import processes
from node import procs

pytestmark = pytest.mark.unit

MARKER = "deploy.devnet.keeper"


@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", MARKER])
    yield process
    process.kill()
    process.wait()


def test_a_child_still_in_its_exec_has_not_exited(child, monkeypatch) -> None:
    monkeypatch.setattr(procs, "command_line", lambda pid: [])  # what /proc shows mid-exec
    monkeypatch.setattr(processes, "cmdline", lambda pid: "")
    assert not processes.exited(child.pid, MARKER)
    assert not processes.ours(child.pid, MARKER)  # status and down stay strict


def test_a_dead_child_has_exited(child) -> None:
    child.kill()
    child.wait()
    assert processes.exited(child.pid, MARKER)


def test_a_pid_running_another_program_has_exited() -> None:
    assert processes.exited(os.getpid(), MARKER)  # pytest, not the keeper
