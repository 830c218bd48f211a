"""A command run to its end with its output captured, forked by the zygote: what
`subprocess.run(argv, capture_output=True, input=..., timeout=...)` does, for `python -m
MODULE ...` (the `planet` CLI as the tests run it).

The caller makes the pipes and hands the child's ends to the zygote with the request (SCM_RIGHTS:
stdin — a pipe fed with `input`, or the caller's own fd 0 as `subprocess.run` leaves it —
stdout and stderr), then reads both to their end and waits for the exit status the zygote
reports. The child stays in the zygote's session and process group (subprocess.run starts no
session either; the test lanes' zygote shares pytest's group). On `timeout` the child is
killed and reaped, and `subprocess.TimeoutExpired` carries the bytes read so far, as
subprocess.run's does on POSIX.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import time
from collections.abc import Mapping, Sequence

from node.zygote.client import ZygoteChild, spawn

CHUNK = 1 << 16  # PIPE_BUF-sized writes are atomic; 64 KiB is one pipe's buffer


def _stdin_fd() -> int:
    """Our fd 0 if it is open (subprocess.run's child inherits it), else /dev/null."""
    try:
        os.fstat(0)
    except OSError:
        return os.open(os.devnull, os.O_RDONLY)
    return os.dup(0)


def _pump(
    child: ZygoteChild, stdin: int | None, data: bytes, outs: dict[int, list[bytes]],
    deadline: float | None,
) -> bool:  # fmt: skip
    """Feed `data` to `stdin` (closed here, once written) and read every fd of `outs` to its
    end; False at `deadline`."""
    with selectors.DefaultSelector() as selector, contextlib.ExitStack() as closing:
        for fd in outs:
            selector.register(fd, selectors.EVENT_READ)
        offset = 0
        if stdin is not None:
            closing.callback(os.close, stdin)
            if data:
                os.set_blocking(stdin, False)
                selector.register(stdin, selectors.EVENT_WRITE)
            else:
                closing.close()  # EOF for the child at once
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            for key, _ in selector.select(left):
                fd = key.fd
                if fd == stdin:
                    try:
                        offset += os.write(fd, data[offset : offset + CHUNK])
                    except BrokenPipeError:  # the child closed its stdin: as subprocess.run
                        offset = len(data)
                    if offset >= len(data):
                        selector.unregister(fd)
                        closing.close()  # EOF for the child
                    continue
                chunk = os.read(fd, CHUNK)
                if chunk:
                    outs[fd].append(chunk)
                else:
                    selector.unregister(fd)
    return True


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    input: bytes | None,  # subprocess.run's name
    timeout: float | None,
) -> tuple[ZygoteChild, bytes, bytes] | None:
    """`argv` forked by the zygote and run to its end: (child, stdout, stderr); None where the
    caller must run it itself (node.zygote.client.spawn). `subprocess.TimeoutExpired` (the
    child killed and reaped) past `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if input is not None else (_stdin_fd(), None)
    try:
        child = spawn(argv, stdout=(in_r, out_w, err_w), env=env, cwd=cwd, new_session=False)
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    if child is None:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        return None
    outs: dict[int, list[bytes]] = {out_r: [], err_r: []}
    try:  # `_pump` closes in_w
        finished = _pump(child, in_w, input or b"", outs, deadline)
        if finished:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=left)
                return child, b"".join(outs[out_r]), b"".join(outs[err_r])
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(
            list(argv), timeout or 0, output=b"".join(outs[out_r]), stderr=b"".join(outs[err_r])
        )
    except BaseException as error:  # interrupted (Ctrl-C): killed, as subprocess.run does
        if not isinstance(error, subprocess.TimeoutExpired):
            child.kill()
        raise
    finally:
        os.close(out_r)
        os.close(err_r)
