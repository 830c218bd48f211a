"""`ip netns exec NS python -m MODULE ...` forked by the zygote: the child enters the named
network namespace itself, as `ip netns exec` would before it execs the command.

What `ip netns exec NS` does (iproute2's netns_switch), and what a forked child does of it:

- setns(/var/run/netns/NS, CLONE_NEWNET): the same (`enter`), right after the fork, while the
  child is still single-threaded (the zygote forks only with one thread);
- unshare(CLONE_NEWNS), / made a recursive slave, /sys unmounted and sysfs mounted afresh
  (over it, read-only if it was, where it cannot be unmounted), so that /sys/class/net lists
  the namespace's interfaces: the same;
- a bind mount of each file in /etc/netns/NS over its namesake in /etc (a namespace's own
  hosts or resolv.conf): not done here — a request for a namespace that has that folder is
  refused (`refusal`), and the caller runs `ip netns exec` itself;
- then exec: the process is the command, whose /proc/PID/cmdline is the command's argv — as a
  forked child shows it (`node.zygote.cmdline`).

`split` recognises the prefix on a caller's argv (node.zygote.client): the devnet's hosts start
their services and commands as `ip netns exec NS ...` (deploy/devnet/hosts.py `Placement.argv`,
deploy/committee/network.py `Validator.command`), and where no zygote serves them that very
argv is what Popen runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

NETNS_ROOT = Path("/var/run/netns")  # where `ip netns add` names them
ETC_ROOT = Path("/etc/netns")  # `ip netns exec` bind-mounts NS's files here over /etc
PREFIX = ("ip", "netns", "exec")
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REC, MS_SLAVE = 0x1, 0x4000, 0x80000
MNT_DETACH = 0x2
ST_RDONLY = 0x1


class EnterError(OSError):
    """The child could not enter the namespace (`ip netns exec`'s own failure, exit 255)."""


def valid_name(name: str) -> bool:
    """A name `ip netns` could have made: one path component (at most NAME_MAX bytes)."""
    return (
        0 < len(os.fsencode(name)) <= 255
        and name not in (".", "..")
        and "/" not in name
        and "\0" not in name
    )


def split(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(NS, COMMAND) for `ip netns exec NS COMMAND...`; (None, argv) for any other argv."""
    argv = list(argv)
    if len(argv) > 4 and tuple(argv[:3]) == PREFIX and valid_name(argv[3]):
        return argv[3], argv[4:]
    return None, argv


def refusal(name: str) -> str | None:
    """Why a child cannot stand in for `ip netns exec NAME`; None if it can."""
    if not (NETNS_ROOT / name).exists():
        return f"no network namespace {name}"  # the caller's `ip netns exec` says it, its way
    if (ETC_ROOT / name).exists():
        return f"{ETC_ROOT / name} is bind-mounted over /etc by `ip netns exec`"
    return None


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise EnterError(code, f"{what}: {os.strerror(code)}")


def enter(name: str) -> None:
    """Join network namespace `name` and a mount namespace of our own with its /sys, as
    `ip netns exec` does; EnterError (the caller ends the child) where one step fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(NETNS_ROOT / name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise EnterError(error.errno, f'Cannot open network namespace "{name}": '
                         f"{error.strerror}") from None  # fmt: skip
    try:
        _check(libc.setns(fd, CLONE_NEWNET), f'setting the network namespace "{name}" failed')
    finally:
        os.close(fd)
    _check(libc.unshare(CLONE_NEWNS), "unshare failed")
    slave = libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None)
    _check(slave, '"mount --make-rslave /" failed')
    flags = 0
    if libc.umount2(b"/sys", MNT_DETACH) != 0:  # none mounted, or one we overlay (as iproute2:
        with contextlib.suppress(OSError):  # a read-only one only with a read-only one)
            flags = MS_RDONLY if os.statvfs("/sys").f_flag & ST_RDONLY else 0
    _check(libc.mount(name.encode(), b"/sys", b"sysfs", flags, None), "mount of /sys failed")


JOINED = frozenset({"net", "mnt"})  # what `join` takes from the caller


def unjoinable(pid: int, spaces: Mapping[str, str]) -> str | None:
    """Why a child cannot join the namespaces the caller `pid` named (`spaces`, its calling
    thread's): where they are not its process's (a thread that entered another one itself,
    deploy.devnet.hosts `inside`), Popen from that thread is what puts a child there."""
    for kind in sorted(JOINED):
        try:
            if os.readlink(f"/proc/{pid}/ns/{kind}") != spaces[kind]:
                return f"the caller's thread is in another {kind} namespace than its process"
        except OSError as error:
            return f"the caller's {kind} namespace: {error.strerror}"
    return None


def join(pid: int, spaces: Mapping[str, str]) -> None:
    """Join the network and mount namespaces of the caller `pid` (it waits for our pid, so it
    lives), as it named them in `spaces`: where a child it Popen'd would live (a `planet join`
    run inside a host starts its node and agent there). EnterError where they are not its."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
        if os.readlink(f"/proc/self/ns/{kind}") == spaces[kind]:
            continue
        try:
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            what = f"the caller's {kind} namespace: {error.strerror}"
            raise EnterError(error.errno, what) from None
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != spaces[kind]:
                what = f"the caller's {kind} namespace is not {spaces[kind]}"
                raise EnterError(errno.ESRCH, what)
            _check(libc.setns(fd, flag), f"joining the caller's {kind} namespace")
        finally:
            os.close(fd)
