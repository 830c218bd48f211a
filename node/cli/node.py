"""`planet node serve`: run one compute node serving one layer shard of a prepared model."""

from __future__ import annotations

import argparse
from pathlib import Path

from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet node serve --manifest ~/.cache/planet/models/smollm2-135m-3p-none/manifest.json --shard 0
  planet node serve --manifest M --shard 2 --port 18102 --idle-timeout 60 --max-cache-mb 512
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "node",
        help="run a compute node",
        description="Run a compute node (one layer shard).",
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
    serve.add_argument("--manifest", type=Path, required=True, help="the model's manifest.json")
    serve.add_argument("--shard", type=int, required=True, help="shard id to serve")
    serve.add_argument("--port", type=int, default=18100, help="TCP port (default 18100)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default auto)")
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="evict sessions idle this long (default 300)",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="open sessions before answering busy (default 64)",
    )
    serve.add_argument(
        "--max-cache-mb",
        type=float,
        default=2048.0,
        help="KV cache over all sessions before answering busy (default 2048)",
    )
    serve.add_argument(
        "--max-request-mb", type=float, default=32.0, help="largest accepted frame (default 32)"
    )
    serve.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for the forward pass (default: half the cores, 1 to 4)",
    )
    serve.set_defaults(handler=_serve)
    parser.set_defaults(help_parser=parser)


def _serve(args: argparse.Namespace) -> int:
    from node.server.config import ServerConfig
    from node.server.run import serve

    if not args.manifest.exists():
        raise UsageError(
            f"no manifest at {args.manifest}",
            hint="prepare the model first: planet model prepare --parts 3",
        )
    config = ServerConfig(
        manifest_path=args.manifest,
        shard_id=args.shard,
        host=args.host,
        port=args.port,
        device=args.device,
        idle_timeout_s=args.idle_timeout,
        max_sessions=args.max_sessions,
        max_cache_bytes=int(args.max_cache_mb * 1024 * 1024),
        max_request_bytes=int(args.max_request_mb * 1024 * 1024),
        torch_threads=args.threads,
    ).validate()
    serve(config)
    return 0
