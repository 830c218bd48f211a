"""`planet`: the one command line for users, node operators, verifier operators and whoever
runs a network.

Each command group lives in its own module, named in `COMMANDS` below: the user and operator
commands under `node.cli`, the network's commands (`devnet`, `committee`, `contracts`) under
`deploy.cli`, so the layers read top-down (this entry -> deploy -> node). Each group exposes
`register(subparsers)`, which adds its sub-parser and sets `handler=<callable(args) -> int>` on
each leaf command. A group with sub-commands sets `help_parser=<its parser>` instead: `planet
GROUP` alone prints that group's help and exits 2.
Errors: a `PlanetError` becomes `error: ...` / `hint: ...` on stderr and its exit status;
Ctrl-C exits 130; anything else is a bug and keeps its traceback.

A run imports only the group of the command it runs (`COMMANDS` maps each top-level command to
its module): `planet node serve` does not load the devnet, gateway or earnings commands, which
cost ~0.1 CPU-s of each of the hundreds of `planet` starts in a CI run (issue 41). `planet`,
`planet --help` and a word that is no command build the whole parser. Command modules import at
the top, except what would slow every `planet` command (torch, numpy, aiohttp, the web3 /
eth-account stack, nacl): those imports sit in the function that needs them, marked
`# lazy: <what it loads>`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType

from protocol.errors import PlanetError

# Each top-level command and the module that registers it, in the order `planet --help` lists
# them (the user and operator commands under node.cli, the network's under deploy.cli).
COMMANDS: dict[str, str] = {
    "model": "node.cli.model",
    "committee": "deploy.cli.committee",
    "node": "node.cli.node",
    "local": "node.cli.local",
    "ask": "node.cli.ask",
    "balance": "node.cli.balance",
    "credits": "node.cli.credits",
    "key": "node.cli.key",
    "gateway": "node.cli.gateway",
    "verifier": "node.cli.verifier",
    "relay": "node.cli.relay",
    "contracts": "deploy.cli.contracts",
    "stake": "node.cli.operator",
    "unstake": "node.cli.operator",
    "withdraw": "node.cli.operator",
    "join": "node.cli.operator",
    "leave": "node.cli.operator",
    "status": "node.cli.operator",
    "earnings": "node.cli.earnings",
    "claim": "node.cli.earnings",
    "devnet": "deploy.cli.devnet",
}
_VERBOSE = re.compile("-v+|--verbose")


def command_modules(command: str | None = None) -> tuple[ModuleType, ...]:
    """The command groups to register: the one of `command`, or every group (None)."""
    names = COMMANDS.values() if command is None else (COMMANDS[command],)
    return tuple(importlib.import_module(name) for name in dict.fromkeys(names))


def command_of(argv: Sequence[str]) -> str | None:
    """The top-level command `argv` runs when it names one after `-v` flags only; None (the
    whole parser) for no command, `--help`, any other option first, or a word that is none."""
    for word in argv:
        if not _VERBOSE.fullmatch(word):
            return word if word in COMMANDS else None
    return None


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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`planet`'s parser with `command`'s group only, or with every group (None)."""
    parser = argparse.ArgumentParser(
        prog="planet",
        description="Planet: open LLMs served by a network of compute nodes holding layer shards.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logs on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in command_modules(command):
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
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(words))
    args = parser.parse_args(words)
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
