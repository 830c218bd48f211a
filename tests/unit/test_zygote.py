"""The zygote (node/zygote): its children are real processes that look and end like
`python -m MODULE` started by Popen, and every case it cannot stand in for falls back to Popen.

A light zygote (preloading `json` only) serves this module; the probe is a module written to
the test's folder, run as `python -m zprobe ACTION ...` with that folder as its cwd.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.zygote import ping, running
from node.procs import (
    START_MARKER,
    command_line,
    listens_on,
    runs_another_program,
    since_last_start,
    spawn_logged,
)
from node.server.launcher import is_planet_node, pid_alive, stop_pid
from node.zygote import ENV_VAR
from node.zygote.client import ZygoteChild

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import json, os, signal, socket, sys, time
    action = sys.argv[1]
    if action == "report":
        print(json.dumps({
            "argv": sys.argv, "orig_argv": sys.orig_argv, "cwd": os.getcwd(),
            "pid": os.getpid(), "sid": os.getsid(0), "ppid": os.getppid(),
            "env": dict(os.environ), "fds": sorted(os.listdir("/proc/self/fd")),
            "stdin": sys.stdin.read(), "sigint": signal.getsignal(signal.SIGINT) is
            signal.default_int_handler, "sigterm": signal.getsignal(signal.SIGTERM) ==
            signal.SIG_DFL, "main": __name__, "path0": sys.path[0],
        }))
    elif action == "exit":
        print("leaving", flush=True)
        sys.exit(int(sys.argv[2]))
    elif action == "raise":
        raise RuntimeError("probe failed on purpose")
    elif action == "listen":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        print(server.getsockname()[1], flush=True)
        time.sleep(120)
    else:
        time.sleep(120)
    """
)


@pytest.fixture
def probe_dir(tmp_path: Path, zygote: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "zprobe.py").write_text(PROBE)
    monkeypatch.setenv(ENV_VAR, str(zygote))
    return tmp_path


def _probe(folder: Path, *args: str, env: dict[str, str] | None = None) -> ZygoteChild:
    argv = [sys.executable, "-m", "zprobe", *args]
    child = spawn_logged(argv, folder / "probe.log", env=env, cwd=folder)
    assert isinstance(child, ZygoteChild), "not forked by the zygote"
    return child


def _report(folder: Path) -> dict:
    return json.loads(since_last_start((folder / "probe.log").read_text()))


def test_child_is_its_own_session_with_argv_env_cwd_and_log(probe_dir: Path) -> None:
    env = {**os.environ, "PROBE_VALUE": "x y"}
    child = _probe(probe_dir, "report", "two words", env=env)
    assert child.wait(timeout=30) == 0
    text = (probe_dir / "probe.log").read_text()
    assert text.count(START_MARKER) == 1
    seen = _report(probe_dir)
    assert seen["pid"] == seen["sid"] == child.pid
    assert seen["ppid"] != os.getpid()  # the zygote's child, not ours
    assert seen["argv"] == [str(probe_dir / "zprobe.py"), "report", "two words"]
    assert seen["orig_argv"] == child.args
    assert seen["main"] == "__main__" and seen["path0"] == str(probe_dir)
    assert seen["cwd"] == str(probe_dir)
    assert seen["env"] == {**env, "PYTHONUNBUFFERED": "1"}
    assert seen["fds"] == ["0", "1", "2", "3"]  # 3: listdir's own
    assert seen["stdin"] == ""
    # a fresh interpreter's dispositions: SIGINT raises KeyboardInterrupt unless the caller
    # ignores it (a background job of a non-interactive shell does, as CI's lanes are; exec
    # keeps an ignored signal ignored, and Python then installs no handler)
    assert seen["sigint"] is (signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    assert seen["sigterm"]


def test_child_cmdline_in_proc_is_its_argv(probe_dir: Path) -> None:
    child = _probe(probe_dir, "sleep", "a b", "")
    try:
        expected = [a.encode() for a in child.args] + [b""]
        assert command_line(child.pid) == expected
        environ = Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")
        assert f"{ENV_VAR}={os.environ[ENV_VAR]}".encode() in environ
        assert not runs_another_program(child.pid, "zprobe")
    finally:
        child.kill()
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert runs_another_program(child.pid, "zprobe")


@pytest.mark.parametrize(("args", "status"), [(("exit", "0"), 0), (("exit", "3"), 3)])
def test_child_exit_status_is_reported(probe_dir: Path, args: tuple[str, ...], status: int) -> None:
    child = _probe(probe_dir, *args)
    assert child.wait(timeout=30) == status
    assert child.poll() == status == child.returncode
    assert "leaving" in since_last_start((probe_dir / "probe.log").read_text())


def test_child_uncaught_exception_is_a_traceback_and_status_1(probe_dir: Path) -> None:
    child = _probe(probe_dir, "raise")
    assert child.wait(timeout=30) == 1
    tail = since_last_start((probe_dir / "probe.log").read_text())
    assert "Traceback" in tail and "RuntimeError: probe failed on purpose" in tail


def test_child_wait_times_out_then_signals_map_to_negative_status(probe_dir: Path) -> None:
    child = _probe(probe_dir, "sleep")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM
    child.kill()  # after its end: nothing is signalled, as with Popen


def test_launcher_identifies_listens_and_stops_a_zygote_child(probe_dir: Path) -> None:
    child = _probe(probe_dir, "listen", "node", "serve")
    deadline = time.monotonic() + 30
    while not since_last_start((probe_dir / "probe.log").read_text()).strip():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    port = int(since_last_start((probe_dir / "probe.log").read_text()).split()[0])
    assert listens_on(child.pid, port) is True
    assert is_planet_node(child.pid, module="zprobe")
    assert not is_planet_node(child.pid)  # not `python -m planet`
    assert stop_pid(child.pid, module="zprobe")
    assert not pid_alive(child.pid)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_env_read_at_import_differs_falls_back_to_popen(probe_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 7)}
    child = spawn_logged([sys.executable, "-m", "zprobe", "report"], probe_dir / "probe.log",
                         env=env, cwd=probe_dir)  # fmt: skip
    assert isinstance(child, subprocess.Popen)
    assert child.wait(timeout=30) == 0
    assert _report(probe_dir)["ppid"] == os.getpid()


def test_not_python_dash_m_falls_back_to_popen(probe_dir: Path) -> None:
    child = spawn_logged([sys.executable, "-c", "print(1)"], probe_dir / "c.log")
    assert isinstance(child, subprocess.Popen)
    assert child.wait(timeout=30) == 0


def test_socket_gone_falls_back_to_popen_noted_once(
    probe_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(ENV_VAR, str(probe_dir / "no-zygote.sock"))
    with caplog.at_level(logging.WARNING, logger="node.zygote.client"):
        for _ in range(2):
            child = spawn_logged([sys.executable, "-m", "zprobe", "exit", "0"],
                                 probe_dir / "probe.log", cwd=probe_dir)  # fmt: skip
            assert isinstance(child, subprocess.Popen)
            assert child.wait(timeout=30) == 0
    assert len([r for r in caplog.records if "no-zygote.sock" in r.getMessage()]) == 1


def test_zygote_with_a_thread_after_preload_does_not_serve(tmp_path: Path) -> None:
    (tmp_path / "threaded.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    env_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env_path]))
    try:
        with running(tmp_path / "z", preload="threaded") as path:
            assert path is None
    finally:
        if env_path is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_path
    assert "threads after the preload" in (tmp_path / "z" / "zygote.log").read_text()


def test_zygote_refuses_a_peer_request_it_cannot_parse(zygote: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(zygote))
        body = json.dumps({"op": "spawn", "argv": ["python", "-c", "x"]}).encode()
        conn.sendall(len(body).to_bytes(4, "big") + body)
        reply = conn.recv(4096)
    assert b"refused" in reply and b"argv" in reply
    assert ping(zygote) is not None  # still serving


def test_zygote_exits_when_its_parent_dies(tmp_path: Path) -> None:
    code = (
        "import os, sys; from pathlib import Path; from harness.zygote import running, ping\n"
        "with running(Path(sys.argv[1]), preload='json') as p:\n"
        "    print(ping(p), flush=True); os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "z")], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    zygote_pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20
    while pid_alive(zygote_pid):
        assert time.monotonic() < deadline, "the zygote outlived its parent"
        time.sleep(0.05)
