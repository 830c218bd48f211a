"""A forked child's argv and environment as /proc shows them (`/proc/PID/cmdline`, `environ`).

The kernel reads those files from the memory ranges it recorded at exec; a forked child keeps
its parent's. `show` points the ranges at new NUL-separated copies with prctl(PR_SET_MM,
PR_SET_MM_MAP) — the map form needs no CAP_SYS_RESOURCE (the single-field forms do, and
containers often drop it) — so the file reads as an exec'd process's would: each argument
followed by one NUL. The copies live in memory Python never owns (malloc'd, never freed): the
kernel reads them until the process is gone, and while Python shuts down it frees what its
modules hold, so a copy in a Python object read as whatever was allocated there next (a CI run's
`planet devnet down` got undecodable bytes polling an exiting child's cmdline).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_MM = 35
PR_SET_MM_MAP = 14


_WORDS = (
    "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
    "arg_start", "arg_end", "env_start", "env_end",
)  # fmt: skip


class _MmMap(ctypes.Structure):
    """struct prctl_mm_map (include/uapi/linux/prctl.h)."""

    _fields_ = [
        *((name, ctypes.c_uint64) for name in _WORDS),
        ("auxv", ctypes.c_void_p),
        ("auxv_size", ctypes.c_uint32),
        ("exe_fd", ctypes.c_uint32),
    ]


class CmdlineError(OSError):
    """The kernel refused the new ranges (no CONFIG_CHECKPOINT_RESTORE, or a seccomp filter)."""


def _block(libc: ctypes.CDLL, items: Sequence[str]) -> tuple[int, int]:
    """(start, end) of a malloc'd "a\0b\0" copy of `items`, deliberately never freed."""
    data = b"\0".join(os.fsencode(item) for item in items) + b"\0"
    start = libc.malloc(len(data))
    if not start:
        raise MemoryError(f"malloc({len(data)}) for the command line")
    ctypes.memmove(start, data, len(data))
    return start, start + len(data)


def show(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make /proc/self/cmdline read `argv` and /proc/self/environ `env`; `CmdlineError` if
    the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    # /proc/self/stat fields 26-28 and 45-47 (1-based), counted after the ")" of the name
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()

    def field(number: int) -> int:
        return int(fields[number - 3])

    args = _block(libc, argv)
    environ = _block(libc, [f"{k}={v}" for k, v in env.items()])
    mm = _MmMap(
        start_code=field(26), end_code=field(27), start_stack=field(28),
        start_data=field(45), end_data=field(46), start_brk=field(47), brk=libc.sbrk(0),
        arg_start=args[0], arg_end=args[1], env_start=environ[0], env_end=environ[1],
        auxv=None, auxv_size=0, exe_fd=0xFFFFFFFF,  # keep the auxv and /proc/self/exe
    )  # fmt: skip
    if libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        errno = ctypes.get_errno()
        raise CmdlineError(errno, f"prctl(PR_SET_MM_MAP): {os.strerror(errno)}")
