"""Background processes with their own log, and the `main()` of a long-running service.

Every process the devnet, `planet join` or `planet local up` starts is a session leader (so a
signal to its group stops it and its children), reads nothing, and writes stdout and stderr to
one log file that is appended to, each start marked by a `START_MARKER` line:

    child = spawn_logged(argv, run_dir / "agent.log", env={**os.environ, "X": "1"})

`spawn_process` is the one place such a process starts: where $PLANET_ZYGOTE names a running
zygote (node/zygote, the test lanes start one) and the process is `python -m MODULE ...`, the
zygote forks it with the heavy modules already imported; otherwise `subprocess.Popen`. Either
way the caller gets the child's own pid and a Popen-like handle (`Child`). `run_captured` is
`subprocess.run(..., capture_output=True)` through the same zygote: how the tests run the
`planet` CLI (a person's `planet` stays a process of its own). `spawn_piped` is
`subprocess.Popen` with its stdin/stdout/stderr arguments (pipes included) through the same
zygote: how the tests start a service whose first lines they read.

`run_service` is the shared `main()` of the node agent and the stake watcher: logging to stderr
in key=value style, the coroutine run to completion, a `PlanetError` logged as one line (with
its hint) and turned into the error's exit status instead of a traceback.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import locale
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

from node.zygote import captured, piped
from node.zygote.client import ZygoteChild, spawn
from protocol.errors import PlanetError

START_MARKER = "=== start "
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
Child: TypeAlias = "subprocess.Popen[bytes] | ZygoteChild"


def spawn_process(
    argv: list[str],
    out: int,
    *,
    env: Mapping[str, str],
    cwd: Path | str | None = None,
    new_session: bool = True,
) -> Child:
    """Start `argv` with stdin /dev/null, stdout and stderr on the file descriptor `out`,
    exactly `env`, in `cwd`, in a session of its own if `new_session`: forked by the zygote
    where it can (module docstring), else with `subprocess.Popen`."""
    child = spawn(argv, stdout=out, env=env, cwd=cwd, new_session=new_session)
    if child is not None:
        return child
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
        env=dict(env),
        cwd=cwd,
    )


def spawn_piped(
    argv: Sequence[str],
    *,
    stdin: piped.Stream = None,
    stdout: piped.Stream = None,
    stderr: piped.Stream = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    new_session: bool = False,
    text: bool = False,
) -> Child:
    """`subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
    start_new_session=new_session, text=text)`, forked by the zygote where it can (a service the
    tests start and read through a pipe: `child.stdout.readline()`; node/zygote/piped.py),
    else that very call. `env` defaults to ours."""
    argv = [os.fspath(a) for a in argv]
    env = dict(os.environ if env is None else env)
    child = piped.start(
        argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
        new_session=new_session, text=text,
    )  # fmt: skip
    if child is not None:
        return child
    return subprocess.Popen(
        argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
        start_new_session=new_session, text=text,
    )  # fmt: skip


def terminate(process: Child, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it is still running `grace_s` later; waits for the exit."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace_s)


def run_captured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    input: str | bytes | None = None,  # subprocess.run's name
    timeout: float | None = None,
    text: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run(argv, capture_output=True, env=env, cwd=cwd, input=input,
    timeout=timeout, text=text, check=check)`, forked by the zygote where it can (a command of
    the tests: `python -m planet ...`; node/zygote/captured.py), else that very call. Text is
    decoded and encoded as subprocess.run does it (the locale's encoding, universal
    newlines); `subprocess.TimeoutExpired` kills the child, with the bytes read so far."""
    argv = [os.fspath(a) for a in argv]
    env = dict(os.environ if env is None else env)
    encoding = locale.getpreferredencoding(False)
    data = input.encode(encoding) if isinstance(input, str) else input
    done = captured.run(argv, env=env, cwd=cwd, input=data, timeout=timeout)
    if done is None:
        return subprocess.run(
            argv, capture_output=True, env=env, cwd=cwd, input=input, timeout=timeout,
            text=text, check=check,
        )  # fmt: skip
    child, out, err = done
    result: subprocess.CompletedProcess[Any] = subprocess.CompletedProcess(
        argv, child.returncode, out, err
    )
    if text:
        result.stdout, result.stderr = (_text(b, encoding) for b in (out, err))
    if check:
        result.check_returncode()
    return result


def _text(data: bytes, encoding: str) -> str:
    """Bytes as subprocess.run's text mode reads them (universal newlines)."""
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


def spawn_logged(
    argv: list[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Child:
    """Start `argv` in its own session with stdout and stderr appended to `log_path` (its
    parent folder is created); `env` defaults to this process's, with PYTHONUNBUFFERED=1."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        log_file.write(f"\n{START_MARKER}{stamp}: {' '.join(argv)}\n".encode())
        log_file.flush()
        return spawn_process(
            argv,
            log_file.fileno(),
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            cwd=cwd,
        )


def command_line(pid: int) -> list[bytes] | None:
    """`pid`'s argv from /proc; None if it does not run. Empty while an `exec` is under way:
    the kernel closes the close-on-exec pipe that `subprocess.Popen` waits on before it lays
    out the new program's arguments, so a just-spawned child can read as empty for a moment."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.split(b"\0") if raw else []


def runs_another_program(pid: int, marker: str) -> bool:
    """Whether a process spawned as `pid`, whose argv names `marker`, no longer runs it: gone
    from /proc, or its pid now runs something else. Not while its `exec` is under way (an
    empty command line, above): a just-spawned child is not taken for a dead one."""
    command = command_line(pid)
    return command is None or (command != [] and marker.encode() not in command)


_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listens_on(pid: int, port: int) -> bool | None:
    """Whether `pid` itself holds a listening TCP socket on `port` (in its own network
    namespace): a LISTEN row for the port in /proc/PID/net/tcp{,6} whose socket inode is one
    of its open files. None where /proc cannot tell (no such files: not Linux, or another
    user's process). A health answer on a node's port proves only that *someone* listens
    there: another program may hold the port the node then failed to bind."""
    inodes: set[str] = set()
    try:
        for table in ("tcp", "tcp6"):
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for row in rows:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
        if not inodes:
            return False
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):  # an fd closed while we look
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return True
    except FileNotFoundError:
        return False if Path("/proc/self/net/tcp").exists() else None  # gone, or no /proc
    except (OSError, IndexError, ValueError):
        return None
    return False


def since_last_start(text: str) -> str:
    """What a log written by `spawn_logged` holds after its latest start marker line."""
    if START_MARKER not in text:
        return text
    return text.rsplit(START_MARKER, 1)[-1].split("\n", 1)[-1]


def run_service(run: Callable[[], Awaitable[int]], *, log_level: str, log: logging.Logger) -> int:
    """Configure logging, run the service coroutine, map a `PlanetError` to its exit status."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    try:
        return asyncio.run(run())
    except PlanetError as error:
        log.error("%s%s", error.message, f" (hint: {error.hint})" if error.hint else "")
        return error.exit_status


def exit_code(stop: SystemExit) -> int:
    """The status `sys.exit(arg)` would give: None -> 0, an int as is, anything else printed to
    stderr -> 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def exit_process(main: Callable[[], int | None]) -> NoReturn:
    """`sys.exit(main())` for a process's entry point, without tearing the interpreter down.

    A normal exit finalizes every module and object the process holds: 1-2 s of CPU for a node
    with torch and its weights loaded (measured here: 7.7 -> 5.9 s of CPU for an import of the
    node's stack and exit), which a test run pays for every process it stops. What a normal exit
    does that matters still runs, in its order: non-daemon threads are joined (executors shut
    down), atexit handlers run (logging's flush and close, a lab's namespaces torn down), then
    stdout and stderr are flushed. Files left open and unflushed by the program are not
    flushed: every writer here closes its files (or fsyncs) before it returns."""
    try:
        code = main()
        status = 0 if code is None else code
    except SystemExit as stop:
        status = exit_code(stop)
    leave(status)


def leave(status: int) -> NoReturn:
    """End this process with `status` as `exit_process` does (threads joined, atexit run,
    output flushed, no teardown)."""
    threading._shutdown()  # type: ignore[attr-defined]  # what interpreter exit runs first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
