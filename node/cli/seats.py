"""`planet node host` (one process serving several shards, of one or more models) and
`planet node add` (a seat added to a running host): node/server/host.py, node/server/seats.py."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from protocol.errors import UsageError

if TYPE_CHECKING:
    from node.server.config import ServerConfig

HOST_EXAMPLES = """\
examples:
  planet node host --seats run/seats.json --memory-budget-mb 4096
  planet node add --seats run/seats.json -- --manifest M1 --shard 0 --port 18101 --node-key K1
  planet node add --seats run/seats.json -- --manifest M2 --shard 0 --port 18102 --node-key K2

A seat is one shard of one model with the arguments of `planet node serve` (after --): its own
port, node key (so its own registration, price and credits on the committee), sessions and KV
caps. The host starts the seats file's seats at start and on SIGHUP (`planet node add` appends
one and signals); a seat whose shard weights + --max-cache-mb + --prefix-cache-mb do not fit in
what --memory-budget-mb has left is refused by name (memory_budget_exceeded), the others keep
serving. The host writes <seats file>.status.json after each pass.
"""


class _SeatParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"seat: {message}", hint="a seat takes `planet node serve`'s arguments")


def register_host(sub: argparse._SubParsersAction) -> None:
    host = sub.add_parser(
        "host",
        help="serve several shards (of one or more models) in one process",
        description="Serve the seats of a seats file in one process, under one memory budget.",
        epilog=HOST_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    host.add_argument(
        "--seats", type=Path, required=True, help="the seats file (JSON; created empty if missing)"
    )
    host.add_argument(
        "--memory-budget-mb",
        type=int,
        default=0,
        help="MiB the seats may hold in all: shard weights + KV caps (default 0: no budget)",
    )
    host.add_argument("--threads", type=int, default=0, help="torch threads (0: half the cores)")
    host.set_defaults(handler=_host)
    add = sub.add_parser(
        "add",
        help="add a seat (a shard of a model) to a running `planet node host`",
        description="Append a seat to the seats file and signal the host; wait for its answer.",
        epilog=HOST_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("--seats", type=Path, required=True, help="the host's seats file")
    add.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (120)")
    add.add_argument("argv", nargs=argparse.REMAINDER, help="-- then `planet node serve` args")
    add.set_defaults(handler=_add)


def parse_seat(argv: tuple[str, ...]) -> tuple[ServerConfig, Any]:
    """A seat's `planet node serve` arguments → (its validated config, its node key or None)."""
    from node.cli.serve_args import add_serve_arguments, server_config

    parser = _SeatParser(prog="seat", add_help=False)
    add_serve_arguments(parser)
    return server_config(parser.parse_args(list(argv)))


def _host(args: argparse.Namespace) -> int:
    # lazy: the node's runtime (aiohttp, numpy, torch)
    from node.server.host import SeatHost, run_host
    from node.server.run import configure_torch_threads, shard_app
    from node.server.seats import MemoryBudget, write_json

    if args.memory_budget_mb < 0:
        raise UsageError("--memory-budget-mb must be >= 0 (0: no budget)")
    if not args.seats.exists():  # a host started empty: `planet node add` gives it seats
        write_json(args.seats, {"seats": []})
    configure_torch_threads(args.threads)
    host = SeatHost(
        seats_file=args.seats,
        budget=MemoryBudget(args.memory_budget_mb * 1024 * 1024),
        parse=parse_seat,
        load=lambda config, key: shard_app(config, key),
    )
    asyncio.run(run_host(host))
    return 0


def _add(args: argparse.Namespace) -> int:
    from node.server.seats import SeatSpec, add_seat

    argv = tuple(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    parse_seat(argv)  # refused here, before the host sees it
    entry = add_seat(args.seats, SeatSpec(argv), args.timeout)
    print(f"serving shard {entry['shard']} of {entry['model']} at {entry['url']}")
    return 0
