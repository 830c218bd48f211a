"""Operator commands: `planet stake | unstake | withdraw | join | leave | status`.

A node operator's whole story: lock stake in the Staking contract from an encrypted wallet,
join a model's pool with one shard (by default the shard the pool lacks most, read from the
committee: node/agent/placement.py; the shard is checked against the `ModelRegistry` on chain,
a compute node and its agent start in the background, the command waits until the committee
lists the node as routable), look at it, leave, unstake, withdraw.

Keys live in the operator home (`--home`, else $PLANET_HOME, else ~/.cache/planet):
`wallet.json` and `node_key.json`, created on first use, never printed. Password: --password-file,
$PLANET_PASSWORD, or a prompt. Chains: --evm-rpc / --committee-rpc / --chain-id /
--deployment, else PLANET_EVM_RPC / PLANET_COMMITTEE_RPC / PLANET_CHAIN_ID / PLANET_DEPLOYMENT,
else `<home>/config.toml`, else the running devnet (`planet devnet up`), else defaults
(node/config.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import json
import socket
import sys
import time
import urllib.parse
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.join_price import going_price, join_price
from node.cli.model import add_fetch_sources, fetch_with_progress
from node.config import resolve_config
from node.model.manifest import Manifest
from protocol.errors import ConfigError, PlanetError, UnavailableError, UsageError
from protocol.eth import parse_eth as parse_eth_amount

if TYPE_CHECKING:
    from node.agent.placement import Placement

ETHER = 10**18
ROLES = {"compute": 1, "verifier": 2, "relay": 3}  # the Staking contract's Role
ROLE_NAMES = {0: "none", 1: "compute", 2: "verifier", 3: "relay"}
STAKE_STATUS = {0: "none", 1: "active", 2: "unbonding"}
GAS_RESERVE_WEI = 10**15  # kept aside for gas when checking a stake against the balance

EXAMPLES = {
    "stake": """\
examples:
  planet stake --role compute --amount 1.5       lock 1.5 ETH as a compute node
  PLANET_PASSWORD_FILE=~/.pw planet stake --role verifier --amount 0.5 --evm-rpc http://host:8545
  planet stake --role relay --amount 0.1         an overlay relay's stake (`planet relay serve`)
on a running devnet (`planet devnet up`) every operator command finds its chains by itself;
fund a new wallet with `planet devnet fund ADDRESS 10`. With `devnet up --hosts`, run the
commands inside a host: planet devnet exec operator0 -- planet stake --role compute --amount 1
""",
    "join": """\
examples:
  planet join --model smollm2-135m-3p-int8                    the shard the pool lacks most
  planet join --model smollm2-135m-3p-int8 --shard 1          a shard of your choice
  planet join --model ~/.cache/planet/models/smollm2-135m-3p-int8 --port 18200 --json
  planet join --model smollm2-135m-3p-int8 --host 203.0.113.7    bind and register an address
auto placement (no --shard, or --shard auto): a question passes every shard in turn, so the
pool answers no faster than its weakest shard. join asks the committee which nodes serve each
shard of the model and takes the weakest: a shard nobody serves first, then the one with the
fewest routable nodes (ties: fewer nodes still joining, then the lowest index), and prints
why, e.g. "shard 2 of 3: it has 0 routable nodes (shards 0 and 1 have 1 each)". A node key
already registered keeps its shard. --shards N takes the N consecutive shards that are weakest
together and serves them as one hop (a span, one process, one endpoint), priced and paid per
shard (each shard at the price, each redeemed on its shard); a span is not rebalanced.
--shards auto sizes the span: the longest run of consecutive shards with no node (routable or
joining) whose weights (file size x its quantization's factor) and the node's KV caps fit in
this machine's available memory less 1 GiB (a fresh pool's first node with room for the whole
model serves all of it); one shard, the weakest, when every shard has a node (a span helps
there only if this node outpaces the replicas by the span's length, unknown before it is
measured). Without --shards a node takes one shard.
rebalancing: a node placed automatically keeps watching the pool and moves to another shard
when that gains (a shard with nobody, one below the chain's replica floor while its own keeps
the floor, or a clear raise of the weakest shard), at most once per 10 minutes, after a delay
drawn from its node key; when the new shard's file is not on disk it first fetches it, as
join does, from the nodes serving that shard (else from --origin, kept for moves; a shard with
neither is not moved to), the old shard still served; it loads the new shard in a second
process, re-registers for it (`move_shards`), lets live sessions on the old shard finish (60 s
at most; clients fail over after that) and stops the old process; credits earned on the old
shard stay redeemable. Its agent log says each decision: "rebalance: stayed
on shard 0: …" or "rebalance: moving shard 0 -> 2: …". A node joined with --shard K stays
there (the operator's choice) unless --rebalance says it may move; --no-rebalance keeps an
auto-placed node where it landed. A node that does not rebalance registers so, and other nodes
never count on it to follow a swap.
the node binds and registers --host (default: the address this machine reaches the committee
from: 127.0.0.1 on the loopback devnet, the host's own address inside `devnet exec HOST`)
""",
    "status": """\
examples:
  planet status
  planet status --json
""",
}


class StakeBelowMinimum(UsageError):
    code = "stake_below_minimum"


class WrongChain(ConfigError):
    code = "wrong_chain"


def parse_eth(text: str) -> int:
    """'1.5' → 1_500_000_000_000_000_000 wei (at most 18 decimals, > 0, the Staking contract's
    uint128 at most)."""
    return parse_eth_amount(text, what="--amount", hint="ETH units, e.g. 1.5")


def parse_shard(text: str) -> int | None:
    """--shard: a shard index, or `auto` (None: the committee's view decides)."""
    if text.strip().lower() == "auto":
        return None
    try:
        shard = int(text)
    except ValueError:
        shard = -1
    if not 0 <= shard < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard index (0-65535) or auto")
    return shard


def parse_span_size(text: str) -> int | None:
    """--shards: how many consecutive shards to serve as one hop (1-256), or `auto` (None)."""
    if text.strip().lower() == "auto":
        return None
    if not text.strip().isascii() or not text.strip().isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count of shards (1-256) or auto; a range is `planet node serve "
            "--shards A-B`"
        )
    return int(text)


def format_eth(wei: int) -> str:
    text = f"{Decimal(wei) / ETHER:f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + " ETH"


# -- argument plumbing ---------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "chains and keys (flags > env > <home>/config.toml > the running devnet: $PLANET_DEVNET, "
        "else $PLANET_HOME/devnet)"
    )
    group.add_argument("--home", type=Path, help="operator home (default $PLANET_HOME)")
    group.add_argument("--evm-rpc", help="EVM JSON-RPC URL (PLANET_EVM_RPC)")
    group.add_argument("--committee-rpc", help="a validator's CometBFT RPC (PLANET_COMMITTEE_RPC)")
    group.add_argument("--chain-id", help="expected EVM chain id (PLANET_CHAIN_ID, 31337)")
    group.add_argument("--deployment", type=Path, help="deployment file (PLANET_DEPLOYMENT)")
    group.add_argument("--password-file", type=Path, help="keystore password (else env/prompt)")


def register(subparsers: argparse._SubParsersAction) -> None:
    def command(name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=EXAMPLES.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(handler=handler)
        return parser

    stake = command("stake", "lock stake in the Staking contract", _stake)
    stake.add_argument("--role", choices=sorted(ROLES), required=True)
    stake.add_argument("--amount", required=True, help="ETH, e.g. 1.5 (adds to a current stake)")
    _common(stake)
    unstake = command("unstake", "ask for the stake back (it unbonds, then `withdraw`)", _unstake)
    _common(unstake)
    withdraw = command("withdraw", "withdraw a stake whose unbonding delay has passed", _withdraw)
    _common(withdraw)
    join = command("join", "serve one shard of a model on the network", _join)
    join.add_argument("--model", required=True, help="manifest path, model dir, name or hash")
    join.add_argument(
        "--shard",
        type=parse_shard,
        default=None,
        metavar="K|auto",
        help="shard index to serve, or auto (the default): the weakest shard of the pool, "
        "as the committee lists it (see below)",
    )
    join.add_argument(
        "--shards",
        type=parse_span_size,
        default=0,
        metavar="N|auto",
        help="serve N consecutive shards as one hop (a span: fewer hops for a fast machine), "
        "the N the pool lacks most together; auto: the longest run of shards nobody serves "
        "that this machine's memory holds, else one shard (said why). Not with --shard",
    )
    join.add_argument(
        "--rebalance",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the node move to another shard when the pool gains from it (default: on "
        "with auto placement, off with --shard K; see rebalancing below)",
    )
    join.add_argument("--port", type=int, default=0, help="node port (default: a free one)")
    join.add_argument(
        "--host",
        metavar="ADDRESS",
        help="IP address the node binds and registers on the committee chain (default: the "
        "address this machine reaches the committee from)",
    )
    join.add_argument(
        "--next-hop-range",
        metavar="CIDR[,CIDR]",
        help="at a private address: the private next hops the node may dial (config "
        "next_hop_range, PLANET_NEXT_HOP_RANGE; a devnet gives its own; default: any private)",
    )
    join.add_argument(
        "--rendezvous",
        default="check",
        metavar="check|auto|off|RELAY_URL",
        help="a node behind NAT (docs/network.md): check (default) asks a listed relay to dial "
        "the endpoint back and, when it cannot, has two relays front the node (clients dial "
        "the second when the first is down); auto: relays front it without asking; RELAY_URL: "
        "that listed relay only; off: register the endpoint unchecked",
    )
    join.add_argument(
        "--behind-nat",
        action="store_true",
        help="the same as --rendezvous auto: this machine accepts no inbound connection",
    )
    join.add_argument("--capacity", type=int, default=16, help="max sessions (default 16)")
    join.add_argument(
        "--credit-positions",
        type=int,
        default=None,
        metavar="N",
        help="the node's price: one bearer credit buys N positions (prompt and generated "
        "tokens, on this shard). Clients pay credits ahead as they ask and the node computes "
        "only what is paid; the agent registers N on the committee chain, where clients read "
        "it, and redeems the credits there: K credits need K × N committed served "
        "positions, and redeemed credits are a node's only pay (docs/credits.md). A changed "
        "price counts from the next epoch. Default: the pool's going price (the median "
        "registered for the model, else 64); 0 is free",
    )
    join.add_argument(
        "--free",
        action="store_true",
        help="serve without charging (price 0): nobody pays this node",
    )
    join.add_argument(
        "--memory-budget-mb",
        type=int,
        default=None,
        metavar="MIB",
        help="run the compute node as a multi-model host (`planet node host`) with this memory "
        "budget (shard weights + KV caps of all its seats), so other homes can add their "
        "models to it with --into (docs/network.md, multi-model nodes)",
    )
    join.add_argument(
        "--into",
        type=Path,
        default=None,
        metavar="HOME",
        help="serve this home's node (its own key, stake, price and credits) as one more seat "
        "of the multi-model host that HOME runs (joined with --memory-budget-mb); refused by "
        "name when it does not fit HOME's memory budget",
    )
    join.add_argument("--timeout", type=float, default=180.0, help="seconds to wait (180)")
    join.add_argument("--no-wait", action="store_true", help="return once processes started")
    join.add_argument(
        "--json", action="store_true", help="print one JSON object (with the placement)"
    )
    add_fetch_sources(join)  # when the shard file is not on disk: nodes serving it, then origin
    _common(join)
    leave = command(
        "leave",
        "leave the network: the agent sends `leave`; the node answers the spot checks of its "
        "last work, then stops",
        _leave,
    )
    leave.add_argument(
        "--now",
        action="store_true",
        help="stop the node at once instead: a verifier that then asks for the ticket of one of "
        "its last blocks gets no answer, and a timeout verdict slashes 5 %% of the stake",
    )
    _common(leave)
    status = command("status", "stake, lifecycle, reputation, routability, pool health", _status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    _common(status)


def _config(args: argparse.Namespace) -> Any:
    return resolve_config(
        {
            "home": args.home,
            "evm_rpc": args.evm_rpc,
            "committee_rpc": args.committee_rpc,
            "chain_id": args.chain_id,
            "deployment": args.deployment.resolve() if args.deployment else None,
            "password_file": args.password_file.resolve() if args.password_file else None,
            "next_hop_range": getattr(args, "next_hop_range", None),
        }
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _password(config: Any) -> str:
    from node.keys import PasswordSource  # lazy: eth-account, nacl

    return PasswordSource(file=config.password_file).read()


def _wallet(config: Any, password: str) -> Any:
    from node.keys import load_or_create_wallet  # lazy: eth-account, nacl

    existed = config.wallet_path.exists()
    wallet = load_or_create_wallet(config.wallet_path, password)
    if not existed:
        _say(f"created wallet {wallet.address} in {config.wallet_path}")
    return wallet


def _check_chain(config: Any) -> Any:
    """A web3 connection to the configured EVM RPC, on the expected chain."""
    from node.chain.evm.rpc import connect  # lazy: the web3 stack

    try:
        w3 = connect(config.evm_rpc, timeout_s=5.0)
    except UnavailableError as error:
        raise UnavailableError(
            f"EVM RPC {config.evm_rpc} is unreachable",
            hint=_unreachable_hint(config, "--evm-rpc / set PLANET_EVM_RPC"),
        ) from error
    chain_id = int(w3.eth.chain_id)
    if chain_id != config.chain_id:
        raise WrongChain(
            f"{config.evm_rpc} is chain {chain_id}, but this operator expects chain "
            f"{config.chain_id}",
            hint="point --evm-rpc at the right chain, or set --chain-id / PLANET_CHAIN_ID",
        )
    return w3


def _unreachable_hint(config: Any, flags: str) -> str:
    if config.devnet is not None:
        return (
            f"is the devnet in {config.devnet} still up? `planet devnet status`; with "
            "`devnet up --hosts` run the command in a host: planet devnet exec HOST -- planet …"
        )
    return f"start a devnet (`planet devnet up`: commands find it), or pass {flags}"


def _chain(config: Any, password: str) -> Any:
    # lazy: the web3 stack
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment

    _check_chain(config)
    deployment = Deployment.load(config.deployment_path)
    wallet = _wallet(config, password)
    return PlanetChain(deployment, wallet.key, rpc_url=config.evm_rpc)


def _funds_check(chain: Any, value: int) -> None:
    from node.chain.evm.errors import InsufficientFunds  # lazy: the web3 stack

    balance = chain.balance()
    if balance < value + GAS_RESERVE_WEI:
        raise InsufficientFunds(
            f"{chain.address} has {format_eth(balance)}, needs {format_eth(value)} plus gas",
            hint=f"send ETH to {chain.address} (on a devnet: planet devnet fund {chain.address} "
            "10)",
        )


# -- stake / unstake / withdraw -------------------------------------------------------------------


def _stake(args: argparse.Namespace) -> int:
    config = _config(args)
    amount = parse_eth(args.amount)
    role = ROLES[args.role]
    chain = _chain(config, _password(config))
    current = chain.staking.stake_of()
    minimum = chain.staking.minimum_stake(role)
    if current + amount < minimum:
        raise StakeBelowMinimum(
            f"a {args.role} stake must be at least {format_eth(minimum)}; "
            f"{format_eth(current)} staked + {format_eth(amount)} is less",
            hint=f"stake at least {format_eth(minimum - current)}: "
            f"planet stake --role {args.role} --amount {format_eth(minimum - current)[:-4]}",
        )
    if chain.staking.status_of() == 2:
        raise UsageError(
            f"{chain.address}'s stake is unbonding: it cannot be topped up",
            hint="`planet withdraw` once the delay has passed, then stake again",
        )
    current_role = chain.staking.role_of()
    if current and current_role != role:
        raise UsageError(
            f"{chain.address} is staked as {ROLE_NAMES.get(current_role)}; a stake has one role",
            hint="unstake and withdraw first to change the role",
        )
    _funds_check(chain, amount)
    _say(f"staking {format_eth(amount)} as {args.role} from {chain.address}…")
    result = chain.staking.stake(role, amount)
    total = result.event("Staked")["total"]
    print(
        f"staked {format_eth(amount)} as {args.role}; total {format_eth(total)} "
        f"(tx {result.tx_hash})"
    )
    return 0


def _unstake(args: argparse.Namespace) -> int:
    config = _config(args)
    chain = _chain(config, _password(config))
    if chain.staking.stake_of() == 0:
        raise UsageError(f"{chain.address} has no stake", hint="nothing to unstake")
    result = chain.staking.request_unstake()
    event = result.event("UnstakeRequested")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(event["withdrawableAt"]))
    print(
        f"unbonding {format_eth(event['amount'])}; withdraw after {when} "
        f"with `planet withdraw` (tx {result.tx_hash})"
    )
    return 0


def _withdraw(args: argparse.Namespace) -> int:
    config = _config(args)
    chain = _chain(config, _password(config))
    if chain.staking.status_of() != 2:
        raise UsageError(
            f"{chain.address} has no unbonding stake", hint="run `planet unstake` first"
        )
    result = chain.staking.withdraw()
    print(f"withdrew {format_eth(result.event('Withdrawn')['amount'])} (tx {result.tx_hash})")
    return 0


# -- join / leave ---------------------------------------------------------------------------------


def _join(args: argparse.Namespace) -> int:
    # lazy: the node agent and launcher (aiohttp, numpy, eth-account)
    from node.agent.launch import (
        agent_alive,
        check_registered,
        check_shard,
        model_id_bytes,
        read_joined,
        resolve_manifest,
        start_node_and_agent,
    )
    from node.keys import load_or_create_node_key
    from node.model.manifest import CONFIG_FILE
    from node.model.source import models_dir  # lazy: importlib.metadata, ~10 % of start-up
    from node.server.launcher import random_free_port

    config = _config(args)
    if not 1 <= args.capacity <= 1_000_000:
        raise UsageError("--capacity must be 1..1000000")
    join_price(args.credit_positions, args.free, lambda: 0)  # the flags, before any work
    given_host = _parse_host(args.host) if args.host is not None else None
    into = _host_seats(args, config.run_dir)
    joined = read_joined(config.run_dir)
    if joined is not None and agent_alive(joined):
        raise UsageError(
            f"this home already serves shard {joined.shard} at {joined.endpoint}",
            hint="`planet leave` first, or use another --home",
        )
    manifest_file = resolve_manifest(args.model, models_dir())
    model_hash = Manifest.load(manifest_file).model_hash
    if not (manifest_file.parent / CONFIG_FILE).is_file():  # fetched: the shard, not this
        raise UsageError(
            f"{manifest_file.parent} has the manifest but no {CONFIG_FILE}: the node needs both",
            hint=f"copy the model's {CONFIG_FILE} beside the manifest (its hash is in it); "
            "the shard file itself is fetched from the nodes serving it",
        )
    password = _password(config)
    chain = _chain(config, password)
    minimum = chain.staking.minimum_stake(ROLES["compute"])
    staked, status = chain.staking.stake_of(), chain.staking.status_of()
    if staked < minimum or status != 1:
        raise StakeBelowMinimum(
            f"{chain.address} has {format_eth(staked)} staked "
            f"({STAKE_STATUS.get(status, status)}); a compute node needs {format_eth(minimum)}",
            hint=f"planet stake --role compute --amount {format_eth(minimum)[:-4]}",
        )
    registered = chain.registry.shard_hashes_of(model_id_bytes(model_hash))
    node_key = load_or_create_node_key(config.node_key_path, password)
    key_hex = node_key.verify_key.encode().hex()
    placement = None
    hosted = args.memory_budget_mb is not None or into is not None
    size = _span_size(args, hosted)
    if args.shard is None and size is None and not hosted:
        placement = place_auto(config, model_hash, len(registered), key_hex, manifest_file)
        _say(f"placement (--shards auto): {placement.reason}; {placement.basis}")
        if placement.last is not None and args.rebalance:
            _say("  a span is not rebalanced (--rebalance applies to one shard)")
    elif args.shard is None:
        placement = place(config, model_hash, len(registered), key_hex, size=size or 1)
        _say(f"placement: {placement.reason}; {placement.basis}")
        if size is None:
            _say("  --shards auto: one shard, a seat of a multi-model host serves one shard")
    shard: int = placement.shard if placement is not None else args.shard
    last = placement.last if placement is not None else None
    for each in range(shard, (shard if last is None else last) + 1):
        _say(f"checking shard {each} of {model_hash} against the ModelRegistry…")
        entry = check_registered(manifest_file, each, registered).shard(each)
        if not (manifest_file.parent / entry.file).is_file() or args.peer:
            serving = _serving_peers(config, model_hash, each)
            peers = [*args.peer, *serving]
            fetch_with_progress(manifest_file, each, peers, args.origin, keys=serving)
        manifest = check_shard(manifest_file, each, registered)
    view = _committee_view(config, key_hex)
    if view is not None and view.get("status") == "LEFT":
        raise UsageError(
            "this node key has LEFT the network (final on the committee chain)",
            hint="join again from a new home (new wallet and node key)",
        )
    host = given_host or _reachable_address(config.committee_rpc)
    previous = read_joined(config.run_dir)
    if not args.port and previous is not None and previous.shard == shard:
        port = previous.port  # the endpoint on chain names this port
    else:
        port = args.port or _devnet_host_port(host) or random_free_port(18100, 18999)
    price = join_price(
        args.credit_positions, args.free, lambda: going_price(config.committee_rpc, model_hash)
    )
    if args.credit_positions is None and not args.free:
        _say(f"price: a credit per {price} positions (the pool's going price; --credit-positions)")
    reach = _reach(args, config, node_key, host, port)
    _say(reach.line)
    _say(f"starting the compute node at {host}:{port} and its agent…")
    joined = start_node_and_agent(
        home=config.home,
        manifest_file=manifest_file,
        manifest=manifest,
        shard=shard,
        port=port,
        capacity=args.capacity,
        committee_rpcs=[config.committee_rpc],
        password=password,
        node_key=key_hex,
        host=host,
        private_range=config.next_hop_range,
        credit_positions=price,
        rebalance=not hosted
        and last is None
        and (args.rebalance if args.rebalance is not None else placement is not None),
        last=last,
        origin=args.origin,
        memory_budget_mb=args.memory_budget_mb,
        into=into,
        rendezvous=reach.relays,
    )
    if price == 0:
        _say(
            "  free node: it serves without charging, and nothing else pays it (credits are a "
            "node's only pay); join without --free / --credit-positions 0 to be paid the "
            "pool's going price"
        )
    _say(f"  node pid {joined.node_pid} (log {joined.node_log})")
    _say(f"  agent pid {joined.agent_pid} (log {joined.agent_log})")
    if not args.no_wait:
        asyncio.run(_wait_routable(config, joined, args.timeout))
    if args.json:
        print(
            json.dumps(
                {
                    "model": model_hash,
                    "shard": shard,
                    "shards": list(range(shard, (shard if last is None else last) + 1)),
                    "endpoint": joined.endpoint,
                    "node_key": key_hex,
                    "routable": not args.no_wait,
                    "placement": placement.to_json() if placement is not None else None,
                },
                indent=1,
            )
        )
    elif args.no_wait:
        print(f"started shard {shard} at {joined.endpoint}; node key {key_hex}")
    else:
        print(f"routable: shard {shard} of {model_hash} at {joined.endpoint}; node key {key_hex}")
    return 0


def _reach(args: argparse.Namespace, config: Any, node_key: Any, host: str, port: int) -> Any:
    """How the node will be reached (node/cli/nat.py): its own endpoint, or a relay's port."""
    from node.cli.nat import decide, read_relays  # lazy: aiohttp

    mode = "auto" if args.behind_nat else args.rendezvous
    if args.behind_nat and args.rendezvous not in ("check", "auto"):
        raise UsageError("--behind-nat is --rendezvous auto: give one of them")
    relays = [] if mode == "off" else asyncio.run(read_relays(config.committee_rpc))
    return asyncio.run(decide(mode, relays, node_key, host, port))


def _host_seats(args: argparse.Namespace, run_dir: Path) -> Path | None:
    """`--into HOME`: the seats file of the multi-model host HOME runs (None without --into);
    UsageError when the flags do not go together or HOME runs no host."""
    from node.server.launcher import pid_alive  # lazy: the node's runtime
    from node.server.seats import host_pid

    budget, into = args.memory_budget_mb, args.into
    if budget is not None and not 1 <= budget <= 16 * 1024 * 1024:
        raise UsageError("--memory-budget-mb must be 1..16777216 (MiB)")
    if budget is not None and into is not None:
        raise UsageError(
            "--memory-budget-mb starts a host, --into joins another home's: pick one",
            hint="the host's budget is set by the home that started it",
        )
    if (budget is not None or into is not None) and args.rebalance:
        raise UsageError(
            "a seat of a multi-model host does not rebalance (a move starts a new process)",
            hint="drop --rebalance, or join without --memory-budget-mb/--into",
        )
    if into is None:
        return None
    seats = into.expanduser() / "run" / "seats.json"
    pid = host_pid(seats)
    if pid is None or not pid_alive(pid):
        raise UsageError(
            f"{into} runs no multi-model host ({seats} names no running node)",
            hint=f"join from {into} with --memory-budget-mb MIB first",
        )
    if seats.parent.resolve() == run_dir.resolve():
        raise UsageError("--into names this home itself", hint="join from another --home")
    return seats


def _span_size(args: argparse.Namespace, hosted: bool) -> int | None:
    """--shards: the span's size (1: one shard; None: auto, sized from memory and the pool,
    one shard in a multi-model host), checked against the
    flags it does not go with."""
    size: int | None = args.shards
    if size == 0:  # not given
        return 1
    if args.shard is not None:
        raise UsageError(
            "--shard K names one shard, --shards N a count: give one of them",
            hint="--shards N places N consecutive shards where the pool lacks them",
        )
    if size is not None and size > 1:
        if hosted:
            raise UsageError(
                "a seat of a multi-model host serves one shard",
                hint="join a span without --memory-budget-mb/--into",
            )
        if args.rebalance:
            raise UsageError(
                "a span is not rebalanced (a move takes one shard to another)",
                hint="drop --rebalance, or join one shard",
            )
    return size


def place(config: Any, model_hash: str, shard_count: int, key: str, *, size: int = 1) -> Placement:
    """--shard auto: the shard of the model's pool (`shard_count` shards in the ModelRegistry)
    that raises its throughput most, from the committee's list of the model's compute nodes
    (node/agent/placement.py); `key`, this home's node key, keeps the shard it is registered
    for. Refuses an unregistered model and a malformed answer by name."""
    from node.agent.placement import choose_span

    nodes, floor = _read_pool(config, model_hash, shard_count)
    return choose_span(model_hash, shard_count, nodes, size, own_key=key, floor=floor)


def place_auto(
    config: Any, model_hash: str, shard_count: int, key: str, manifest_file: Path
) -> Placement:
    """--shards auto: the span this machine's memory holds that the pool lacks most
    (node/agent/placement.py `choose_auto_span`): each shard's resident weights from the
    manifest (size × its quantization's factor), the node's default KV caps, the machine's
    available memory less a headroom (node/agent/machine_memory.py)."""
    from node.agent.machine_memory import HEADROOM_BYTES, available_bytes
    from node.agent.placement import MemoryFit, choose_auto_span
    from node.server.config import ServerConfig
    from node.server.seats import resident_weight_bytes

    defaults = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    fit = MemoryFit(
        available=available_bytes(),
        headroom=HEADROOM_BYTES,
        shard_bytes=tuple(
            resident_weight_bytes(s.size, s.quant) for s in Manifest.load(manifest_file).shards
        ),
        kv_bytes=int(defaults["max_cache_bytes"]) + int(defaults["prefix_cache_bytes"]),
    )
    nodes, floor = _read_pool(config, model_hash, shard_count)
    return choose_auto_span(model_hash, shard_count, nodes, fit, own_key=key, floor=floor)


def _read_pool(config: Any, model_hash: str, shard_count: int) -> tuple[Any, int]:
    """The model's compute nodes and the chain's replica floor, from the committee (nothing to
    read for an unregistered model: the choice refuses it by name)."""
    from node.agent.placement import (
        DEFAULT_REPLICA_FLOOR,
        MalformedPoolAnswer,
        PoolNode,
        read_floor,
        read_pool,
    )
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    async def read() -> tuple[tuple[PoolNode, ...], int]:
        link = CommitteeLink([config.committee_rpc])
        try:
            return await read_pool(link, model_hash), await read_floor(link)
        finally:
            await link.close()

    if not shard_count:
        return (), DEFAULT_REPLICA_FLOOR
    try:
        return asyncio.run(read())
    except MalformedPoolAnswer:
        raise
    except PlanetError as error:
        raise UnavailableError(
            f"cannot read the pool of {model_hash} from the committee at "
            f"{config.committee_rpc} to pick a shard: {error.message}",
            hint=_unreachable_hint(config, "--committee-rpc / set PLANET_COMMITTEE_RPC")
            + "; or pick the shard yourself: --shard K",
        ) from None


def _parse_host(given: str) -> str:
    """--host: the IP address the node binds and registers."""
    try:
        return str(ipaddress.ip_address(given.strip().strip("[]")))
    except ValueError:
        raise UsageError(
            f"--host {given!r} is not an IP address",
            hint="the address others reach this node at, e.g. 203.0.113.7",
        ) from None


def _reachable_address(committee_rpc: str) -> str:
    """The address the node binds and registers without --host: the source address this
    machine uses to reach the committee RPC (a UDP `connect` sends nothing; it only asks the
    routing table), i.e. the address the network reaches it at."""
    url = urllib.parse.urlsplit(committee_rpc)
    try:
        family, _, _, _, address = socket.getaddrinfo(
            url.hostname, url.port or 80, type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError as error:
        raise UnavailableError(
            f"cannot tell this machine's address towards the committee {committee_rpc}: {error}",
            hint="pass the address others reach this node at: --host ADDRESS",
        ) from None


async def _send_leave(config: Any, key: str) -> dict[str, Any] | None:
    # lazy: aiohttp, eth-account, nacl
    from node.chain.committee_link import CommitteeLink
    from node.keys import load_node_key
    from protocol.committee.registry import Leave

    node_key = load_node_key(config.node_key_path, _password(config))
    if node_key.verify_key.encode().hex() != key:
        raise UsageError(f"{config.node_key_path} is not the key of the joined node {key[:16]}…")
    link = CommitteeLink([config.committee_rpc], node_key)
    try:
        submitted = await link.submit(Leave())
        code, text = await link.committed_code(submitted.hash, timeout_s=20)
        if code not in (0, 15):
            raise PlanetError(f"the committee refused `leave` (code {code}: {text})")
        return await link.node(key)
    finally:
        await link.close()


def _committee_view(config: Any, key: str) -> dict[str, Any] | None:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    async def read() -> dict[str, Any] | None:
        link = CommitteeLink([config.committee_rpc])
        try:
            return await link.node(key)
        finally:
            await link.close()

    return asyncio.run(read())


def _serving_peers(config: Any, model_hash: str, shard: int) -> dict[str, str]:
    """{endpoint: node key} of the nodes the committee lists as serving `shard` of the model
    (each dialled pinned to its key: nodes serve TLS bound to it)."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    async def read() -> list[dict[str, Any]]:
        link = CommitteeLink([config.committee_rpc])
        try:
            return await link.nodes(model=model_hash, shard=shard, status="serving")
        finally:
            await link.close()

    try:
        nodes = asyncio.run(read())
    except PlanetError as error:
        _say(f"could not list the nodes serving shard {shard}: {error.message}")
        return {}
    return {
        node["endpoint"]: node["key"]
        for node in nodes
        if isinstance(node.get("endpoint"), str)
        and node["endpoint"]
        and isinstance(node.get("key"), str)
    }


async def _wait_routable(config: Any, joined: Any, timeout_s: float) -> None:
    # lazy: aiohttp, numpy
    from node.agent.launch import agent_exited
    from node.chain.committee_link import CommitteeLink
    from node.server.launcher import pid_alive

    link = CommitteeLink([config.committee_rpc])
    progress = JoinProgress(time.monotonic())
    try:
        while True:
            for what, pid, log_path in (
                ("compute node", joined.node_pid, joined.node_log),
                ("agent", joined.agent_pid, joined.agent_log),
            ):
                if agent_exited(pid) if what == "agent" else not pid_alive(pid):
                    tail = Path(log_path).read_text(errors="replace").splitlines()[-5:]
                    raise UnavailableError(
                        f"the {what} (pid {pid}) exited; last lines of {log_path}:\n"
                        + "\n".join(tail),
                        hint=f"read {log_path}",
                    )
            try:
                view = await link.node(joined.node_key)
            except PlanetError:
                view = None
            line = _progress_line(view)
            said = progress.say(line, time.monotonic())
            if said is not None:
                _say(said)
            if view is not None and view.get("routable"):
                return
            if time.monotonic() - progress.started > timeout_s:
                raise UnavailableError(
                    f"the node is not routable after {timeout_s:.0f} s ({line})",
                    hint="routable needs SERVING, stake attested by 2/3 of the validators' stake "
                    f"watchers, and reputation ≥ 0.4; read {joined.agent_log}",
                )
            await asyncio.sleep(0.5)
    finally:
        await link.close()


STILL_EVERY_S = 15.0


class JoinProgress:
    """What `join` prints while it waits for its node: each new state once, and the same state
    again every STILL_EVERY_S seconds. Loading a shard takes a minute on a busy machine (3 nodes
    and a gateway starting at once on 2 cores: ~60 s), and a minute of silence looks like a hang."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.last = ""
        self.said_at = started

    def say(self, state: str, now: float) -> str | None:
        """The line to print at `now` for `state`, or None to stay quiet."""
        elapsed = f"  [{now - self.started:5.1f} s]"
        if state != self.last:
            self.last, self.said_at = state, now
            return f"{elapsed} {state}"
        if now - self.said_at >= STILL_EVERY_S:
            self.said_at = now
            return f"{elapsed} still: {state}"
        return None


def _reputation(value: Any) -> str:
    """The chain's reputation integer (scale 10^6) as a decimal (0.5)."""
    return f"{int(value) / 1_000_000:.3f}" if isinstance(value, int) else str(value)


def _progress_line(view: dict[str, Any] | None) -> str:
    if view is None:
        return "waiting for the node to load its shard and register"
    stake = view.get("stake")
    stake_text = format_eth(int(stake)) if stake is not None else "not yet agreed"
    return (
        f"{view.get('status')}, stake {stake_text}, "
        f"reputation {_reputation(view.get('reputation'))}, "
        f"routable {bool(view.get('routable'))}"
        + (" (uncommitted: commit what you serve)" if view.get("uncommitted") else "")
    )


def _leave(args: argparse.Namespace) -> int:
    from node.agent.launch import read_joined, stop_joined  # lazy: aiohttp, numpy, eth-account

    config = _config(args)
    joined = read_joined(config.run_dir)
    if joined is None:
        print("not joined (nothing runs from this home)")
        return 0
    if args.now:
        _say(f"stopping the agent (it sends `leave`) and the node of shard {joined.shard}…")
    else:
        _say(
            "stopping the agent (it sends `leave`); the node of shard "
            f"{joined.shard} stays up to answer the spot checks of its last work…"
        )
    stopped = stop_joined(config.run_dir, node=args.now)
    try:
        view = _committee_view(config, joined.node_key)
        if view is not None and view.get("status") != "LEFT":
            # The agent was not running (crashed, killed) or could not get `leave` committed:
            # send it from here with the same node key.
            _say("the chain does not list the node as LEFT yet; sending `leave` from here…")
            view = asyncio.run(_send_leave(config, joined.node_key))
        if not args.now:
            _drain(config, joined.node_pid)
    except PlanetError as error:
        if not args.now:
            stopped = {**stop_joined(config.run_dir), "agent": stopped["agent"]}
        raise UnavailableError(
            f"stopped the node, but the committee at {config.committee_rpc} did not answer "
            f"({error.message}): the chain may not list it as LEFT",
            hint=_unreachable_hint(config, "--committee-rpc / set PLANET_COMMITTEE_RPC")
            + "; then `planet status` shows the node's state",
        ) from None
    except KeyboardInterrupt:
        stop_joined(config.run_dir)
        _say("interrupted: node stopped before the spot checks of its last work were done")
        raise
    if not args.now:
        stopped = {**stop_joined(config.run_dir), "agent": stopped["agent"]}
    status = view.get("status") if view else "not registered"
    print(
        f"left: agent {'stopped' if stopped['agent'] else 'was not running'}, node "
        f"{'stopped' if stopped['node'] else 'was not running'}; chain status {status}"
    )
    return 0


_DRAIN_POLL_S = 2.0


def _drain(config: Any, node_pid: int) -> None:
    """Wait while the left node still answers the spot checks of its last work: verifiers check
    the blocks committed in epoch e under e + 1's seed, and start no check or re-judgement
    later than CHECK_LOOKBACK_EPOCHS after that (protocol/spotcheck.py). So from the epoch the
    node left in, L (its agent committed its last records before `leave`), it stays up until
    the committee reaches epoch L + CHECK_LOOKBACK_EPOCHS + 2; a node that exits meanwhile
    ends the wait. Progress on stderr; PlanetError when the committee stops answering (polled
    every _DRAIN_POLL_S)."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.server.launcher import pid_alive
    from protocol.spotcheck import CHECK_LOOKBACK_EPOCHS

    async def current(link: Any) -> int:
        answer = await link.query("/epochs")
        try:
            return int(answer["current"])
        except (KeyError, TypeError, ValueError):
            raise UnavailableError(
                f"the committee's /epochs answer is malformed: {answer!r:.80}"
            ) from None

    async def wait() -> None:
        link = CommitteeLink([config.committee_rpc])
        try:
            until = await current(link) + CHECK_LOOKBACK_EPOCHS + 2
            shown = -1
            while pid_alive(node_pid):
                epoch = await current(link)
                if epoch >= until:
                    return
                if epoch != shown:
                    _say(
                        f"  epoch {epoch}: answering spot checks of its last work until epoch "
                        f"{until} (Ctrl-C or `planet leave --now` stops it at once)"
                    )
                    shown = epoch
                await asyncio.sleep(_DRAIN_POLL_S)
        finally:
            await link.close()

    asyncio.run(wait())


# -- status ---------------------------------------------------------------------------------------


def collect_status(config: Any) -> dict[str, Any]:
    """Everything `planet status` shows, as one JSON-able object (errors per part)."""
    # lazy: aiohttp, numpy, eth-account
    from node.agent.launch import agent_alive, read_joined
    from node.keys import node_public_key, wallet_address
    from node.server.launcher import pid_alive

    out: dict[str, Any] = {
        "home": str(config.home),
        "evm_rpc": config.evm_rpc,
        "committee_rpc": config.committee_rpc,
    }
    address = wallet_address(config.wallet_path) if config.wallet_path.exists() else None
    key = node_public_key(config.node_key_path) if config.node_key_path.exists() else None
    out["address"], out["node_key"] = address, key
    out["stake"] = None
    if address:
        try:
            out["stake"] = _read_stake(config, address)
        except PlanetError as error:
            out["stake"] = {"error": error.message}
    joined = read_joined(config.run_dir)
    out["local"] = None
    if joined is not None:
        out["local"] = {
            "shard": joined.shard,
            "endpoint": joined.endpoint,
            "model": joined.model,
            "node_alive": pid_alive(joined.node_pid),
            "agent_alive": agent_alive(joined),
            "node_log": joined.node_log,
            "agent_log": joined.agent_log,
        }
    out["committee"] = None
    out["pool"] = None
    if key:
        try:
            out["committee"], out["pool"] = asyncio.run(_committee_status(config, key, joined))
        except PlanetError as error:
            out["committee"] = {"error": error.message}
    return out


def _read_stake(config: Any, address: str) -> dict[str, Any]:
    from node.chain.evm.deployment import Deployment  # lazy: eth-utils

    w3 = _check_chain(config)
    deployment = Deployment.load(config.deployment_path)
    staking = deployment.contracts["Staking"]
    functions = w3.eth.contract(address=staking.address, abi=staking.abi).functions
    return {
        "balance_wei": str(w3.eth.get_balance(address)),
        "amount_wei": str(functions.stakeOf(address).call()),
        "role": ROLE_NAMES.get(functions.roleOf(address).call(), "?"),
        "status": STAKE_STATUS.get(functions.statusOf(address).call(), "?"),
        "unbonding_at": int(functions.unbondingAt(address).call()),
    }


async def _committee_status(config: Any, key: str, joined: Any) -> tuple[Any, Any]:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    link = CommitteeLink([config.committee_rpc])
    try:
        view = await link.node(key)
        model = (view or {}).get("model") or (joined.model if joined else None)
        pool = await link.query("/pool_health", model=model) if model else None
        return view, pool
    finally:
        await link.close()


def _status(args: argparse.Namespace) -> int:
    config = _config(args)
    status = collect_status(config)
    if args.json:
        print(json.dumps(status, indent=1))
        return 0
    print(f"home        {status['home']}")
    print(f"wallet      {status['address'] or '(none yet: created by `planet stake`)'}")
    stake = status["stake"] or {}
    if "error" in stake:
        print(f"stake       unknown: {stake['error']}")
    elif stake:
        print(f"balance     {format_eth(int(stake['balance_wei']))}")
        print(
            f"stake       {format_eth(int(stake['amount_wei']))} as {stake['role']} "
            f"({stake['status']})"
        )
    view = status["committee"]
    if view is None:
        print("committee   not registered")
    elif "error" in view:
        print(f"committee   unknown: {view['error']}")
    else:
        print(f"node key    {view['key']}")
        print(f"lifecycle   {view['status']} (since block {view['status_height']})")
        print(
            f"reputation  {view['reputation']}  attested stake "
            f"{format_eth(int(view['stake'])) if view.get('stake') else 'none'}"
        )
        why = [name for name in ("untrusted", "uncommitted") if view.get(name)]
        print(f"routable    {'yes' if view['routable'] else 'no'}", *(f"({w})" for w in why))
        print(f"numerics    {numerics_line(view)}")
    pool = status["pool"]
    if pool:
        per_shard = "  ".join(
            f"shard {i}: {n}" for i, n in enumerate(pool.get("routable_per_shard", []))
        )
        print(f"pool        {pool.get('status')}  ({per_shard})")
    local = status["local"]
    if local:
        print(
            f"local       shard {local['shard']} at {local['endpoint']}  node "
            f"{'up' if local['node_alive'] else 'DOWN'}, agent "
            f"{'up' if local['agent_alive'] else 'DOWN'}"
        )
    return 0


def numerics_line(view: dict[str, Any]) -> str:
    """`planet status`'s numerics line: what the registration announces against what this
    release computes with (protocol/numerics.py; docs/network.md, *Numerics*)."""
    from protocol.numerics import NUMERICS, NumericsError, announced, mismatch_line

    try:
        registered = announced(view)
    except NumericsError as error:
        return f"unknown: {error.message}"
    if registered is None:
        return f"not announced (registered by an older release); this release: {NUMERICS}"
    if registered == NUMERICS:
        return f"{registered} (this release's)"
    return (
        f"{mismatch_line(registered)}: verifiers on {NUMERICS} do not spot-check it bitwise "
        f"(after upgrading: `planet node numerics --set` announces {NUMERICS} from the next epoch)"
    )


def _devnet_host_port(host: str) -> int:
    """Inside a `planet devnet exec` host: a free one of the ports the other hosts reach there
    (0 outside one). Any other port would be registered and unreachable."""
    import os

    from node.config import DEVNET_PORTS_ENV, devnet_ports
    from node.net import port_is_free

    exposed = devnet_ports(os.environ)
    if not exposed:
        return 0
    for port in exposed:
        if port_is_free(port, host):
            return port
    raise UsageError(
        f"every port this devnet host exposes ({DEVNET_PORTS_ENV}: "
        f"{', '.join(map(str, exposed))}) is taken",
        hint="stop a node joined from this host (planet leave), or join from another operator host",
    )
