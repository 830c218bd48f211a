"""node.procs.exit_process: a process entry point exits with main()'s status, without the
interpreter's teardown, yet with everything a normal exit does that a program relies on."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "entry.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_status_threads_atexit_and_unflushed_output_as_a_normal_exit(tmp_path: Path) -> None:
    done = _run(
        f"""
        import atexit, logging, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from node.procs import exit_process

        def main():
            out = {str(tmp_path)!r}
            logging.basicConfig(filename=out + "/log.txt", level=logging.INFO)
            logging.info("logged before exit")
            atexit.register(lambda: open(out + "/atexit.txt", "w").write("ran"))
            def late():
                time.sleep(0.5)
                open(out + "/thread.txt", "w").write("joined")
            threading.Thread(target=late).start()
            ThreadPoolExecutor(1).submit(time.sleep, 0.2)
            sys.stdout.write("no newline, not flushed")
            return 7

        exit_process(main)
        """,
        tmp_path,
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "no newline, not flushed"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert "logged before exit" in (tmp_path / "log.txt").read_text()


@pytest.mark.parametrize(
    ("raised", "status", "stderr"),
    [
        ("SystemExit()", 0, ""),
        ("SystemExit(3)", 3, ""),
        ("SystemExit('error: bad')", 1, "error: bad\n"),
    ],
)
def test_system_exit_gives_the_status_sys_exit_would(
    raised: str, status: int, stderr: str, tmp_path: Path
) -> None:
    done = _run(
        f"""
        from node.procs import exit_process

        def main():
            raise {raised}

        exit_process(main)
        """,
        tmp_path,
    )
    assert (done.returncode, done.stderr) == (status, stderr)


def test_a_none_status_is_success(tmp_path: Path) -> None:
    done = _run("from node.procs import exit_process\nexit_process(lambda: None)\n", tmp_path)
    assert done.returncode == 0 and done.stderr == ""
