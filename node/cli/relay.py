"""`planet relay serve`: run a relay of the overlay (docs/overlay.md)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from node.config import default_home
from node.procs import run_service

EXAMPLES = """\
examples:
  planet relay serve --port 9100                      a relay on loopback, key in $PLANET_HOME
  planet relay serve --host 0.0.0.0 --port 9100 --home /srv/relay
  planet relay serve --port 9101 --allow-private-next-hops   a devnet on one machine
what it does: forwards users' cloves along paths it knows one step of each way (its
predecessor and its successor), adding or removing one encryption layer per cell; it never
sees a prompt, a token or who asked. Its key (X25519, <home>/relay_key, 0600) is made at first
start; users' clients need its URL and the public key it prints (also at /info).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "relay",
        help="run a relay of the overlay (forwards users' cloves)",
        description="Run a relay of the overlay.",
    )
    sub = parser.add_subparsers(dest="relay_command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="forward cloves along users' paths until stopped",
        description="Forward users' cloves along their paths, one layer per hop, until stopped.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--home", type=Path, help="where the relay's key lives (default: PLANET_HOME)"
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, default=9100, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--allow-private-next-hops",
        action="store_true",
        help="also dial next hops at loopback and private addresses (a devnet or a LAN; "
        "default: public addresses only, as next hops are strangers' choice)",
    )
    serve.add_argument("--log-level", default="info", help="debug, info, warning (default: info)")
    serve.set_defaults(handler=_serve)
    parser.set_defaults(help_parser=parser)


def _serve(args: argparse.Namespace) -> int:
    from node.relay.run import serve  # lazy: aiohttp, nacl

    home = args.home or default_home()
    # `planet`'s own logging set-up ran first (at warning unless -v): the relay's level wins
    logging.getLogger().setLevel(args.log_level.upper())
    return run_service(
        lambda: serve(home, args.host, args.port, allow_private=args.allow_private_next_hops),
        log_level=args.log_level,
        log=logging.getLogger("planet.relay"),
    )
