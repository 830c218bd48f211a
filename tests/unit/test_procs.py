"""Background processes with their own log, and the shared service main()."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from node.procs import START_MARKER, run_service, since_last_start, spawn_logged
from protocol.errors import UnavailableError

pytestmark = pytest.mark.unit


def test_spawn_logged_appends_marked_runs_in_own_session(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "child.log"
    code = (
        "import os, sys; print('out', os.getsid(0) == os.getpid()); print('err', file=sys.stderr)"
    )
    for _ in range(2):
        child = spawn_logged([sys.executable, "-c", code], log_path, cwd=tmp_path)
        assert child.wait(timeout=30) == 0
    text = log_path.read_text()
    assert text.count(START_MARKER) == 2
    assert since_last_start(text).split() == ["out", "True", "err"]


def test_spawn_logged_env_is_exactly_what_is_given_plus_unbuffered(tmp_path: Path) -> None:
    log_path = tmp_path / "env.log"
    code = "import os; e = os.environ; print(e.get('ONLY'), e.get('PYTHONUNBUFFERED'), 'PATH' in e)"
    child = spawn_logged([sys.executable, "-c", code], log_path, env={"ONLY": "1"})
    assert child.wait(timeout=30) == 0
    assert since_last_start(log_path.read_text()).split() == ["1", "1", "False"]


def test_since_last_start_without_marker_is_the_whole_text() -> None:
    assert since_last_start("a\nb\n") == "a\nb\n"


def test_run_service_maps_planet_error_to_exit_status_without_traceback(caplog) -> None:
    async def failing() -> int:
        raise UnavailableError("rpc down", hint="start it")

    async def fine() -> int:
        return 0

    log = logging.getLogger("test.service")
    with caplog.at_level(logging.ERROR):
        assert run_service(failing, log_level="INFO", log=log) == UnavailableError.exit_status
    assert "rpc down (hint: start it)" in caplog.text
    assert run_service(fine, log_level="INFO", log=log) == 0


def test_listens_on_names_the_process_that_holds_the_port() -> None:
    import os
    import socket
    import subprocess

    from node.procs import listens_on

    with socket.socket() as server, socket.socket() as bound_only:
        server.bind(("127.0.0.1", 0))
        server.listen()
        bound_only.bind(("127.0.0.1", 0))  # bound, not listening
        port, idle = server.getsockname()[1], bound_only.getsockname()[1]
        assert listens_on(os.getpid(), port) is True
        assert listens_on(os.getpid(), idle) is False
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(other.pid, port) is False  # the port answers, but not from it
        finally:
            other.kill()
            other.wait(timeout=30)
        assert listens_on(other.pid, port) is False  # gone
