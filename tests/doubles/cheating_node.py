"""A compute node that computes wrongly on purpose: `planet node serve` plus `--cheat MODE`.

    python -m tests.doubles.cheating_node -v node serve --manifest M --shard 1 ... --cheat MODE

Takes the arguments of `planet node serve` (parsed and checked by the CLI's own code,
`node.cli.node.server_config`) and one more, `--cheat MODE` (tests/doubles/cheating.py lists the
modes); loads the shard, wraps it in the cheat and hands it to the real `node.server.run.serve`.
The product's CLI and ServerConfig know nothing of cheats: a test starts this module with the
node launcher (`start_node(module=MODULE, extra_args=(..., "--cheat", MODE))`) and stops it
with `stop_pid(pid, module=MODULE)`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from node.cli.main import build_parser
from node.cli.node import server_config
from node.server.backend import ModelShardBackend
from node.server.run import configure_torch_threads, serve
from protocol.errors import PlanetError, UsageError
from tests.doubles.cheating import parse_mode, wrap

MODULE = "tests.doubles.cheating_node"
log = logging.getLogger(__name__)


def cheat_args(mode: str) -> tuple[str, str]:
    """The extra node arguments that make this module cheat in `mode` (checked here)."""
    return ("--cheat", str(parse_mode(mode)))


def run(argv: Sequence[str]) -> int:
    """Serve until signalled; PlanetError (UsageError, ConfigError, …) for bad arguments."""
    own = argparse.ArgumentParser(prog=MODULE, add_help=False, allow_abbrev=False)
    own.add_argument("--cheat", required=True, metavar="MODE")
    known, rest = own.parse_known_args(argv)
    mode = parse_mode(known.cheat)
    if [word for word in rest if not word.startswith("-")][:2] != ["node", "serve"]:
        raise UsageError("only `node serve` can cheat", hint=f"{MODULE} -v node serve ...")
    args = build_parser().parse_args(rest)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    config, node_key = server_config(args)
    configure_torch_threads(config.torch_threads)  # before the load, as serve() does
    honest = ModelShardBackend(config.manifest_path, config.shard_id, device=config.device)
    log.warning("CHEATING NODE mode=%s (tests only)", mode)
    serve(config, node_key, backend=wrap(honest, mode, seed=honest.shard_id))
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
