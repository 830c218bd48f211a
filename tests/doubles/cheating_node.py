"""A compute node that computes wrongly on purpose: `planet node serve` plus `--cheat MODE`.

    python -m tests.doubles.cheating_node -v node serve --manifest M --shard 1 ... --cheat MODE

Takes the arguments of `planet node serve` (parsed and checked by the CLI's own code,
`node.cli.node.server_config`) and one more, `--cheat MODE` (tests/doubles/cheating.py lists the
modes); loads the shard, wraps it in the cheat and hands it to the real `node.server.run.serve`.
In a `...:withhold` mode the process also replaces `node.server.tickets.authorize_selection`
(looked up by the ticket policies at each request) with `cheating.withholding` of it while it
serves: only the assigned verifier of a spot check gets the ticket.
The product's CLI and ServerConfig know nothing of cheats: a test starts this module with the
node launcher (`start_node(module=MODULE, extra_args=(..., "--cheat", MODE))`) and stops it
with `stop_pid(pid, module=MODULE)`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from node.procs import exit_process
from node.server import tickets
from tests.doubles.cheating import parse_mode, withholding, wrap
from tests.doubles.wrapped_node import main_of, serve_wrapped

MODULE = "tests.doubles.cheating_node"


def cheat_args(mode: str) -> tuple[str, str]:
    """The extra node arguments that make this module cheat in `mode` (checked here)."""
    return ("--cheat", str(parse_mode(mode)))


def run(argv: Sequence[str]) -> int:
    """Serve until signalled; PlanetError (UsageError, ConfigError, …) for bad arguments."""
    own = argparse.ArgumentParser(prog=MODULE, add_help=False, allow_abbrev=False)
    own.add_argument("--cheat", required=True, metavar="MODE")
    known, rest = own.parse_known_args(argv)
    mode = parse_mode(known.cheat)
    honest_authorize = tickets.authorize_selection
    if mode.withhold:  # the policies look it up in the module at each request
        tickets.authorize_selection = withholding(honest_authorize)
    try:
        return serve_wrapped(
            MODULE,
            "cheat",
            rest,
            lambda honest: wrap(honest, mode, seed=honest.shard_id),
            f"CHEATING NODE mode={mode}",
        )
    finally:
        tickets.authorize_selection = honest_authorize


def main(argv: Sequence[str] | None = None) -> int:
    return main_of(run, argv)


if __name__ == "__main__":
    exit_process(main)
