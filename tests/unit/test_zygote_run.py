"""`node.procs.run_captured`: a command forked by the zygote behaves for its caller exactly as
`subprocess.run(argv, capture_output=True, ...)` — same output, exit status, stdin, timeout —
and every case the zygote cannot serve is that very subprocess.run.

A light zygote (preloading `json` only) serves this module; the probe is a module written to
the test's folder, run as `python -m zrun ACTION ...` with that folder as its cwd.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from node.procs import run_captured
from node.server.launcher import pid_alive
from node.zygote import ENV_VAR

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import json, logging, os, sys, time
    action = sys.argv[1]
    if action == "report":
        print(json.dumps({
            "argv": sys.argv, "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
            "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "fds": sorted(os.listdir("/proc/self/fd")), "stdin": sys.stdin.read(),
            "ttys": [s.isatty() for s in (sys.stdin, sys.stdout, sys.stderr)],
            "handlers": len(logging.getLogger().handlers), "cwd": os.getcwd(),
            "value": os.environ.get("PROBE_VALUE"),
        }))
    elif action == "echo":
        data = sys.stdin.buffer.read()
        sys.stdout.buffer.write(data)
        print("to stderr\\r\\nnext é", file=sys.stderr)
        sys.exit(int(sys.argv[2]))
    elif action == "bytes":
        sys.stdout.buffer.write(bytes(range(256)) * 4096)
    elif action == "sleep":
        print(os.getpid(), flush=True)
        print("slept", file=sys.stderr, flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def probe_dir(tmp_path: Path, zygote: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "zrun.py").write_text(PROBE)
    monkeypatch.setenv(ENV_VAR, str(zygote))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "zrun", *args]


def _both(*args: str, **kwargs: object) -> tuple[subprocess.CompletedProcess, ...]:
    """The probe through run_captured and through subprocess.run, the same arguments."""
    forked = run_captured(_argv(*args), timeout=60, **kwargs)  # type: ignore[arg-type]
    plain = subprocess.run(_argv(*args), capture_output=True, timeout=60, **kwargs)  # type: ignore[call-overload]
    return forked, plain


def test_run_captured_forks_with_the_callers_pipes_argv_and_session(probe_dir: Path) -> None:
    env = {**os.environ, "PROBE_VALUE": "x y"}
    done = run_captured(_argv("report", "two words"), env=env, input="fed", text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    seen = json.loads(done.stdout)
    assert seen["ppid"] != os.getpid()  # the zygote's child: the fds went over the socket
    assert seen["cmdline"] == "\0".join(done.args) + "\0"
    assert seen["argv"] == [str(probe_dir / "zrun.py"), "report", "two words"]
    assert seen["stdin"] == "fed" and seen["value"] == "x y" and seen["cwd"] == str(probe_dir)
    assert seen["fds"] == ["0", "1", "2", "3"]  # 3: listdir's own
    assert seen["ttys"] == [False, False, False]
    assert seen["handlers"] == 0
    # no session of its own, as subprocess.run: the zygote's, which is ours in the tests
    assert (seen["sid"], seen["pgid"]) == (os.getsid(0), os.getpgid(0))


def test_run_captured_text_equals_subprocess_run(probe_dir: Path) -> None:
    forked, plain = _both("echo", "3", input="line one\nline two\r\n", text=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode, plain.stdout, plain.stderr,
    )  # fmt: skip
    assert forked.returncode == 3 and forked.stderr == "to stderr\nnext é\n"
    assert forked.args == plain.args


def test_run_captured_bytes_equal_subprocess_run_past_a_pipe_buffer(probe_dir: Path) -> None:
    data = os.urandom(300_000)
    forked, plain = _both("echo", "0", input=data)
    assert forked.stdout == plain.stdout == data
    assert forked.stderr == plain.stderr == "to stderr\r\nnext é\n".encode()
    forked, plain = _both("bytes")
    assert forked.stdout == plain.stdout and len(forked.stdout) == 256 * 4096
    assert forked.returncode == plain.returncode == 0


def test_run_captured_without_input_inherits_our_stdin_as_subprocess_run(probe_dir: Path) -> None:
    forked, plain = _both("report", text=True)
    assert json.loads(forked.stdout)["stdin"] == json.loads(plain.stdout)["stdin"]


def test_run_captured_check_raises_called_process_error(probe_dir: Path) -> None:
    with pytest.raises(subprocess.CalledProcessError) as raised:
        run_captured(_argv("echo", "4"), input=b"", check=True, timeout=60)
    assert raised.value.returncode == 4 and raised.value.stderr.startswith(b"to stderr")


def test_run_captured_timeout_kills_the_child_and_raises(probe_dir: Path) -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_captured(_argv("sleep"), text=True, timeout=3)
    assert time.monotonic() - started < 60
    pid = int(raised.value.output.split()[0])  # bytes read so far, as subprocess.run's
    assert raised.value.stderr == b"slept\n" and raised.value.timeout == 3
    assert not pid_alive(pid)


def test_run_captured_env_read_at_import_differs_is_subprocess_run(probe_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 7)}
    done = run_captured(_argv("report"), env=env, text=True, timeout=60)
    assert json.loads(done.stdout)["ppid"] == os.getpid()


def test_run_captured_not_python_dash_m_is_subprocess_run(probe_dir: Path) -> None:
    done = run_captured([sys.executable, "-c", "import os; print(os.getppid())"], timeout=60)
    assert int(done.stdout) == os.getpid()


def test_run_captured_without_a_zygote_is_subprocess_run(
    probe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(probe_dir / "no-zygote.sock"))
    done = run_captured(_argv("echo", "5"), input="x", text=True, timeout=60)
    assert (done.returncode, done.stdout) == (5, "x")
    monkeypatch.delenv(ENV_VAR)
    assert json.loads(run_captured(_argv("report"), timeout=60).stdout)["ppid"] == os.getpid()
