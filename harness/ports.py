"""Loopback ports for the processes a test starts.

A port is drawn at random from `PLANET_TEST_PORTS` (default 10000-17999), a range below the
kernel's ephemeral ports (32768-60999 here) and apart from the fixed ranges the devnets and
benchmarks use (8000-8999, 18100-19999, 20000-29999). Drawing with `bind(("127.0.0.1", 0))`
instead gave a port the kernel could hand to any other socket (the other CI lane's test
servers, an outgoing connection) in the seconds before the node that was to use it had loaded
its shard and bound it. deploy/test.sh gives its two lanes disjoint halves of the range; within
one process a port is never handed out twice.
"""

from __future__ import annotations

import os
import random
import socket
import threading

DEFAULT_RANGE = (10_000, 17_999)  # inclusive

_HANDED_OUT: set[int] = set()  # every port this test process was given
_HANDED_OUT_LOCK = threading.Lock()
_DRAW = random.SystemRandom()


def port_range() -> tuple[int, int]:
    """(low, high), inclusive, from `PLANET_TEST_PORTS` ("LOW-HIGH") or the default."""
    text = os.environ.get("PLANET_TEST_PORTS", "")
    if not text:
        return DEFAULT_RANGE
    low, _, high = text.partition("-")
    if not (low.isdigit() and high.isdigit() and 1024 <= int(low) <= int(high) <= 65535):
        raise ValueError(f"PLANET_TEST_PORTS must be LOW-HIGH within 1024-65535, got {text!r}")
    return int(low), int(high)


def port_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound right now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_port() -> int:
    """A loopback port free right now, from this run's range, never handed out before in this
    process (two nodes started side by side once got one port: the second could not bind it,
    and the first answered for both)."""
    low, high = port_range()
    with _HANDED_OUT_LOCK:
        for _ in range(1000):
            port = _DRAW.randint(low, high)
            if port not in _HANDED_OUT and port_free(port):
                _HANDED_OUT.add(port)
                return port
    raise RuntimeError(f"no free loopback port left in {low}-{high} for this test run")
