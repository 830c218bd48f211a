"""`planet local up|down|status`: a whole circuit of shard nodes on this machine (loopback).

`up` prepares the model if needed (node.model.prepare), starts one detached node process per
shard with its log and pid file under `$PLANET_HOME/local/`, waits until each answers /health,
writes the nodes file `planet ask` reads by default, and prints what runs where. `down` stops
them (SIGTERM, then SIGKILL) and is safe to run twice. `status` says what runs.

Local mode: the nodes run with `--plaintext-links` (http:// on 127.0.0.1; the bytes never leave
the machine) and say so. Nodes that strangers reach serve TLS bound to their node key
(`planet join`, `planet node serve --node-key`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from node.client.nodesfile import NodeRef, NodesFile, default_nodes_path, local_run_dir
from node.model.manifest import Manifest
from protocol.canonical import loads_bounded
from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet local up --nodes 3                 3 nodes, unquantized shards, ports from 18100
  planet local up --nodes 5 --quant int8    5 nodes with int8 shards
  planet local status --json
  planet local down
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "local",
        help="run a circuit of shard nodes on this machine",
        description="Run a circuit of shard nodes on this machine (loopback only).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="local_command", metavar="COMMAND")
    up = sub.add_parser(
        "up",
        help="prepare the model and start one node per shard",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--nodes", type=int, default=3, help="number of nodes/shards (default 3)")
    up.add_argument(
        "--quant",
        choices=("none", "int8", "int4"),
        default="none",
        help="shard weights (default none = fp32)",
    )
    up.add_argument("--model", default="default", help="model to prepare (default: default)")
    up.add_argument(
        "--base-port",
        type=int,
        default=18100,
        help="first port to try; busy ones are skipped (default 18100)",
    )
    up.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="nodes evict sessions idle this long (default 300)",
    )
    up.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per node (default: half the cores, 1 to 4)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long to wait for the nodes to become healthy (default 180)",
    )
    up.set_defaults(handler=_up)
    down = sub.add_parser("down", help="stop the local nodes (idempotent)")
    down.set_defaults(handler=_down)
    status = sub.add_parser("status", help="what runs where")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=_status)
    parser.set_defaults(help_parser=parser)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _pid_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("node-*.pid"))


def _read_pid_file(path: Path) -> dict[str, int] | None:
    try:
        raw = json.loads(path.read_text())
        return {"pid": int(raw["pid"]), "port": int(raw["port"]), "shard": int(raw["shard"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _running(run_dir: Path) -> list[dict[str, int]]:
    from node.server.launcher import is_planet_node, pid_alive  # lazy: aiohttp, numpy

    out = []
    for path in _pid_files(run_dir):
        entry = _read_pid_file(path)
        if entry and pid_alive(entry["pid"]) and is_planet_node(entry["pid"]):
            out.append(entry)
    return out


def _up(args: argparse.Namespace) -> int:
    # lazy: torch (model preparation), aiohttp and numpy (the node launcher)
    from node.model.prepare import prepare
    from node.server.launcher import NodeProcess, free_ports, start_node, stop_pid, wait_healthy

    if not 1 <= args.nodes <= 30:
        raise UsageError("--nodes must be between 1 and 30")
    if not 1024 <= args.base_port <= 65000:
        raise UsageError("--base-port must be between 1024 and 65000")
    run_dir = local_run_dir()
    if running := _running(run_dir):
        raise UsageError(
            f"{len(running)} local node(s) already run (ports "
            f"{', '.join(str(r['port']) for r in running)})",
            hint="stop them first with `planet local down`",
        )
    for stale in _pid_files(run_dir):
        stale.unlink()
    _err(f"preparing {args.model} in {args.nodes} shards (quant {args.quant})…")
    manifest_path = Path(prepare(model=args.model, parts=args.nodes, quant=args.quant)).resolve()
    manifest = Manifest.load(manifest_path)
    ports = free_ports(args.nodes, args.base_port, min(args.base_port + 200, 65536))
    # each node may forward (the chain protocol) only to this circuit's nodes
    hops = ",".join(f"http://127.0.0.1:{port}" for port in ports)
    extra = [
        "--idle-timeout", str(args.idle_timeout),
        "--threads", str(args.threads),
        "--next-hops", hops,
    ]  # fmt: skip
    nodes: list[NodeProcess] = []
    t0 = time.monotonic()
    try:
        for shard, port in zip(range(args.nodes), ports, strict=True):
            nodes.append(
                start_node(
                    manifest=manifest_path,
                    shard=shard,
                    port=port,
                    run_dir=run_dir,
                    extra_args=extra,
                )
            )
        _err(f"started {len(nodes)} node processes; waiting until each is healthy…")
        wait_healthy(
            nodes,
            timeout_s=args.timeout,
            on_ready=lambda n, s: _err(f"  shard {n.shard} ready on {n.url} ({s:.1f} s)"),
        )
    except BaseException:
        for node in nodes:
            stop_pid(node.pid, grace_s=3.0)
            node.pid_path.unlink(missing_ok=True)
        raise
    entries = {e.shard_id: e for e in manifest.shards}
    nodes_file = NodesFile(
        manifest=manifest_path,
        nodes=tuple(
            NodeRef(url=n.url, shard=n.shard, layers=tuple(entries[n.shard].layers)) for n in nodes
        ),
    )
    nodes_path = default_nodes_path()
    nodes_file.save(nodes_path)
    print(
        f"{len(nodes)} nodes up in {time.monotonic() - t0:.1f} s "
        f"({manifest.model_id}, quant {args.quant}):"
    )
    for node in nodes:
        start, end = entries[node.shard].layers
        print(
            f"  shard {node.shard}  layers {start:>2}-{end - 1:<2}  {node.url}  "
            f"pid {node.pid}  log {node.log_path}"
        )
    print(f"nodes file: {nodes_path}")
    print("links:      plaintext on 127.0.0.1 (local mode, --plaintext-links)")
    print('ask with:   planet ask "What is the capital of France?"')
    return 0


def _down(args: argparse.Namespace) -> int:
    from node.server.launcher import stop_pid  # lazy: aiohttp, numpy

    run_dir = local_run_dir()
    stopped = 0
    for path in _pid_files(run_dir):
        entry = _read_pid_file(path)
        if entry and stop_pid(entry["pid"]):
            stopped += 1
            _err(f"stopped shard {entry['shard']} (pid {entry['pid']}, port {entry['port']})")
        path.unlink(missing_ok=True)
    default_nodes_path().unlink(missing_ok=True)
    print(f"stopped {stopped} local node(s)" if stopped else "no local nodes were running")
    return 0


def _probe(port: int) -> dict[str, Any] | None:
    # lazy: urllib.request loads http.client and email, ~10 % of `planet`'s start-up
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=2.0) as answer:
            return dict(loads_bounded(answer.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _status(args: argparse.Namespace) -> int:
    run_dir = local_run_dir()
    rows = []
    for entry in _running(run_dir):
        info = _probe(entry["port"])
        rows.append(
            {
                **entry,
                "url": f"http://127.0.0.1:{entry['port']}",
                "healthy": info is not None,
                "layers": info.get("layers") if info else None,
                "quant": info.get("quant") if info else None,
                "sessions": info.get("sessions") if info else None,
                "cache_bytes": info.get("cache_bytes") if info else None,
            }
        )
    nodes_path = default_nodes_path()
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(run_dir),
                    "nodes_file": str(nodes_path) if nodes_path.exists() else None,
                    "nodes": rows,
                }
            )
        )
        return 0
    if not rows:
        print("no local nodes running (start them with `planet local up`)")
        return 0
    for row in rows:
        state = "healthy" if row["healthy"] else "NOT ANSWERING"
        layers = row["layers"] or ["?", "?"]
        print(
            f"shard {row['shard']}  {row['url']}  pid {row['pid']}  {state}  "
            f"layers {layers[0]}-{layers[1]}  quant {row['quant']}  "
            f"sessions {row['sessions']}"
        )
    print(f"nodes file: {nodes_path}")
    return 0
