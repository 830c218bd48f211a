"""Loopback ports for the processes a test starts."""

from __future__ import annotations

import socket
import threading

_HANDED_OUT: set[int] = set()  # every port this test process was given
_HANDED_OUT_LOCK = threading.Lock()


def ephemeral_port() -> int:
    """A loopback port free right now and never handed out before in this process. The
    kernel may give a port released a moment ago again: two nodes started side by side got
    one port, the second could not bind it, and the first answered for both."""
    with _HANDED_OUT_LOCK:
        for _ in range(1000):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError("no loopback port left that this test run has not handed out")
