"""A forked child's argv and environment as /proc shows them (`/proc/PID/cmdline`, `environ`).

The kernel reads those files from the memory ranges it recorded at exec; a forked child keeps
its parent's. `show` points the ranges at new NUL-separated copies with prctl(PR_SET_MM,
PR_SET_MM_MAP) — the map form needs no CAP_SYS_RESOURCE (the single-field forms do, and
containers often drop it) — so the file reads as an exec'd process's would: each argument
followed by one NUL. The copies are kept alive for the process's lifetime.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_MM = 35
PR_SET_MM_MAP = 14
_KEPT: list[ctypes.Array[ctypes.c_char]] = []


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


def _block(items: Sequence[str]) -> ctypes.Array[ctypes.c_char]:
    # create_string_buffer adds the final NUL: "a\0b\0"
    block = ctypes.create_string_buffer(b"\0".join(os.fsencode(item) for item in items))
    _KEPT.append(block)
    return block


def show(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Make /proc/self/cmdline read `argv` and /proc/self/environ `env`; `CmdlineError` if
    the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    # /proc/self/stat fields 26-28 and 45-47 (1-based), counted after the ")" of the name
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()

    def field(number: int) -> int:
        return int(fields[number - 3])

    args, environ = _block(argv), _block([f"{k}={v}" for k, v in env.items()])
    mm = _MmMap(
        start_code=field(26), end_code=field(27), start_stack=field(28),
        start_data=field(45), end_data=field(46), start_brk=field(47), brk=libc.sbrk(0),
        arg_start=ctypes.addressof(args), arg_end=ctypes.addressof(args) + ctypes.sizeof(args),
        env_start=ctypes.addressof(environ),
        env_end=ctypes.addressof(environ) + ctypes.sizeof(environ),
        auxv=None, auxv_size=0, exe_fd=0xFFFFFFFF,  # keep the auxv and /proc/self/exe
    )  # fmt: skip
    if libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        errno = ctypes.get_errno()
        raise CmdlineError(errno, f"prctl(PR_SET_MM_MAP): {os.strerror(errno)}")
