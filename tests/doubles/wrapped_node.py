"""`planet node serve` with its shard backend wrapped: the common start of the test doubles
that compute differently from an honest node (cheating_node.py, slow_node.py).

    serve_wrapped(MODULE, "cheat", rest, lambda honest: wrap(honest, mode), "CHEATING NODE …")

`rest` is the `planet node serve` command line (parsed and checked by the CLI's own code,
`node.cli.node.server_config`); the shard is loaded as the product loads it, wrapped, and handed
to the real `node.server.run.serve`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from node.cli.node import server_config
from node.server.backend import ModelShardBackend
from node.server.run import configure_torch_threads, serve
from planet.main import build_parser
from protocol.errors import PlanetError, UsageError

log = logging.getLogger(__name__)


def serve_wrapped(
    module: str,
    doing: str,
    rest: Sequence[str],
    wrap: Callable[[ModelShardBackend], Any],
    banner: str,
) -> int:
    """Serve until signalled; UsageError unless `rest` is a `node serve` command line."""
    if [word for word in rest if not word.startswith("-")][:2] != ["node", "serve"]:
        raise UsageError(f"only `node serve` can {doing}", hint=f"{module} -v node serve ...")
    args = build_parser().parse_args(list(rest))
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config, node_key = server_config(args)
    configure_torch_threads(config.torch_threads)  # before the load, as serve() does
    honest = ModelShardBackend(config.manifest_path, config.shard_id, device=config.device)
    log.warning("%s (tests only)", banner)
    serve(config, node_key, backend=wrap(honest))
    return 0


def main_of(run: Callable[[Sequence[str]], int], argv: Sequence[str] | None) -> int:
    """A double's `main`: `run(argv)`, a PlanetError printed as the CLI prints it."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except PlanetError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_status
