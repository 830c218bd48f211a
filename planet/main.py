"""`planet`: the one command line for users, node operators, verifier operators and whoever
runs a network.

Each command group lives in its own module, imported below: the user and operator commands
under `node.cli`, the network's commands (`devnet`, `committee`, `contracts`) under `deploy.cli`,
so the layers read top-down (this entry -> deploy -> node). Each group exposes
`register(subparsers)`, which adds its sub-parser and sets `handler=<callable(args) -> int>` on
each leaf command. A group with sub-commands sets `help_parser=<its parser>` instead: `planet
GROUP` alone prints that group's help and exits 2.
Errors: a `PlanetError` becomes `error: ...` / `hint: ...` on stderr and its exit status;
Ctrl-C exits 130; anything else is a bug and keeps its traceback.

Command modules import at the top, except what would slow every `planet` command (torch,
numpy, aiohttp, the web3 / eth-account stack, nacl): those imports sit in the function that
needs them, marked `# lazy: <what it loads>`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from deploy.cli import committee, contracts, devnet
from node.cli import (
    ask,
    balance,
    credits,
    earnings,
    gateway,
    key,
    local,
    model,
    operator,
    relay,
    verifier,
)
from node.cli import node as node_commands
from protocol.errors import PlanetError

# Command groups, in the order `planet --help` lists them.
COMMAND_MODULES: tuple[ModuleType, ...] = (
    model,
    committee,
    node_commands,
    local,
    ask,
    balance,
    credits,
    key,
    gateway,
    verifier,
    relay,
    contracts,
    operator,
    earnings,
    devnet,
)

EPILOG = """\
examples:
  planet devnet up --detach                       the whole network on this machine
  planet stake --role compute --amount 1          lock stake from your wallet
  planet join --model smollm2-135m-3p-int8 --shard 0   serve a shard until `planet leave`
  planet earnings                                 what your served work earned, per epoch
  planet claim                                    claim settled epochs from the escrow
  planet model prepare --parts 3 --quant int8     split the default model into 3 shards
  planet local up --nodes 3                       start 3 shard nodes on loopback
  planet ask "What is the capital of France?"     ask through the running nodes
  planet key new --cap 0.01 --expires 7d          one API key for many paid questions
  planet local down                               stop them
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planet",
        description="Planet: open LLMs served by a network of compute nodes holding layer shards.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logs on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_MODULES:
        group.register(sub)
    return parser


def _configure_logging(verbosity: int) -> None:
    """-v info, -vv debug; PLANET_LOG_LEVEL (a level name) wins when set."""
    level = os.environ.get("PLANET_LOG_LEVEL", "").upper() or (
        logging.WARNING - 10 * min(verbosity, 2)
    )
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    handler = getattr(args, "handler", None)
    if handler is None:
        getattr(args, "help_parser", parser).print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except PlanetError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
