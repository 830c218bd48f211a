"""The processes of a network: pid files, spawning, liveness, log tails, stopping.

Every process runs detached (it outlives the command that started it) with its pid in
`run/<process><i>.pid` and its output in `logs/<process><i>.log`; processes are `app`,
`cometbft` and `watcher`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from deploy.committee.network import Network
from node.procs import command_line, since_last_start, spawn_logged
from protocol.errors import UnavailableError

log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill -0
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    """The command line of `pid` (empty when it is gone or unreadable)."""
    return b" ".join(command_line(pid) or []).decode(errors="replace")  # any bytes: never raise


def read_pid(network: Network, process: str, index: int) -> int | None:
    """The pid in run/<process><i>.pid if that process is alive and is ours (its home matches)."""
    path = network.pid_path(process, index)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    command = cmdline(pid)
    if command and network.validators[index].home not in command:
        return None  # the pid was reused by someone else's process
    return pid


def running_processes(network: Network) -> dict[str, int]:
    """{"app0": pid, "cometbft0": pid, ...} for every live process of the network."""
    found: dict[str, int] = {}
    for validator in network.validators:
        for process in ("app", "cometbft", "watcher"):
            pid = read_pid(network, process, validator.index)
            if pid is not None:
                found[f"{process}{validator.index}"] = pid
    return found


def split_name(name: str) -> tuple[str, int]:
    """ "cometbft2" -> ("cometbft", 2)."""
    process = name.rstrip("0123456789")
    return process, int(name[len(process) :])


def spawn(
    network: Network,
    process: str,
    index: int,
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start one process of the network (`env` defaults to this process's environment)."""
    log_path = network.log_path(process, index)
    network.pid_path(process, index).parent.mkdir(parents=True, exist_ok=True)
    validator = network.validators[index]
    child = spawn_logged(validator.command(argv), log_path, env=env, cwd=validator.home)
    network.pid_path(process, index).write_text(f"{child.pid}\n")
    log.info("started process=%s%d pid=%d log=%s", process, index, child.pid, log_path)
    return child.pid


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines a process wrote since its latest start (see `spawn`'s marker)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(since_last_start(text).splitlines()[-lines:]) or "(no output)"


class ProcessDiedError(UnavailableError):
    """A process of the network exited during start-up."""

    code = "process_died"

    def __init__(self, name: str, log_path: Path) -> None:
        super().__init__(
            f"{name} exited during start-up; last lines of {log_path}:\n{log_tail(log_path)}",
            hint=f"read {log_path}",
        )


def stop_pids(pids: dict[str, int], *, timeout_s: float) -> list[str]:
    """SIGTERM each process group, wait, SIGKILL what is left; returns the names stopped."""
    for name, pid in pids.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        log.info("sent SIGTERM process=%s pid=%d", name, pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids.values()):
        time.sleep(0.05)
    for name, pid in pids.items():
        if pid_alive(pid):
            log.warning("process=%s pid=%d ignored SIGTERM; sending SIGKILL", name, pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return list(pids)


def stop_network(
    network: Network, *, only: Iterable[int] | None = None, timeout_s: float = 15.0
) -> list[str]:
    """Stop the network's processes (cometbft first, then apps). Idempotent."""
    indexes = set(only) if only is not None else {v.index for v in network.validators}
    stopped: list[str] = []
    for process in ("watcher", "cometbft", "app"):
        pids = {
            f"{process}{i}": pid
            for i in sorted(indexes)
            if (pid := read_pid(network, process, i)) is not None
        }
        stopped += stop_pids(pids, timeout_s=timeout_s)
        for i in indexes:
            network.pid_path(process, i).unlink(missing_ok=True)
    return stopped
