"""A compute node that is FACTOR times slower than its replicas: `planet node serve` plus
`--slow-factor FACTOR` (the resilience bench's and the load-aware tests' slow node).

    python -m tests.doubles.slow_node -v node serve --manifest M --shard 1 ... --slow-factor 3

Every forward call (a decode batch or a prefill chunk) is timed and followed by a sleep of
(FACTOR - 1) × its time on the forward thread, so the node computes the same numbers, its
/info counters (decode_s, busy time) show the slowness, and every session waits for it, like a
node on a CPU with 1/FACTOR of the share. The product knows nothing of it; start it with
`start_node(module=MODULE, extra_args=("--slow-factor", "3"))`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from node.procs import exit_process
from protocol.errors import UsageError
from tests.doubles.wrapped_node import main_of, serve_wrapped

MODULE = "tests.doubles.slow_node"


class Slowed:
    """A shard backend whose forward calls take `factor` times as long."""

    def __init__(self, inner: Any, factor: float) -> None:
        self.inner = inner
        self.factor = factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _slow(self, started: float) -> None:
        time.sleep((self.factor - 1) * (time.perf_counter() - started))

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        started = time.perf_counter()
        out = self.inner.forward(hidden, positions, cache)
        self._slow(started)
        return out

    def forward_batch(self, hidden: np.ndarray, positions: np.ndarray, caches: Any) -> np.ndarray:
        started = time.perf_counter()
        out = self.inner.forward_batch(hidden, positions, caches)
        self._slow(started)
        return out


def run(argv: Sequence[str]) -> int:
    own = argparse.ArgumentParser(prog=MODULE, add_help=False, allow_abbrev=False)
    own.add_argument("--slow-factor", type=float, required=True)
    known, rest = own.parse_known_args(argv)
    if not 1.0 <= known.slow_factor <= 100.0:
        raise UsageError("--slow-factor must be 1..100")
    factor = known.slow_factor
    slowed = f"SLOW NODE factor={factor:g}"
    return serve_wrapped(MODULE, "be slowed", rest, lambda honest: Slowed(honest, factor), slowed)


def main(argv: Sequence[str] | None = None) -> int:
    return main_of(run, argv)


if __name__ == "__main__":
    exit_process(main)
