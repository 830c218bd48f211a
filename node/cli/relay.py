"""`planet relay serve | leave`: run a relay of the overlay (docs/overlay.md), registered on the
committee chain as `planet join` registers a node."""

from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from node.config import default_home
from node.procs import run_service
from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet stake --role relay --amount 0.1              the relay's stake (its own, small minimum)
  planet relay serve --port 9100                      registered; keys in $PLANET_HOME
  planet relay serve --host 0.0.0.0 --endpoint http://203.0.113.7:9100 --home /srv/relay
  planet relay serve --port 9101 --no-register --allow-private-next-hops   unlisted (tests)
  planet relay serve --endpoint http://203.0.113.7:9100 --rendezvous-ports 44000-44063
                                                      also fronts up to 64 nodes behind NAT
what it does: forwards users' cloves along paths it knows one step of each way (its
predecessor and its successor), adding or removing one encryption layer per cell; it never
sees a prompt, a token or who asked. Its key (X25519, <home>/relay_key, 0600) is made at first
start and printed (also at /info).
registration: like `planet join` for a node, the relay needs a Relay stake from the home's
wallet (`planet stake --role relay`); at start it registers its committee key
(<home>/node_key.json: a home serves a node or a relay, not both) with its endpoint and X25519
key (the `relay` tx), says so in one line, and heartbeats while it runs. Users' clients list it
(`planet gateway serve --personal --relays chain`) once the validators agree on its stake.
Stopping the relay does not deregister it (it goes DOWN and off the list until it is back);
`planet relay leave` deregisters it for good. With --no-register it serves unlisted: only
clients given its URL and key in a relays file use it.
rendezvous: with --rendezvous-ports the relay also fronts nodes that accept no inbound
connection: such a node keeps a link to /v1/rendezvous, proving its node key, and gets one port
of the range; connections to that port reach the node over its link. The relay forwards their
bytes untouched (TLS pinned to the node key: it reads no prompt or token). It fronts a key the
committee shows as a staked node for good; any other key gets at most a lease (2 per address, a
quarter of the ports in all; --rendezvous-lease), so throwaway keys cannot fill its ports
(--rendezvous-admit any: every key, for a lab without a committee).
exit: when the relay is the last of a path and cannot reach the node at the URL the user's
client named, it dials the other addresses that node's key registered on the committee (its
ports at its other rendezvous relays), pinned to its key: registered, or with --committee-rpc
(a relay with neither dials the named URL only).
pay: users' clients pay the relay in credits for the cloves that arrived (the node
acknowledges them); it keeps them in <home>/relay-credits/ and, registered, redeems them on the
committee every few seconds. `planet relay redeem` redeems what it holds once (after a run
with --no-register, or while the committee was away).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from node.cli.operator import _common  # the chain and key flags every operator command has

    parser = subparsers.add_parser(
        "relay",
        help="run a relay of the overlay (forwards users' cloves)",
        description="Run a relay of the overlay.",
    )
    sub = parser.add_subparsers(dest="relay_command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="register on the committee and forward cloves along users' paths until stopped",
        description="Register the relay on the committee chain (its stake, endpoint and key), "
        "then forward users' cloves along their paths, one layer per hop, until stopped.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", type=int, default=9100, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--endpoint",
        metavar="URL",
        help="the URL registered for users to reach this relay, http(s)://IP:PORT (default: "
        "http://HOST:PORT; with --host 0.0.0.0, the address this machine reaches the "
        "committee from)",
    )
    serve.add_argument(
        "--no-register",
        action="store_true",
        help="serve without registering (no stake, no chain): users' clients find the relay "
        "only in a relays file",
    )
    serve.add_argument(
        "--allow-private-next-hops",
        action="store_true",
        help="also dial next hops at loopback and private addresses (a devnet or a LAN; "
        "default: public addresses only, as next hops are strangers' choice)",
    )
    serve.add_argument(
        "--rendezvous-ports",
        metavar="FIRST-LAST",
        help="front nodes behind NAT (docs/overlay.md, NAT rendezvous): each node that links "
        "to /v1/rendezvous gets one of these ports, and every connection to it is forwarded "
        "to the node over its link (default: front none)",
    )
    serve.add_argument(
        "--rendezvous-host",
        metavar="HOST",
        help="the public address dialers reach the rendezvous ports at (default: the "
        "--endpoint's host, else --host)",
    )
    serve.add_argument(
        "--rendezvous-admit",
        choices=("registered", "any"),
        default="registered",
        help="which node keys get a rendezvous port: `registered` (default) asks the committee "
        "(--committee-rpc): a staked node keeps its port, any other key gets at most a lease "
        "(2 per address, a quarter of the ports in all) that ends unless the key is registered "
        "by then; `any`: every key (a lab without a committee)",
    )
    serve.add_argument(
        "--rendezvous-lease",
        type=_ascii_float,
        default=120.0,
        metavar="SECONDS",
        help="how long a key the committee does not show staked holds its port before it is "
        "looked at again (default: %(default)s; 1-3600)",
    )
    serve.add_argument("--log-level", default="info", help="debug, info, warning (default: info)")
    _common(serve)
    serve.set_defaults(handler=_serve)
    leave = sub.add_parser(
        "leave",
        help="deregister the relay for good (`leave`: LEFT is final for its key)",
        description="Deregister the relay: the committee stops listing it, and its endpoint "
        "and key are free again. Unstake with `planet unstake` afterwards.",
    )
    _common(leave)
    leave.set_defaults(handler=_leave)
    redeem = sub.add_parser(
        "redeem",
        help="redeem the credits the relay was paid (held in <home>/relay-credits/) now",
        description="Redeem on the committee the credits users' clients paid this relay with "
        "(`relay_redeem`); its key must be registered as a relay. A credit the committee "
        "refuses for good (redeemed by another, forged, locked by a node, expired) is dropped "
        "and named.",
    )
    _common(redeem)
    redeem.set_defaults(handler=_redeem)
    parser.set_defaults(help_parser=parser)


def _ascii_float(text: str) -> float:
    """A number written in ASCII (Python's float() also reads other scripts' digits)."""
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"not a number in ASCII digits: {text!r}")
    return float(text)


def _serve(args: argparse.Namespace) -> int:
    from node.relay.run import load_or_create_key, serve  # lazy: aiohttp, nacl

    home = args.home or default_home()
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port (1-65535)")
    if not 1 <= args.rendezvous_lease <= 3600:  # NaN fails both; checked before any key opens
        raise UsageError(
            f"--rendezvous-lease {args.rendezvous_lease:g} is not 1-3600 seconds",
            hint="a lease long enough for `planet join` to register and stake: 120 (default)",
        )
    private = load_or_create_key(home)
    rendezvous = _rendezvous(args)
    standing = None if args.no_register else _standing(args, home, private)
    admit_from = _admit_from(args, home, standing) if rendezvous is not None else None
    # an exit's other addresses for a node behind NAT: from the committee it registers on,
    # or the one named (--committee-rpc); none without one
    exits_from = str(standing.committee_rpc) if standing is not None else args.committee_rpc
    # `planet`'s own logging set-up ran first (at warning unless -v): the relay's level wins
    logging.getLogger().setLevel(args.log_level.upper())
    return run_service(
        lambda: serve(
            home,
            args.host,
            args.port,
            allow_private=args.allow_private_next_hops,
            private=private,
            standing=standing,
            rendezvous=rendezvous,
            admit_from=admit_from,
            lease_s=args.rendezvous_lease,
            exits_from=exits_from,
        ),
        log_level=args.log_level,
        log=logging.getLogger("planet.relay"),
    )


def _rendezvous(args: argparse.Namespace) -> tuple[tuple[int, int], str] | None:
    """--rendezvous-ports / --rendezvous-host as (ports, public host), or None."""
    from node.relay.fronting import parse_port_range  # lazy: aiohttp

    if args.rendezvous_ports is None:
        if args.rendezvous_host is not None:
            raise UsageError("--rendezvous-host needs --rendezvous-ports")
        return None
    ports = parse_port_range(args.rendezvous_ports)
    if args.port in range(ports[0], ports[1] + 1):
        raise UsageError(f"--port {args.port} is inside --rendezvous-ports {args.rendezvous_ports}")
    host = args.rendezvous_host
    if host is None and args.endpoint:
        host = urlsplit(args.endpoint).hostname
    if host is None:
        host = args.host
    if host in ("0.0.0.0", "::", ""):
        raise UsageError(
            f"--host {args.host} is no address dialers can reach",
            hint="give the relay's public address: --rendezvous-host IP (or --endpoint)",
        )
    return ports, host


def _admit_from(args: argparse.Namespace, home: Path, standing: Any) -> str | None:
    """The committee RPC whose registry decides which keys get a rendezvous port
    (--rendezvous-admit registered), or None (any)."""
    if args.rendezvous_admit == "any":
        return None
    if standing is not None:
        return str(standing.committee_rpc)
    from node.cli.operator import _config  # lazy: the config stack

    args.home = home
    return str(_config(args).committee_rpc)


def _standing(args: argparse.Namespace, home: Path, private: Any) -> Any:
    """Everything a registered relay needs before it serves, each mistake one error line: the
    Relay stake on the EVM chain, the committee key, the endpoint and the wallet's binding."""
    # lazy: the web3 stack, eth-account, nacl
    from node.cli.operator import (
        ROLES,
        STAKE_STATUS,
        StakeBelowMinimum,
        _chain,
        _config,
        _password,
        _wallet,
        format_eth,
    )
    from node.keys import load_or_create_node_key
    from node.relay.registration import RelayIdentity
    from node.relay.run import Standing
    from protocol.committee.registry import sign_registration

    args.home = home
    config = _config(args)
    password = _password(config)
    chain = _chain(config, password)
    role = ROLES["relay"]
    minimum = chain.staking.minimum_stake(role)
    staked, status = chain.staking.stake_of(), chain.staking.status_of()
    if staked and chain.staking.role_of() != role:
        raise UsageError(
            f"{chain.address} is staked as another role; a relay needs a Relay stake",
            hint="serve the relay from another --home (another wallet)",
        )
    if staked < minimum or status != 1:
        raise StakeBelowMinimum(
            f"{chain.address} has {format_eth(staked)} staked "
            f"({STAKE_STATUS.get(status, status)}); a relay needs {format_eth(minimum)}",
            hint=f"planet stake --role relay --amount {format_eth(minimum)[:-4]}",
        )
    endpoint = args.endpoint or _default_endpoint(args.host, args.port, config.committee_rpc)
    _check_endpoint(endpoint)
    committee_key = load_or_create_node_key(config.node_key_path, password)
    wallet = _wallet(config, password)
    identity = RelayIdentity(
        endpoint=endpoint,
        relay_key=bytes(private.public_key).hex(),
        evm_address=wallet.address,
        evm_signature=sign_registration(wallet.key, committee_key.verify_key.encode().hex()),
    )
    return Standing(config.committee_rpc, committee_key, identity)


def _default_endpoint(host: str, port: int, committee_rpc: str) -> str:
    from node.cli.operator import _reachable_address

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(
            f"--host {host} is not an IP address, and a relay registers an IP literal",
            hint="pass --endpoint http://IP:PORT (the address users and relays reach it at)",
        ) from None
    if address.is_unspecified:
        address = ipaddress.ip_address(_reachable_address(committee_rpc))
    return f"http://[{address}]:{port}" if address.version == 6 else f"http://{address}:{port}"


def _check_endpoint(endpoint: str) -> None:
    from protocol.committee.relays import EndpointError, relay_endpoint

    try:
        relay_endpoint(endpoint)
    except EndpointError as error:
        raise UsageError(
            f"--endpoint {endpoint!r}: {error.reason}",
            hint="e.g. --endpoint http://203.0.113.7:9100 (relays dial next hops only at IP "
            "literals)",
        ) from None


def _leave(args: argparse.Namespace) -> int:
    import asyncio

    from node.cli.operator import _config, _password
    from node.keys import load_node_key

    config = _config(args)
    if not config.node_key_path.exists():
        raise UsageError(
            f"no relay key in {config.home}", hint="pass the relay's --home (where it served)"
        )
    key = load_node_key(config.node_key_path, _password(config))
    code, text = asyncio.run(_send_leave(config.committee_rpc, key))
    if code == 10:
        raise UsageError("this key is not registered on the committee", hint="nothing to leave")
    if code == 15:
        raise UsageError("this relay has already left", hint="nothing to leave")
    if code != 0:
        raise UsageError(f"the committee refused `leave` (code {code}: {text})")
    print(f"relay {key.verify_key.encode().hex()[:16]}… left the committee (final)")
    return 0


def _redeem(args: argparse.Namespace) -> int:
    import asyncio

    from node.cli.operator import _config, _password
    from node.keys import load_node_key
    from node.relay.earnings import SPOOL_DIR, Earnings

    config = _config(args)
    if not config.node_key_path.exists():
        raise UsageError(
            f"no relay key in {config.home}", hint="pass the relay's --home (where it served)"
        )
    earnings = Earnings(config.home / SPOOL_DIR)
    held = len(earnings.held)
    if not held:
        print(f"relay holds no credits ({config.home / SPOOL_DIR})")
        return 0
    key = load_node_key(config.node_key_path, _password(config))
    done = asyncio.run(_send_redeem(config.committee_rpc, key, earnings))
    refused = ", ".join(f"{n} {name}" for name, n in sorted(done.refused.items())) or "none"
    print(f"redeemed {done.credits} of {held} credits on the committee (refused: {refused})")
    if done.credits + sum(done.refused.values()) < held:
        raise UsageError(
            f"{len(earnings.held)} credits are still held: the committee did not take them",
            hint="see the log line above; run `planet relay redeem` again later",
        )
    return 0


async def _send_redeem(committee_rpc: str, key: Any, earnings: Any) -> Any:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.relay.redeem import redeem_held

    link = CommitteeLink([committee_rpc], key)
    try:
        view = await link.node(link.signer)
        if view is None or view.get("role") != "relay":
            what = "not registered" if view is None else f"a {view.get('role')} node's key"
            raise UsageError(
                f"{link.signer[:16]}… is {what}, not a registered relay's",
                hint="`planet relay serve` registers the relay (with its Relay stake)",
            )
        return await redeem_held(link, earnings)
    finally:
        await link.close()


async def _send_leave(committee_rpc: str, key: Any) -> tuple[int, str]:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.chain.committee_rpc import TxRejectedError
    from protocol.committee.registry import Leave

    link = CommitteeLink([committee_rpc], key)
    try:
        view = await link.node(link.signer)
        if view is not None and view.get("role") != "relay":
            raise UsageError(
                f"{link.signer[:16]}… is a {view.get('role')} node's key, not a relay's",
                hint="`planet leave` takes a node off the network",
            )
        try:
            return await link.send(Leave(), timeout_s=20)
        except TxRejectedError as error:
            return error.tx_code, error.log_text
    finally:
        await link.close()
