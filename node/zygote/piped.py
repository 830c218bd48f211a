"""A service forked by the zygote with its standard streams as `subprocess.Popen` sets them:
each of stdin, stdout and stderr inherited (None), a pipe to the caller (`subprocess.PIPE`),
`subprocess.DEVNULL`, a file descriptor or a file object; stderr also `subprocess.STDOUT`.
What a test does with `Popen(argv, stdout=PIPE, stderr=log, text=True)` to read the first line a
relay prints once it listens:

    child = start(argv, stdin=None, stdout=PIPE, stderr=log, env=env, cwd=None,
                  new_session=False, text=True)
    line = child.stdout.readline()

The caller keeps its ends of the pipes (`child.stdin`, `child.stdout`, `child.stderr`: file
objects opened as Popen opens them, text mode with the locale's encoding and universal
newlines) and the child gets the other ends with the request (SCM_RIGHTS, the zygote's `pipes`
kind: three fds). A stream the caller does not redirect is its own fd 0, 1 or 2 — /dev/null if
that is closed (the zygote needs an fd to hand on).
"""

from __future__ import annotations

import contextlib
import io
import locale
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any, TypeAlias

from node.zygote.client import ZygoteChild, spawn

Stream: TypeAlias = "int | IO[Any] | None"  # Popen's: None, PIPE, DEVNULL, STDOUT, fd, file


def _inherited(fd: int) -> int:
    """A copy of our fd `fd` (0-2), or /dev/null where it is closed."""
    try:
        os.fstat(fd)
    except OSError:
        return os.open(os.devnull, os.O_RDWR)
    return os.dup(fd)


def _child_end(spec: Stream, fd: int, ours: dict[int, int]) -> int:
    """The fd the child gets for its fd `fd` (a new one: the caller closes it once sent);
    a pipe's other end goes into `ours`."""
    if spec is None:
        return _inherited(fd)
    if spec == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR)
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        ours[fd] = write if fd == 0 else read
        return read if fd == 0 else write
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"not a stream for fd {fd}: {spec}")
        return os.dup(spec)
    return os.dup(spec.fileno())


def _open(fd: int, which: int, text: bool) -> IO[Any]:
    """Our end of a pipe as Popen opens it (buffered binary; text: the locale's encoding,
    universal newlines on reading, written through)."""
    raw = open(fd, "wb" if which == 0 else "rb", -1)  # noqa: SIM115 - the child's handle
    if not text:
        return raw
    encoding = locale.getpreferredencoding(False)
    if which == 0:
        return io.TextIOWrapper(raw, encoding=encoding, write_through=True)
    return io.TextIOWrapper(raw, encoding=encoding)


def start(
    argv: Sequence[str],
    *,
    stdin: Stream,
    stdout: Stream,
    stderr: Stream,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    new_session: bool,
    text: bool,
) -> ZygoteChild | None:
    """`argv` forked by the zygote with its streams set as Popen's arguments of the same names
    say; None where the caller must start it itself (node.zygote.client.spawn)."""
    ours: dict[int, int] = {}
    given: list[int] = []
    try:
        given.append(_child_end(stdin, 0, ours))
        given.append(_child_end(stdout, 1, ours))
        if stderr == subprocess.STDOUT:
            given.append(os.dup(given[1]))
        else:
            given.append(_child_end(stderr, 2, ours))
        child = spawn(argv, stdout=(given[0], given[1], given[2]), env=env, cwd=cwd,
                      new_session=new_session)  # fmt: skip
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in given:
            with contextlib.suppress(OSError):
                os.close(fd)
    if child is None:
        for fd in ours.values():
            os.close(fd)
        return None
    streams = {fd: _open(end, fd, text) for fd, end in ours.items()}
    child.stdin, child.stdout, child.stderr = (streams.get(fd) for fd in (0, 1, 2))
    return child
