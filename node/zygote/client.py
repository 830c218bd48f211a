"""The caller's side: `spawn` asks the zygote named by $PLANET_ZYGOTE for a child and returns a
`ZygoteChild` (what callers use of `subprocess.Popen`), or None when the caller must start the
process itself: no zygote configured, not `python -m MODULE`, the zygote unreachable (noted
once in the log), or the request refused (node.zygote.fit; noted once per reason).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from node.zygote import ENV_VAR
from node.zygote.fit import namespaces
from node.zygote.netns import split as split_netns
from node.zygote.wire import BadRequest, receive, send

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0  # the zygote answers one request at a time, each a fork (~ms)
LOST = 255  # returncode of a child whose zygote died before reporting its status
_noted: set[str] = set()


def _note_once(reason: str, level: int = logging.INFO) -> None:
    if reason not in _noted:
        _noted.add(reason)
        log.log(level, "zygote not used: %s; starting processes with Popen", reason)


def _ignored_signals() -> list[int]:
    ignored = []
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(int(sig))
        except (OSError, ValueError):
            continue
    return ignored


def _umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class ZygoteChild:
    """A zygote's child, as far as callers use `subprocess.Popen`: `pid`, `args`,
    `returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`. Its exit status comes
    from the zygote over the request's connection (Popen's conventions: -N for signal N).
    If the zygote dies first, the status is unknown: `LOST` once the pid has gone.
    `stdin`, `stdout`, `stderr`: the caller's ends of pipes to it, as Popen's (node.zygote.piped)
    or None; closed on leaving a `with` block, as Popen closes them."""

    stdin: IO[Any] | None = None
    stdout: IO[Any] | None = None
    stderr: IO[Any] | None = None

    def __init__(self, args: Sequence[str], pid: int, conn: socket.socket) -> None:
        self.args = list(args)
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._started = _start_time(pid)

    def __repr__(self) -> str:
        return f"<ZygoteChild: returncode: {self.returncode} args: {self.args!r}>"

    def _check(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        if self._conn is None:  # zygote lost: read /proc
            if _start_time(self.pid) != self._started or self._started is None:
                self.returncode = LOST
            elif timeout:
                time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            message = receive(self._conn)
        except (OSError, BadRequest):
            message = None
        if message is not None and isinstance(message[0].get("exit"), int):
            self.returncode = message[0]["exit"]
        self._conn.close()
        self._conn = None
        if self.returncode is None:
            self._check(0)

    def poll(self) -> int | None:
        self._check(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._check(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.poll()
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> ZygoteChild:
        return self

    def __exit__(self, *_: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        try:
            if self.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    self.stdin.close()
        finally:
            self.wait()

    def __del__(self) -> None:
        if self._conn is not None:
            self._conn.close()


def spawn(
    argv: Sequence[str],
    *,
    stdout: int | tuple[int, int, int],
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    new_session: bool = True,
) -> ZygoteChild | None:
    """`argv` (`python -m MODULE ...`, or that behind `ip netns exec NS`: the child enters NS,
    node.zygote.netns) forked by the zygote with stdin /dev/null, stdout and
    stderr on the fd `stdout` — or, given three fds, its stdin, stdout and stderr on them —
    exactly `env`, in `cwd` (default: ours), in a session of its own if `new_session`; None
    where the caller must start it itself (see the module)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    args = [str(a) for a in argv]
    in_netns, argv = split_netns(args)  # `ip netns exec NS python -m ...`: NS entered by the child
    if len(argv) < 3 or argv[1] != "-m":
        return None
    request = {
        "op": "spawn",
        "argv": argv,
        "env": dict(env),
        "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
        "new_session": new_session,
        "umask": _umask(),
        "ignored_signals": _ignored_signals(),
        "namespaces": namespaces(),
        "cgroups": Path("/proc/self/cgroup").read_text(),
        "stdio": "log" if isinstance(stdout, int) else "pipes",
    }
    if in_netns is not None:
        request["netns"] = in_netns
    fds = [stdout] if isinstance(stdout, int) else list(stdout)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.connect(path)
        send(conn, request, fds)
        reply = receive(conn)
    except (OSError, BadRequest) as error:
        conn.close()
        _note_once(f"{path} unreachable ({error})", logging.WARNING)
        return None
    body = reply[0] if reply else {}
    pid = body.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        conn.close()
        _note_once(str(body.get("refused", f"no answer from {path}")))
        return None
    conn.settimeout(None)
    return ZygoteChild(args, pid, conn)
