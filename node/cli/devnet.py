"""`planet devnet up | status | down`: the whole network on this machine (`deploy.devnet`).

`up` starts anvil, deploys the contracts, registers the default model, starts a CometBFT
committee with its apps and stake watchers, stakes and joins compute nodes with the same
`planet stake` / `planet join` an operator types, and starts the gateway. Without --detach it
stays in the foreground until Ctrl-C, then tears everything down.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from node.config import default_home
from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet devnet up --detach                 4 validators, 3 compute nodes, gateway; returns
  planet devnet up --validators 1 --nodes 3 the smallest committee, stays in the foreground
  planet devnet up --detach --nodes 3 --cheat-node substitute-skip:2
                                            a 4th node that cheats (a test double): watch the
                                            verifiers make it unroutable and slash it
  planet devnet status --json
  planet devnet down
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "devnet",
        help="the whole network on this machine (anvil, committee, nodes, gateway)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="devnet_command", metavar="COMMAND")
    up = sub.add_parser(
        "up",
        help="start everything",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--validators", type=int, default=4, help="committee size (default 4)")
    up.add_argument("--nodes", type=int, default=3, help="compute nodes (default 3)")
    up.add_argument(
        "--quant",
        choices=("none", "int8", "int4"),
        default="int8",
        help="shard weights (default int8)",
    )
    up.add_argument("--detach", action="store_true", help="return once everything is up")
    up.add_argument("--no-gateway", action="store_true", help="do not start the gateway")
    up.add_argument(
        "--epoch-length",
        type=int,
        default=20,
        help="committee blocks per settlement epoch (default 20, about 10 s)",
    )
    up.add_argument(
        "--verifiers",
        type=int,
        default=None,
        metavar="N",
        help="run `planet verifier serve` for the first N validators (default: every validator, "
        "so their reports reach the 2/3 that reputation and verdicts need; each loads its own "
        "copy of the model; 0: none)",
    )
    up.add_argument(
        "--cheat-node",
        action="append",
        default=[],
        metavar="MODE",
        help="also join a node that cheats, for demos and tests of verification (repeatable): "
        "substitute-skip:N, noise:R:K, silent (serves, commits nothing), … — the node is the "
        "test double tests/doubles/cheating_node.py, joined by tests/doubles/cheating_join.py",
    )
    up.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    up.set_defaults(handler=_up)
    status = sub.add_parser("status", help="what runs, routable nodes, pool health")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    status.set_defaults(handler=_status)
    down = sub.add_parser("down", help="stop everything (idempotent)")
    down.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    down.set_defaults(handler=_down)
    parser.set_defaults(help_parser=parser)


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home).expanduser() if args.home else default_home()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    # lazy: the web3 stack, aiohttp (deploy.devnet starts and talks to everything)
    from deploy.devnet.down import down
    from deploy.devnet.plan import DevnetOptions
    from deploy.devnet.up import up

    if args.verifiers is not None and not 0 <= args.verifiers <= args.validators:
        raise UsageError(
            f"--verifiers must be 0 to --validators ({args.validators}), got {args.verifiers}",
            hint="one verifier per validator at most",
        )
    if args.cheat_node and args.no_gateway:
        raise UsageError(
            "--cheat-node needs the gateway", hint="the verifiers challenge through it"
        )
    options = DevnetOptions(
        home=_home(args),
        validators=args.validators,
        nodes=args.nodes,
        quant=args.quant,
        gateway=not args.no_gateway,
        epoch_length=args.epoch_length,
        verifiers=args.verifiers,
        cheat_nodes=tuple(args.cheat_node),
    )
    state = up(options, _say)
    _summary(state)
    if args.detach:
        print("stop it with: planet devnet down")
        return 0
    print("running in the foreground; Ctrl-C stops everything")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    _say("stopping the devnet…")
    down(options.home, _say)
    return 0


def _summary(state: dict[str, Any]) -> None:
    print(f"devnet up in {state.get('startup_s')} s — run directory {state['dir']}")
    print(f"  EVM RPC        {state['evm_rpc']} (chain {state['chain_id']})")
    for index, url in enumerate(state.get("committee_rpc", [])):
        print(f"  validator{index}     {url}")
    print(f"  gateway        {state.get('gateway_url') or '(not started)'}")
    print(f"  model          {state['model_hash']} ({state['shards']} shards)")
    print(f"  deployment     {state['deployment']}")
    for name, address in sorted(state.get("contracts", {}).items()):
        print(f"  {name:<14} {address}")
    print(f"  password file  {state['password_file']} (dev keystores)")
    if state.get("nodes_file"):
        print(f"  nodes file     {state['nodes_file']}")
    for account in state.get("accounts", []):
        where = f"home {account['home']}" if account.get("home") else account["keystore"]
        print(f"  {account['name']:<14} {account['address']}  {where}")


def _status(args: argparse.Namespace) -> int:
    from deploy.devnet.status import status  # lazy: the web3 stack, aiohttp

    report = status(_home(args))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    if report.get("status") == "absent":
        print("no devnet (start one with `planet devnet up`)")
        return 0
    print(
        f"devnet {report['status']} ({'running' if report['running'] else 'nothing runs'}) "
        f"— {report['dir']}"
    )
    print(f"  anvil {report.get('evm_rpc')}: {'up' if report['processes']['anvil'] else 'DOWN'}")
    for row in report.get("validators", []):
        alive = row.get("cometbft_alive") and row.get("app_alive")
        watcher = "watcher up" if row.get("watcher_alive") else "watcher DOWN"
        print(
            f"  validator{row['validator']} {row['rpc']}: "
            f"{'height ' + str(row.get('height')) if alive else 'DOWN'}, {watcher}"
        )
    for node in report.get("nodes", []):
        print(
            f"  node {node['key'][:12]}… shard {node['shards']} {node['endpoint']}: "
            f"{node['status']}, reputation {_reputation(node)}, routable {node['routable']}"
        )
    pool = report.get("pool")
    if pool:
        print(f"  pool {pool.get('status')}: routable per shard {pool.get('routable_per_shard')}")
    if report.get("gateway_url"):
        print(
            f"  gateway {report['gateway_url']}: "
            f"{'healthy' if report.get('gateway_healthy') else 'NOT ANSWERING'}"
        )
    return 0


def _reputation(node: dict[str, Any]) -> str:
    """R as a decimal, with the flags that make a node unroutable."""
    value = node.get("reputation")
    text = f"{value / 1_000_000:.3f}" if isinstance(value, int) else "?"
    flags = [name for name in ("untrusted", "uncommitted") if node.get(name)]
    return text + (f" ({', '.join(flags)})" if flags else "")


def _down(args: argparse.Namespace) -> int:
    from deploy.devnet.down import down  # lazy: the web3 stack, aiohttp

    stopped = down(_home(args), _say)
    print(f"devnet stopped ({len(stopped)} parts)" if stopped else "no devnet was running")
    return 0
