"""`planet contracts deploy`: put the settlement contracts on a chain and write the deployment file.

Without `--rpc` it starts its own anvil (127.0.0.1:`--port`, chain 31337), deploys from anvil's
public dev account, writes the file and keeps anvil serving until Ctrl-C / SIGTERM (or stops it
at once with `--no-serve`). With `--rpc` it deploys to that chain with `--key` /
`PLANET_DEPLOYER_KEY` (anvil's dev key is used only on chain 31337). Progress goes to stderr;
stdout gets the addresses (or the whole summary as JSON with `--json`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from protocol.errors import UsageError

if TYPE_CHECKING:
    from deploy.anvil import Anvil

log = logging.getLogger(__name__)

EXAMPLES = """\
examples:
  planet contracts deploy                               own anvil on :8545, serve until Ctrl-C
  planet contracts deploy --no-serve --out /tmp/d.json  deploy, write the file, stop anvil
  planet contracts deploy --rpc http://127.0.0.1:8545 --committee 0xAb..:2 0xCd..:1
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "contracts",
        help="settlement contracts: deploy them to an EVM chain",
        description="Settlement contracts (Committee, Staking, FraudProofs, QueryEscrow, "
        "ModelRegistry).",
    )
    sub = group.add_subparsers(dest="contracts_command", metavar="SUBCOMMAND")
    deploy = sub.add_parser(
        "deploy",
        help="deploy every contract and write the deployment file",
        description="Deploy every settlement contract and write {chain_id, rpc_url, deployer, "
        "block, contracts: {Name: {address, abi}}}.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    deploy.add_argument("--rpc", help="EVM JSON-RPC URL (default: start an anvil)")
    deploy.add_argument("--port", type=int, default=8545, help="port of the anvil started here")
    deploy.add_argument(
        "--out", type=Path, default=Path("deployment.json"), help="deployment file to write"
    )
    deploy.add_argument(
        "--committee",
        nargs="+",
        default=[],
        metavar="ADDR:POWER",
        help="initial committee members (default: the deployer with power 1)",
    )
    deploy.add_argument("--key", help="deployer private key (default: $PLANET_DEPLOYER_KEY)")
    deploy.add_argument("--chain-id", type=int, help="refuse to deploy to any other chain id")
    deploy.add_argument(
        "--challenge-window", type=int, default=60, help="challenge window in seconds"
    )
    deploy.add_argument(
        "--refund-timeout", type=int, default=600, help="query refund timeout in seconds"
    )
    deploy.add_argument(
        "--no-serve", action="store_true", help="stop the anvil started here after deploying"
    )
    deploy.add_argument("--json", action="store_true", help="print the summary as JSON")
    deploy.set_defaults(handler=deploy_command)
    group.set_defaults(help_parser=group)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def deploy_command(args: argparse.Namespace) -> int:
    # lazy: the web3 stack; deploy.anvil loads urllib.request (~10 % of start-up)
    from eth_account import Account

    from deploy.anvil import ANVIL_DEV_ADDRESS, ANVIL_DEV_KEY, DEVNET_CHAIN_ID, start_anvil
    from deploy.evm import DeployConfig, deploy_all, parse_committee
    from node.chain.evm.rpc import connect, rpc_guard

    key = args.key or os.environ.get("PLANET_DEPLOYER_KEY")
    anvil = None
    if args.rpc is None:
        if args.chain_id is not None and args.chain_id != DEVNET_CHAIN_ID:
            raise UsageError(
                f"the anvil started here is chain {DEVNET_CHAIN_ID}, not {args.chain_id}"
            )
        _say(f"no --rpc given: starting anvil on 127.0.0.1:{args.port} (chain {DEVNET_CHAIN_ID})")
        anvil = start_anvil(args.port)
        rpc_url = anvil.rpc_url
        _say(f"anvil ready at {rpc_url} (pid {anvil.pid}, log {anvil.log_path})")
    else:
        rpc_url = args.rpc
    try:
        if key is None:
            chain_id = rpc_guard(lambda: connect(rpc_url).eth.chain_id, rpc_url)
            if chain_id != DEVNET_CHAIN_ID:
                raise UsageError(
                    f"chain {chain_id} needs a deployer key",
                    hint="pass --key or set PLANET_DEPLOYER_KEY",
                )
            _say(f"no --key: using anvil's public dev account {ANVIL_DEV_ADDRESS}")
            key = ANVIL_DEV_KEY
        deployer = Account.from_key(key).address
        committee = parse_committee(args.committee) or ((deployer, 1),)
        if not args.committee:
            _say(f"no --committee: the deployer {deployer} is the whole committee (power 1)")
        config = DeployConfig(
            committee=committee,
            challenge_window_s=args.challenge_window,
            refund_timeout_s=args.refund_timeout,
        )
        deployment = deploy_all(
            rpc_url, key, config, expected_chain_id=args.chain_id, progress=_say
        )
        path = deployment.save(args.out)
        _say(f"wrote {path}")
        summary = {
            "chain_id": deployment.chain_id,
            "rpc_url": deployment.rpc_url,
            "deployment_file": str(path),
            "contracts": {n: c.address for n, c in deployment.contracts.items()},
        }
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            for name, contract in deployment.contracts.items():
                print(f"{name} {contract.address}", flush=True)
        if anvil is not None and not args.no_serve:
            _serve(anvil)
    finally:
        if anvil is not None:
            anvil.stop()
    return 0


def _serve(anvil: Anvil) -> None:
    """Block until SIGINT/SIGTERM or until anvil dies."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    _say(f"serving the chain at {anvil.rpc_url}; Ctrl-C stops it")
    try:
        while not stop.is_set() and anvil.alive():
            stop.wait(0.2)
        if not stop.is_set():
            _say("anvil exited on its own")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _say("stopping anvil")
