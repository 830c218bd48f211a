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
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from node.cli.main import build_parser
from node.cli.node import server_config
from node.server.backend import ModelShardBackend
from node.server.run import configure_torch_threads, serve
from protocol.errors import PlanetError, UsageError

MODULE = "tests.doubles.slow_node"
log = logging.getLogger(__name__)


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
    if [word for word in rest if not word.startswith("-")][:2] != ["node", "serve"]:
        raise UsageError("only `node serve` can be slowed", hint=f"{MODULE} -v node serve ...")
    args = build_parser().parse_args(rest)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config, ticket_key = server_config(args)
    configure_torch_threads(config.torch_threads)
    backend = ModelShardBackend(config.manifest_path, config.shard_id, device=config.device)
    log.warning("SLOW NODE factor=%g (tests only)", known.slow_factor)
    serve(config, ticket_key, backend=Slowed(backend, known.slow_factor))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except PlanetError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_status


if __name__ == "__main__":
    sys.exit(main())
