"""`agent_exited`: how `planet join` tells that the agent it just spawned has died. A child
whose `exec` is still under way has an empty command line for a moment (CI of 26fa046: the
hosts devnet's join said "the agent exited" of a live agent); that is not an exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from node import procs
from node.agent import launch

pytestmark = pytest.mark.unit


@pytest.fixture
def sleeper():
    """A real process whose command line names the agent module, as the agent's does."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", launch.AGENT_MARKER]
    )
    # Popen returns once the exec has begun, not once /proc shows its arguments (CI of
    # d8b007d read an empty command line here): wait, bounded, for the exec to finish
    deadline = time.monotonic() + 10
    while launch.command_line(child.pid) == [] and time.monotonic() < deadline:
        time.sleep(0.01)
    yield child
    child.kill()
    child.wait()


def test_a_running_agent_has_not_exited(sleeper) -> None:
    assert launch.is_agent(sleeper.pid)
    assert not launch.agent_exited(sleeper.pid)


def test_a_dead_agent_has_exited(sleeper) -> None:
    sleeper.kill()
    sleeper.wait()
    assert launch.agent_exited(sleeper.pid)
    assert not launch.is_agent(sleeper.pid)


def test_a_pid_running_another_program_is_an_exited_agent() -> None:
    assert launch.agent_exited(os.getpid())  # pytest, not the agent


def test_a_child_still_in_its_exec_has_not_exited(sleeper, monkeypatch) -> None:
    monkeypatch.setattr(launch, "command_line", lambda pid: [])  # what /proc shows mid-exec
    monkeypatch.setattr(procs, "command_line", lambda pid: [])
    assert not launch.agent_exited(sleeper.pid)
    assert not launch.is_agent(sleeper.pid)  # stop/status stay strict
