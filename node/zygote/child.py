"""What a forked child does before it runs its module: become what `python -m MODULE ...`
started by Popen would be.

`prepare` (right after the fork, before the zygote's frames unwind): its own session (a
service), the caller's cgroups, stdin /dev/null and stdout+stderr on the log (or the caller's
stdin, stdout and stderr: a captured command) and no other fd, cwd, umask, the signal
dispositions a fresh interpreter has (the caller's ignored signals stay ignored, as across
exec), no blocked signals, the requested environment, its argv in /proc. `run` (once the
zygote's loop is left behind): sys.argv, sys.path[0] and the std streams as the interpreter
sets them at start-up, a freshly seeded numpy, then the module as `__main__`, as `-m` runs it.
Exit statuses are the interpreter's own: `run` returns and `python -m node.zygote` ends
(SystemExit, a traceback and 1, -SIGINT for an uncaught KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import runpy
import signal
import sys
import types
from pathlib import Path

from node.zygote import cmdline, fit, netns
from node.zygote.wire import SpawnRequest

CGROUPS_ENV = "PLANET_CGROUPS"  # where the test lanes reach the cgroup-v1 hierarchies
# the zygote's own: a caller whose environment was cleaned of PLANET_* settings (the e2e tests'
# `planet devnet up`) still has its children charged to its unit, not to the zygote's
ZYGOTE_CGROUPS = os.environ.get(CGROUPS_ENV)


def _join_cgroups(request: SpawnRequest) -> None:
    """Join each cgroup-v1 group of the caller that differs from ours (the test lanes charge a
    unit with what it starts: harness/unit_meter.py). The hierarchies are under /sys/fs/cgroup,
    or under $PLANET_CGROUPS (the caller's, else the zygote's) where the test lanes, in network
    namespaces whose /sys has no cgroups, reach them. Best effort: a group we cannot write
    leaves the child where the zygote is."""
    mine = Path("/proc/self/cgroup").read_text().splitlines()
    root = request.env.get(CGROUPS_ENV) or ZYGOTE_CGROUPS or "/sys/fs/cgroup"
    for line in request.cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or line in mine or not parts[1] or not parts[2].startswith("/"):
            continue
        controllers, group = parts[1], parts[2]
        if ".." in Path(group).parts or "/" in controllers:
            continue  # a group inside its hierarchy only (the caller's text, not its cgroups)
        procs = Path(root, controllers, group.lstrip("/"), "cgroup.procs")
        with contextlib.suppress(OSError):
            procs.write_text(f"{os.getpid()}\n")


def _reset_signals(ignored: tuple[int, ...]) -> None:
    signal.set_wakeup_fd(-1)
    keep_ignored = set(ignored) | {signal.SIGPIPE, signal.SIGXFSZ}  # what Python ignores itself
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in keep_ignored:
            handler: object = signal.SIG_IGN
        elif sig == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, handler)  # type: ignore[arg-type]
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _std_fds(stdio: list[int]) -> None:
    """fds 0-2 from the caller's: [log] -> stdin /dev/null, stdout and stderr on the log;
    [stdin, stdout, stderr] as they are. The received fds are >= 3 (the zygote holds 0-2)."""
    if len(stdio) == 1:
        null = os.open(os.devnull, os.O_RDONLY)
        sources = [null, stdio[0], stdio[0]]
        stdio = [*stdio, null]
    else:
        sources = list(stdio)
    for target, source in enumerate(sources):
        os.dup2(source, target)
    for fd in set(stdio):
        os.close(fd)


def _enter_namespaces(request: SpawnRequest) -> None:
    """`ip netns exec NAME`'s part, or the caller's network namespace where it lives in another
    (node.zygote.netns); where that fails, the message on stderr and status 255 (the ip
    command's own)."""
    try:
        if request.netns is not None:
            netns.enter(request.netns)
        elif request.namespaces != fit.namespaces():
            netns.join(request.caller, request.namespaces)
    except netns.EnterError as error:
        os.write(2, f"{error.strerror}\n".encode())
        os._exit(255)


def prepare(request: SpawnRequest, stdio: list[int], ready_fd: int) -> None:
    """Right after the fork: everything that is the kernel's view of the new process; then
    one byte on `ready_fd` (the zygote tells the caller the pid only once /proc shows the
    child's own argv: the launcher takes a pid running another command line for a dead one)."""
    if request.new_session:
        os.setsid()
    _join_cgroups(request)
    _std_fds(stdio)
    _enter_namespaces(request)
    os.closerange(3, ready_fd)  # Popen's close_fds: whatever the zygote held
    os.closerange(ready_fd + 1, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request.cwd)
    os.umask(request.umask)
    _reset_signals(request.ignored_signals)
    os.environ.clear()
    os.environ.update(request.env)
    cmdline.show(request.argv, request.env)
    os.write(ready_fd, b"!")
    os.close(ready_fd)


def _std_streams(env: dict[str, str]) -> None:
    """sys.std* on fds 0-2 as the interpreter makes them for files: stdout block-buffered,
    stderr line-buffered, both written through with PYTHONUNBUFFERED (read at start-up only,
    so a fork would keep the zygote's streams)."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding

    def stream(fd: int, errors: str, *, lines: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding=encoding,
            errors=errors,
            line_buffering=lines and not unbuffered,
            write_through=unbuffered,
        )

    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding)
    sys.stdin = sys.__stdin__ = stdin
    sys.stdout = sys.__stdout__ = stream(1, "strict", lines=False)
    sys.stderr = sys.__stderr__ = stream(2, "backslashreplace", lines=True)


def run(request: SpawnRequest) -> None:
    """Run the module as `python -m` does, in this process, as `__main__`."""
    _std_streams(request.env)
    sys.dont_write_bytecode = bool(request.env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = ["-m", *request.argv[3:]]  # runpy puts the module's file in argv[0]
    sys.orig_argv = list(request.argv)
    sys.path[fit.cwd_index()] = request.cwd
    importlib.invalidate_caches()
    if "numpy" in sys.modules:  # seeded from the OS at import: every child would share it
        sys.modules["numpy"].random.seed()
    sys.modules["__main__"] = types.ModuleType("__main__")
    runpy._run_module_as_main(request.module)  # type: ignore[attr-defined]  # what -m runs
