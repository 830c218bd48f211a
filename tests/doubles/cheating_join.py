"""An operator joining a cheating node: `planet join` plus `--cheat MODE`.

    python -m tests.doubles.cheating_join --cheat MODE join --model M --shard K --home H ...

Runs the real `planet join` (stake check, shard check against the registry, the node key, the
agent, waiting until routable) with one difference: the compute node it starts is
tests/doubles/cheating_node.py with `--cheat MODE` instead of `planet node serve`, and in mode
`silent` the agent is started without `--commit-dir` (the node serves and records, but nothing
is committed: serving without commits). The product's `planet join` knows nothing of cheats;
`planet devnet up --cheat-node MODE` starts this module for demos and tests of verification.
The cheating node's process names MODULE (not the planet CLI), so `planet leave` stops only
its agent: stop the node with `node.server.launcher.stop_pid(pid, module=cheating_node.MODULE)`
(`planet devnet down` does).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from node.agent import launch
from node.procs import exit_process
from planet.main import main as planet
from protocol.errors import PlanetError
from tests.doubles import cheating_node
from tests.doubles.cheating import parse_mode

MODULE = "tests.doubles.cheating_join"


def _cheating_launcher(mode: str) -> Any:
    """`node.agent.launch`'s `start_node` and `spawn_logged`, redirected to the cheat."""
    real_start, real_spawn = launch.start_node, launch.spawn_logged

    def start_node(**kwargs: Any) -> Any:
        extra = [*kwargs.pop("extra_args", ()), *cheating_node.cheat_args(mode)]
        return real_start(**kwargs, extra_args=extra, module=cheating_node.MODULE)

    def spawn_logged(argv: Sequence[str], *args: Any, **kwargs: Any) -> Any:
        argv = list(argv)
        if parse_mode(mode).kind == "silent" and "--commit-dir" in argv:
            at = argv.index("--commit-dir")
            del argv[at : at + 2]  # the agent commits nothing
        return real_spawn(argv, *args, **kwargs)

    return start_node, spawn_logged


def main(argv: Sequence[str] | None = None) -> int:
    own = argparse.ArgumentParser(prog=MODULE, add_help=False, allow_abbrev=False)
    own.add_argument("--cheat", required=True, metavar="MODE")
    known, rest = own.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        mode = str(parse_mode(known.cheat))
    except PlanetError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return error.exit_status
    if [word for word in rest if not word.startswith("-")][:1] != ["join"]:
        print("error: only `join` can cheat", file=sys.stderr)
        print(f"hint: python -m {MODULE} --cheat MODE join --model M --shard K", file=sys.stderr)
        return 2
    launch.start_node, launch.spawn_logged = _cheating_launcher(mode)
    return planet(rest)


if __name__ == "__main__":
    exit_process(main)
