"""The devnet's own processes: free ports, spawning, waiting for them, and knowing them again.

Processes are started with `node.procs.spawn_logged` (detached, one log each); a pid counts as
the devnet's only while its command line still names what was started (`ours`). `planet`
commands run as subprocesses (`planet_argv`), exactly as an operator types them.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deploy.committee.processes import cmdline, log_tail, pid_alive
from deploy.devnet.plan import Progress
from node.net import port_is_free
from node.procs import runs_another_program, spawn_logged, spawn_process
from protocol.errors import UnavailableError

REPO_ROOT = Path(__file__).resolve().parents[2]


class StepFailed(UnavailableError):
    """A devnet step failed; names its process and log."""

    code = "devnet_step_failed"

    def __init__(self, step: str, process: str, log_path: Path, detail: str = "") -> None:
        super().__init__(
            f"{step} failed: {process} (log {log_path})"
            + (f"\n{detail}" if detail else f"\n{log_tail(log_path, 10)}"),
            hint=f"read {log_path}; `planet devnet down` cleans up",
        )


def ours(pid: int | None, marker: str) -> bool:
    return bool(pid) and pid_alive(int(pid)) and marker in cmdline(int(pid))


def exited(pid: int, marker: str) -> bool:
    """True once a process just spawned as `pid` is gone: dead, or its pid runs another program.
    Not while its `exec` is under way: /proc shows an empty command line for a moment after
    `Popen` returns (node.procs.command_line), and `ours` is then False of a live child."""
    return not pid_alive(pid) or runs_another_program(pid, marker)


def free_port(start: int, end: int) -> int:
    for port in range(start, end):
        if port_is_free(port):
            return port
    raise UnavailableError(f"no free port in {start}-{end - 1}")


def free_ports(count: int, start: int, end: int) -> list[int]:
    ports = [p for p in range(start, end) if port_is_free(p)][:count]
    if len(ports) < count:
        raise UnavailableError(f"not {count} free ports in {start}-{end - 1}")
    return ports


def free_block(count: int, start: int = 27000, end: int = 60000) -> int:
    """A base port with `count` consecutive free ports (the committee's 10 per validator)."""
    for base in range(start, end, 100):
        if all(port_is_free(p) for p in range(base, base + count)):
            return base
    raise UnavailableError(f"no {count} consecutive free ports in {start}-{end}")


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    return spawn_logged(argv, log_path, env=env, cwd=REPO_ROOT).pid


def planet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "planet", *args]


def wait_http(url: str, pid: int, what: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise StepFailed(f"starting {what}", f"{what} (pid {pid}) exited", log_path)
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.2)
    raise StepFailed(
        f"starting {what}", f"{what} did not answer {url} in {timeout_s:.0f} s", log_path
    )


def run_parallel(
    commands: list[tuple[str, list[str], Path]], timeout_s: float, progress: Progress, step: str
) -> None:
    """Run the commands at once; echo their stderr lines with a name prefix; fail on the first
    non-zero exit naming the command and its log."""
    running = []
    for name, argv, log_path in commands:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(log_path, "wb")  # noqa: SIM115 - closed below
        process = spawn_process(
            argv,
            handle.fileno(),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            cwd=REPO_ROOT,
            new_session=False,
        )
        running.append((name, process, log_path, handle, [0]))
    deadline = time.monotonic() + timeout_s
    try:
        while running:
            for entry in list(running):
                name, process, log_path, handle, seen = entry
                lines = log_path.read_text(errors="replace").splitlines()
                for line in lines[seen[0] :]:
                    if line.strip():
                        progress(f"      {name}: {line.strip()}")
                seen[0] = len(lines)
                code = process.poll()
                if code is None:
                    continue
                running.remove(entry)
                handle.close()
                if code != 0:
                    raise StepFailed(
                        step,
                        f"`{' '.join(argv_tail(process.args))}` ({name})",
                        log_path,
                        detail=log_tail(log_path, 8),
                    )
            if running and time.monotonic() > deadline:
                name, process, log_path, _, _ = running[0]
                raise StepFailed(step, f"{name} did not finish in {timeout_s:.0f} s", log_path)
            time.sleep(0.25)
    finally:
        for _, process, _, handle, _ in running:
            process.kill()
            process.wait()
            handle.close()


def argv_tail(argv: Any) -> list[str]:
    """`planet …` as the user would type it (drops the interpreter and module)."""
    parts = [str(a) for a in argv]
    if len(parts) > 2 and parts[1] == "-m":
        return ["planet", *parts[3:]]
    return parts
