"""`planet committee init|up|down|status`: a local CometBFT committee network (one host).

The work is in `deploy.committee` (one module per step); this module parses flags, prints
progress on stderr and data on stdout (`status --json` for scripts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from deploy.committee.cometbft import DEFAULT_TIMEOUT_COMMIT
from deploy.committee.genesis import (
    DEFAULT_COMMITTEE_ADDRESS,
    DEFAULT_EPOCH_LENGTH,
    DEFAULT_EVM_CHAIN_ID,
)
from deploy.committee.network import (
    APPS,
    DEFAULT_BASE_PORT,
    DEFAULT_CHAIN_ID,
    Network,
    default_dir,
    load_network,
)
from deploy.committee.processes import running_processes, stop_network
from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet committee init --validators 4            generate a 4-validator network
  planet committee up                             start it (one app + one cometbft each)
  planet committee status                         heights, app hashes, peers per validator
  planet committee status --json                  the same for scripts
  planet committee up --only 2                    (re)start validator 2 only
  planet committee down                           stop every process of the network
  planet committee init --force --base-port 27100 --timeout-commit 500ms

Files: DIR/network.json (ports, node ids), DIR/logs/<process><i>.log, DIR/run/*.pid.
DIR defaults to $PLANET_HOME/committee (PLANET_HOME defaults to ~/.cache/planet).
"""


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=None, help="network directory (default: $PLANET_HOME/committee)"
    )


def _dir(args: argparse.Namespace) -> Path:
    return (args.dir or default_dir()).expanduser()


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _only(args: argparse.Namespace, network: Network) -> list[int] | None:
    if args.only is None:
        return None
    bad = [i for i in args.only if not 0 <= i < len(network.validators)]
    if bad:
        raise UsageError(
            f"--only: no validator {bad[0]} (the network has "
            f"{len(network.validators)}: 0..{len(network.validators) - 1})"
        )
    return list(args.only)


def cmd_init(args: argparse.Namespace) -> int:
    # lazy: eth-account (the operator keys)
    from deploy.committee.generate import InitOptions, init_network

    network = init_network(
        InitOptions(
            directory=_dir(args),
            validators=args.validators,
            base_port=args.base_port,
            timeout_commit=args.timeout_commit,
            epoch_length=args.epoch_length,
            chain_id=args.chain_id,
            evm_chain_id=args.evm_chain_id,
            committee_address=args.committee_address,
            app=args.app,
            force=args.force,
        )
    )
    print(
        f"initialised {len(network.validators)} validators in {network.dir} "
        f"(chain {network.chain_id}, app {network.app})",
        file=sys.stderr,
    )
    for v in network.validators:
        print(
            f"  validator{v.index}: rpc {v.rpc_url}  p2p {v.p2p_port}  app {v.abci_port}  "
            f"operator {v.operator_address}",
            file=sys.stderr,
        )
    print(
        "next: planet committee up" + (f" --dir {network.dir}" if args.dir else ""), file=sys.stderr
    )
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    # lazy: aiohttp (the RPC client that waits for blocks)
    from deploy.committee.start import start_network

    network = load_network(_dir(args))
    running = running_processes(network)
    print(
        f"starting committee network in {network.dir}"
        + (f" ({len(running)} processes already running)" if running else ""),
        file=sys.stderr,
    )
    started = start_network(
        network,
        only=_only(args, network),
        wait=not args.no_wait,
        timeout_s=args.timeout,
        progress=_progress,
    )
    print(
        f"up: started {len(started)} processes"
        + ("" if args.no_wait else ", blocks are being committed"),
        file=sys.stderr,
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    network = load_network(_dir(args))
    stopped = stop_network(network, only=_only(args, network))
    print(
        f"down: stopped {len(stopped)} processes" if stopped else "down: nothing was running",
        file=sys.stderr,
    )
    return 0


def _render(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'val':>3}  {'app':>5}  {'comet':>5}  {'height':>7}  {'peers':>5}  {'sync':>5}  app_hash"
    )
    lines = [header]
    for row in rows:
        alive = {True: "up", False: "down"}
        height = "-" if row["height"] is None else str(row["height"])
        peers = "-" if row["peers"] is None else str(row["peers"])
        sync = "-" if row["catching_up"] is None else ("catch" if row["catching_up"] else "ok")
        tail = row["app_hash"] if row["error"] is None else f"({row['error']})"
        lines.append(
            f"{row['validator']:>3}  {alive[row['app_alive']]:>5}  "
            f"{alive[row['cometbft_alive']]:>5}  {height:>7}  {peers:>5}  {sync:>5}  "
            f"{tail}"
        )
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    # lazy: aiohttp (the RPC client)
    from deploy.committee.status import network_status

    network = load_network(_dir(args))
    rows = asyncio.run(network_status(network))
    if args.json:
        print(
            json.dumps(
                {
                    "dir": network.dir,
                    "chain_id": network.chain_id,
                    "app": network.app,
                    "validators": rows,
                },
                indent=2,
            )
        )
    else:
        print(_render(rows))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "committee",
        help="run a local CometBFT committee network (init, up, down, status)",
        description="A committee chain on this host: N CometBFT validators, each with its own "
        "Planet ABCI app process, on loopback ports.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(help_parser=parser)
    sub = parser.add_subparsers(dest="committee_command", metavar="ACTION")

    init = sub.add_parser(
        "init",
        help="generate a network (keys, genesis, configs)",
        description="Generate N validators with `cometbft testnet`, give each its own ports, "
        "peers, fast blocks, vote extensions and an operator key.",
        epilog="example:\n  planet committee init --validators 4 --base-port 27000 "
        "--timeout-commit 300ms",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_dir(init)
    init.add_argument("--validators", type=int, default=4, help="number of validators (4)")
    init.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help="validator i uses base+10i.. base+10i+3 (default %(default)s)",
    )
    init.add_argument(
        "--timeout-commit",
        default=DEFAULT_TIMEOUT_COMMIT,
        help="CometBFT pause after each block (default %(default)s)",
    )
    init.add_argument(
        "--epoch-length",
        type=int,
        default=DEFAULT_EPOCH_LENGTH,
        help="blocks per committee epoch (default %(default)s)",
    )
    init.add_argument(
        "--chain-id",
        default=DEFAULT_CHAIN_ID,
        help="CometBFT chain id (default %(default)s)",
    )
    init.add_argument(
        "--evm-chain-id",
        type=int,
        default=DEFAULT_EVM_CHAIN_ID,
        help="EVM chain id of the settlement chain, for EIP-712 verdicts (default %(default)s)",
    )
    init.add_argument(
        "--committee-address",
        default=DEFAULT_COMMITTEE_ADDRESS,
        help="address of the settlement contract that checks committee signatures "
        "(default: zero until deployed)",
    )
    init.add_argument(
        "--app",
        choices=APPS,
        default="planet",
        help="planet: the Planet ABCI app; kvstore: CometBFT's built-in app "
        "(to measure CometBFT's own ceiling)",
    )
    init.add_argument(
        "--force", action="store_true", help="delete an existing network in DIR first"
    )
    init.set_defaults(handler=cmd_init)

    up = sub.add_parser(
        "up",
        help="start the network's processes (detached) and wait for blocks",
        description="Start every validator that is not running (its app, then its cometbft; "
        "when only one of the pair survived, both are restarted) and wait until all nodes "
        "commit blocks. Logs: DIR/logs/<process><i>.log.",
        epilog="examples:\n  planet committee up\n  planet committee up --only 1 --only 3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_dir(up)
    up.add_argument(
        "--only", type=int, action="append", metavar="I", help="start only validator I (repeatable)"
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for blocks (default %(default)s)",
    )
    up.add_argument("--no-wait", action="store_true", help="return once processes are spawned")
    up.set_defaults(handler=cmd_up)

    down = sub.add_parser("down", help="stop the network (SIGTERM, then SIGKILL); idempotent")
    _add_dir(down)
    down.add_argument(
        "--only", type=int, action="append", metavar="I", help="stop only validator I (repeatable)"
    )
    down.set_defaults(handler=cmd_down)

    status = sub.add_parser("status", help="per validator: processes, height, app hash, peers")
    _add_dir(status)
    status.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    status.set_defaults(handler=cmd_status)
