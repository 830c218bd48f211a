"""The zygote's process: preload, then accept requests on a unix socket and fork a child for
each one that fits (node.zygote.fit), reaping them and reporting each exit status.

Single-threaded by construction — one selector loop, SIGCHLD and SIGTERM through the wakeup
fd — and it checks `/proc/self/task` before every fork: a fork of a process with other threads
(an OpenMP pool, an asyncio executor) could copy a held lock, so with more than one thread it
refuses and the caller starts the process afresh. The preload imports modules only; nothing
runs a tensor op, starts a loop or touches CUDA. The socket is the caller's to protect: it is
created mode 0600 and a peer of another uid is refused (SO_PEERCRED).

It exits on SIGTERM or when the process that started it (`--parent`) dies, and leaves its
children running: they are session leaders, as Popen'd ones would be, stopped by whoever
started them.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import importlib
import os
import select
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from node.zygote import child, cmdline
from node.zygote.fit import Fit, Recorder
from node.zygote.wire import STDIO_FDS, BadRequest, SpawnRequest, parse_spawn, receive, send

# what the services import before they serve: torch (nodes, gateways, verifiers), aiohttp,
# web3 (agents, watchers, gateways), the CLI and the node's server; abci_app's state machine
PRELOAD = (
    "torch",
    "numpy",
    "aiohttp.web",
    "web3",
    "planet.main",
    "node.cli.node",
    "node.server.run",
    "node.server.app",
    "node.model.shard",
    "node.model.fast",
    "node.model.head",
    "node.gateway.run",
    "abci_app.app",
)
PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 10.0  # a child's set-up: a few ms


def say(line: str) -> None:
    """One line on the zygote's own log (no logging handlers: a child would inherit them)."""
    print(f"{time.strftime('%H:%M:%S')} zygote[{os.getpid()}] {line}", file=sys.stderr, flush=True)


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def preload(names: Sequence[str]) -> Fit:
    """Import `names` (each one that fails is noted and skipped), recording the environment
    they read."""
    env = dict(os.environ)
    os.environ.__class__ = Recorder
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as error:  # a module that is not installed here
                say(f"preload {name}: {type(error).__name__}: {error}")
    finally:
        os.environ.__class__ = os._Environ
    return Fit.after_preload(env, Recorder.READ)


class Zygote:
    def __init__(self, path: Path, fit: Fit, parent: int | None) -> None:
        self.path, self.fit, self.parent = path, fit, parent
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        old_umask = os.umask(0o177)
        try:
            path.unlink(missing_ok=True)
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(str(path))
        finally:
            os.umask(old_umask)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def loop(self) -> SpawnRequest | None:
        """Serve until stopped (None); in a forked child, return its request."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        if self.parent is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != self.parent:
                return None
        say(f"ready on {self.path} ({threads()} thread, {len(sys.modules)} modules)")
        while not self.stopping:
            for key, _ in self.selector.select(timeout=5.0):
                if key.data == "accept":
                    request = self._accept()
                    if request is not None:
                        return request  # in the child
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self._client_closed(key.data)
            self._reap()
            if self.parent is not None and os.getppid() != self.parent:
                self.stopping = True
        self.close()
        return None

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if (
                self.path.exists()
                and os.stat(self.path).st_ino == os.fstat(self.listener.fileno()).st_ino
            ):
                self.path.unlink()
        say(f"stopped; {len(self.children)} children left running")

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                self.selector.unregister(conn)
                conn.close()

    def _client_closed(self, pid: int) -> None:
        conn = self.children.pop(pid, None)
        if conn is not None:  # the caller dropped its handle: the child runs on
            self.selector.unregister(conn)
            conn.close()

    def _accept(self) -> SpawnRequest | None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer, uid, _gid = struct.unpack("3i", creds)
            conn.settimeout(5.0)
            message = receive(conn, max_fds=max(STDIO_FDS.values()))
            if message is None:
                conn.close()
                return None
            body, fds = message
            if uid != os.getuid():
                raise BadRequest("peer", f"uid {uid} is not the zygote's")
            if body.get("op") == "ping":
                send(conn, {"ready": True, "pid": os.getpid()})
                conn.close()
                return None
            request = dataclasses.replace(parse_spawn(body), caller=peer)
            expected = STDIO_FDS[request.stdio]
            if len(fds) != expected:
                raise BadRequest("fds", f"{expected} fds expected for {request.stdio}")
            why = self.fit.refusal(request)
            if why is None and threads() > 1:
                why = f"{threads()} threads in the zygote"
            if why is not None:
                say(f"refused {request.module}: {why}")
                send(conn, {"refused": why})
                conn.close()
                return None
            stdio, fds = fds, []
            return self._fork(conn, request, stdio)
        except (BadRequest, OSError, ValueError) as error:
            say(f"bad request: {error}")
            with contextlib.suppress(OSError):
                send(conn, {"refused": str(error)})
            conn.close()
            return None
        finally:
            for fd in fds:
                os.close(fd)

    def _fork(
        self, conn: socket.socket, request: SpawnRequest, stdio: list[int]
    ) -> SpawnRequest | None:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            self._become_child(conn, request, stdio, ready_w)
            return request
        for fd in stdio:
            os.close(fd)
        os.close(ready_w)
        select.select([ready_r], [], [], READY_TIMEOUT_S)  # its argv shows in /proc (or it died)
        os.close(ready_r)
        conn.settimeout(None)
        conn.setblocking(False)
        try:
            send(conn, {"pid": pid})
        except OSError:
            conn.close()  # the caller is gone before it heard the pid: the child runs on
            return None
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        say(f"forked {pid}: {request.module} {' '.join(request.argv[3:6])}")
        return None

    def _become_child(
        self, conn: socket.socket, request: SpawnRequest, stdio: list[int], ready_fd: int
    ) -> None:
        try:
            signal.set_wakeup_fd(-1)  # before its fd closes and the number is reused
            self.selector.close()
            for sock in (conn, self.listener, *self.children.values()):
                sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            child.prepare(request, stdio, ready_fd)
        except BaseException:  # nothing may unwind into the zygote's loop
            with contextlib.suppress(Exception):
                os.write(2, traceback.format_exc().encode())
            os._exit(127)


def main(argv: Sequence[str]) -> SpawnRequest | None:
    """`python -m node.zygote SOCKET [--parent PID] [--preload a,b,...]`."""
    args = list(argv)
    parent = preload_names = None
    while len(args) > 1 and args[-2] in ("--parent", "--preload"):
        if args[-2] == "--parent":
            parent = int(args[-1])
        else:
            preload_names = [n for n in args[-1].split(",") if n]
        del args[-2:]
    if len(args) != 1:
        print("usage: python -m node.zygote SOCKET [--parent PID] [--preload a,b,...]",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    fit = preload(PRELOAD if preload_names is None else preload_names)
    try:  # the child's /proc view must work here, or every child would pass for the zygote
        cmdline.show(sys.orig_argv, os.environ)
    except cmdline.CmdlineError as error:
        say(f"cannot set a child's command line ({error}); not serving")
        raise SystemExit(3) from None
    if threads() > 1:
        say(f"{threads()} threads after the preload; not serving")
        raise SystemExit(3)
    # what the preload built stays out of the collector's scans: each child would otherwise
    # walk (and so copy, page by page) the whole inherited heap at its first full collection
    gc.collect()
    gc.freeze()
    return Zygote(Path(args[0]), fit, parent).loop()
