"""One zygote (node/zygote) for a test session: `running(folder)` starts
`python -m node.zygote` and yields its socket path once it answers, or None if it did not
come up (the tests then start their processes with Popen, as without it).

tests/conftest.py's `zygote_lane` starts it for the integration and e2e tests and exports
$PLANET_ZYGOTE, so every `python -m ...` service that the tests, the devnet and the CLI
commands they run start through `node.procs.spawn_process` is forked from it. The zygote
exits with the session, or with the pytest process that started it (--parent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from node.zygote.wire import receive, send

log = logging.getLogger(__name__)
READY_S = 90.0  # the preload: ~3 CPU-s, much longer on a loaded 2-core machine


def ping(path: Path) -> int | None:
    """The zygote's pid once it serves on `path`; None before (or never)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5.0)
        try:
            conn.connect(str(path))
            send(conn, {"op": "ping"})
            answer = receive(conn)
        except (OSError, ValueError):
            return None
    pid = answer[0].get("pid") if answer is not None and answer[0].get("ready") else None
    return pid if isinstance(pid, int) else None


@contextlib.contextmanager
def running(folder: Path, *, preload: str | None = None) -> Iterator[Path | None]:
    """A zygote with its socket and log (zygote.log) in `folder`; `preload`: its
    --preload list (default: node.zygote.server.PRELOAD)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "zygote.sock"
    argv = [sys.executable, "-m", "node.zygote", str(path), "--parent", str(os.getpid())]
    if preload is not None:
        argv += ["--preload", preload]
    with open(folder / "zygote.log", "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + READY_S
        while not (path.exists() and ping(path) is not None):
            if process.poll() is not None or time.monotonic() > deadline:
                log.warning("zygote did not start (see %s); processes start with Popen", folder)
                yield None
                return
            time.sleep(0.1)
        yield path
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
