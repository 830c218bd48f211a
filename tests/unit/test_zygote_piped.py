"""`node.procs.spawn_piped`: a service forked by the zygote with pipes to its caller behaves for
the caller exactly as `subprocess.Popen(argv, stdout=PIPE, ...)` — the same lines, EOF when it
ends, the same exit status, whether it writes a lot, dies or is killed — and every case the
zygote cannot serve is that very Popen.

A light zygote (preloading `json` only) serves this module; the probe is a module written to
the test's folder, run as `python -m zpipe ACTION ...` with that folder as its cwd.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from node.procs import spawn_piped
from node.zygote import ENV_VAR
from node.zygote.client import ZygoteChild

pytestmark = pytest.mark.unit

PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    action = sys.argv[1]
    if action == "listen":  # a relay: one line once it listens, then serves until stopped
        print("relay on http://127.0.0.1:1 key ab", flush=True)
        print("registered relay é\\r\\nnext", flush=True)
        print("to the log", file=sys.stderr, flush=True)
        print(json.dumps({
            "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "fds": sorted(os.listdir("/proc/self/fd")),
            "cmdline": open("/proc/self/cmdline", "rb").read().decode(),
        }), flush=True)
        time.sleep(120)
    elif action == "lots":
        sys.stdout.buffer.write(bytes(range(256)) * 16384)  # 4 MiB: many pipe buffers
        sys.stderr.buffer.write(b"e" * 30000)  # less than a pipe holds
    elif action == "die":
        print("about to fail", flush=True)
        raise RuntimeError("the service failed")
    elif action == "echo":
        data = sys.stdin.buffer.read()
        sys.stdout.buffer.write(data[::-1])
        sys.exit(int(sys.argv[2]))
    """
)


@pytest.fixture
def probe_dir(tmp_path: Path, zygote: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "zpipe.py").write_text(PROBE)
    monkeypatch.setenv(ENV_VAR, str(zygote))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "zpipe", *args]


def _lines_then_stopped(child: ZygoteChild | subprocess.Popen) -> tuple[list[str], dict, int]:
    assert child.stdout is not None
    lines = [child.stdout.readline() for _ in range(3)]
    seen = json.loads(child.stdout.readline())
    child.terminate()
    assert child.stdout.read() == ""  # EOF once it has ended
    return lines, seen, child.wait(timeout=30)


def test_spawn_piped_forks_a_service_whose_lines_and_end_are_popens(probe_dir: Path) -> None:
    forked_log, plain_log = probe_dir / "forked.log", probe_dir / "plain.log"
    with forked_log.open("w") as log:
        forked = spawn_piped(_argv("listen"), stdout=subprocess.PIPE, stderr=log, text=True)
    with plain_log.open("w") as log:
        plain = subprocess.Popen(_argv("listen"), stdout=subprocess.PIPE, stderr=log, text=True)
    assert isinstance(forked, ZygoteChild)
    with forked, plain:
        lines, seen, status = _lines_then_stopped(forked)
        assert (lines, status) == _lines_then_stopped(plain)[::2]
    assert lines == ["relay on http://127.0.0.1:1 key ab\n", "registered relay é\n", "next\n"]
    assert status == -signal.SIGTERM
    assert forked_log.read_text() == plain_log.read_text() == "to the log\n"
    assert seen["ppid"] != os.getpid()  # the zygote's child: the pipe went over the socket
    assert seen["cmdline"] == "\0".join(forked.args) + "\0"
    assert seen["fds"] == ["0", "1", "2", "3"]  # 3: listdir's own
    assert (seen["sid"], seen["pgid"]) == (os.getsid(0), os.getpgid(0))  # as Popen: no setsid
    assert forked.stdout is not None and forked.stdout.closed  # the with block closed it


def test_spawn_piped_child_writing_a_lot_is_read_whole_as_popens(probe_dir: Path) -> None:
    forked = spawn_piped(_argv("lots"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert isinstance(forked, ZygoteChild)
    plain = subprocess.Popen(_argv("lots"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for child in (forked, plain):
        assert child.stdout is not None and child.stderr is not None
        out = child.stdout.read()  # stderr waits in its pipe
        err = child.stderr.read()
        assert (out, err) == (bytes(range(256)) * 16384, b"e" * 30000)
        assert child.stdout.read() == b""
        assert child.wait(timeout=30) == 0
        child.stdout.close()
        child.stderr.close()


def test_spawn_piped_child_that_dies_ends_its_pipe_with_popens_status(probe_dir: Path) -> None:
    results = []
    for start in (spawn_piped, subprocess.Popen):
        child = start(_argv("die"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with child:
            assert child.stdout is not None
            out = child.stdout.read()  # to EOF: its end
            results.append((out.splitlines()[0], out.splitlines()[-1], child.wait(timeout=30)))
    assert results[0] == results[1] == ("about to fail", "RuntimeError: the service failed", 1)


def test_spawn_piped_killed_child_reads_eof_and_minus_nine(probe_dir: Path) -> None:
    child = spawn_piped(_argv("listen"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert isinstance(child, ZygoteChild) and child.stdout is not None
    assert child.stdout.readline().startswith(b"relay on")
    child.kill()
    rest = child.stdout.read()  # what it wrote before the kill, then EOF (no hang)
    assert b"relay on" not in rest and child.stdout.read() == b""
    assert child.wait(timeout=30) == -signal.SIGKILL and child.poll() == -signal.SIGKILL
    child.stdout.close()


def test_spawn_piped_stdin_pipe_feeds_the_child_as_popens(probe_dir: Path) -> None:
    results = []
    for start in (spawn_piped, subprocess.Popen):
        child = start(_argv("echo", "4"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"abc" * 50000)  # more than a pipe holds: read as it is written
        child.stdin.close()
        results.append((child.stdout.read(), child.wait(timeout=30)))
        child.stdout.close()
    assert results[0] == results[1] == (b"cba" * 50000, 4)


def test_spawn_piped_without_a_zygote_is_popen(
    probe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR)
    child = spawn_piped(_argv("die"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert isinstance(child, subprocess.Popen)
    with child:
        assert child.stdout is not None and child.stdout.readline() == b"about to fail\n"
    assert child.returncode == 1


def test_spawn_piped_not_python_dash_m_is_popen(probe_dir: Path) -> None:
    child = spawn_piped([sys.executable, "-c", "print('hi')"], stdout=subprocess.PIPE, text=True)
    assert isinstance(child, subprocess.Popen)
    with child:
        assert child.stdout is not None and child.stdout.read() == "hi\n"
    assert child.returncode == 0
