"""`os.execvpe(argv[0], argv, env)`, with the zygote standing in for the new program where it
can: `planet devnet exec HOST -- planet ...` replaces itself with `ip netns exec NS python -m
planet ...`, a fresh interpreter (~2 CPU-s) for every command a test runs inside a host.

Where $PLANET_ZYGOTE serves the command (node.zygote.client.spawn: `python -m MODULE`, with or
without the `ip netns exec NS` prefix), the zygote forks it on our own stdin, stdout and stderr
and with our environment as `env`; this process stays as its stand-in: it passes on the signals
a caller sends to stop or poke it (`FORWARDED`) and ends as the command ended — its exit
status, or killed by the same signal — which is what the caller of an exec'd process sees.
Only SIGKILL and SIGSTOP cannot be passed on (the command then runs on until its host is torn
down). Otherwise, and always without a zygote (a person's `planet devnet exec`), it is the exec.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from node.zygote.client import spawn

FORWARDED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGCONT, signal.SIGWINCH,
)  # fmt: skip


def _fds_open() -> bool:
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return False
    return True


def exec_or_fork(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Become `argv` (module docstring): exec it, or have the zygote fork it and end as it ends."""
    argv = [os.fspath(a) for a in argv]
    sys.stdout.flush()
    sys.stderr.flush()
    # a signal that comes before the child's pid does waits for its handler (below)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = spawn(argv, stdout=(0, 1, 2), env=env, new_session=False) if _fds_open() else None
    if child is None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # exec keeps the mask
        os.execvpe(argv[0], argv, env)
    pid = child.pid

    def forward(sig: int, _frame: object) -> None:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    for sig in FORWARDED:
        if signal.getsignal(sig) != signal.SIG_IGN:  # ignored: ignored by the command too
            signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    status = child.wait()
    if status < 0:  # killed by a signal: so are we
        signal.signal(-status, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
        os.kill(os.getpid(), -status)
        status = 128 - status  # a signal whose default is not to end us: as a shell says it
    os._exit(status & 0xFF)
