"""`planet node serve`: run one compute node serving one layer shard of a prepared model;
`planet node numerics`: the numerics version the committee holds for it, and changing it."""

from __future__ import annotations

import argparse

from node.cli import numerics
from node.cli.seats import register_host
from node.cli.serve_args import add_serve_arguments, server_config

__all__ = ["register", "server_config"]  # server_config: test entry points wrap `serve()`

EXAMPLES = """\
examples:
  PLANET_PASSWORD=… planet node serve --manifest M --shard 0 --node-key ~/.planet/node_key.json
  planet node serve --manifest M --shard 2 --port 18102 --node-key K --idle-timeout 60
  planet node serve --manifest M --shard 0 --node-key K --max-sessions-per-peer 64  # gateway
  PLANET_PASSWORD=… planet node serve --manifest M --shard 1 --commit-dir run/served \\
      --node-key ~/.planet/node_key.json --committee-rpc http://127.0.0.1:26657   # spot checks
  planet node serve --manifest M --shard 0 --plaintext-links    # loopback tests, local only
  planet node serve --manifest M --shards 1-2 --node-key K       # shards 1 and 2 as one hop

links: TLS 1.3 whose certificate key is the node key (--node-key), so a client that knows the
key the node registered (the committee, a nodes file) can check it is talking to this node;
clients dial https://HOST:PORT plus the key. --plaintext-links serves http:// instead (local
mode: loopback tests, a network you own; a warning says so).

next hops (a circuit's links: a client's `open` names the URL this node dials next):
  planet node serve --manifest M --shard 0 --next-hops http://10.0.0.8:18101,http://10.0.0.9:18101
  planet node serve --manifest M --shard 0 --next-hops-file hops.txt     # one URL a line
  planet node serve --manifest M --shard 0 --committee-rpc http://127.0.0.1:26657 \\
      --next-hops committee     # routable nodes of the next shard on the committee chain,
                                # at public addresses only (--private-next-hops: devnet, LAN;
                                # --private-next-hops 10.77.0.0/24: only that private range)
  planet node serve --manifest M --shard 0 --next-hops any    # development only: dials anything
  default: committee when --committee-rpc is given, else none (the node forwards to nobody; it
  still serves as the last hop)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "node",
        help="run a compute node, or change the numerics version it announces",
        description="Run a compute node (one layer shard); show or change the numerics "
        "version the committee holds for it.",
    )
    sub = parser.add_subparsers(dest="node_command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve one shard of a prepared model over HTTP",
        description="Serve one shard of a prepared model over HTTP. Refuses to start if the "
        "shard file's hash differs from the manifest.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)
    register_host(sub)
    numerics.register(sub)
    parser.set_defaults(help_parser=parser)


def _serve(args: argparse.Namespace) -> int:
    # lazy: the node's runtime (aiohttp, numpy)
    from node.server.run import serve

    config, node_key = server_config(args)
    serve(config, node_key)
    return 0
