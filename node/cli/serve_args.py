"""The arguments of `planet node serve` (one seat of `planet node host` takes the same) and
their parsing into a validated ServerConfig and the node key."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.errors import ProtocolError, UsageError
from protocol.spans import parse_span_arg
from protocol.spotcheck import DEFAULT_RATE_PPM, SelectionError, check_rate

if TYPE_CHECKING:
    from node.server.config import ServerConfig
    from node.server.next_hops import NextHopSpec


def _finite(text: str) -> float:
    """argparse type: a finite, non-negative number (nan, inf and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The arguments of `planet node serve`, also those of one seat of `planet node host`."""
    serve.add_argument("--manifest", type=Path, required=True, help="the model's manifest.json")
    which = serve.add_mutually_exclusive_group(required=True)
    which.add_argument("--shard", type=int, help="shard id to serve")
    which.add_argument(
        "--shards",
        metavar="A-B",
        help="serve shards A to B as one hop (a span: fewer hops for a fast machine), e.g. 1-2",
    )
    serve.add_argument("--port", type=int, default=18100, help="TCP port (default 18100)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default auto)")
    serve.add_argument(
        "--idle-timeout",
        type=_finite,
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
        type=_finite,
        default=2048.0,
        help="KV cache over all sessions before answering busy (default 2048)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=_finite,
        default=128.0,
        metavar="MB",
        help="KV of prompt prefixes kept for other sessions' prefills, least recently used "
        "dropped first (default 128; 0: no prefix cache)",
    )
    serve.add_argument(
        "--prefix-advertise-min-sessions",
        type=int,
        default=2,
        metavar="N",
        help="list a cached prompt block's route keys in /info once N sessions reached it "
        "(default 2: a prompt only one session sent is never advertised)",
    )
    serve.add_argument(
        "--max-sessions-per-peer",
        type=int,
        default=16,
        metavar="N",
        help="sessions one caller (peer address, IPv6 /64) may hold; raise it for a gateway "
        "(default 16)",
    )
    serve.add_argument(
        "--max-cache-mb-per-peer",
        type=_finite,
        default=512.0,
        metavar="MB",
        help="KV cache one caller may hold (default 512)",
    )
    serve.add_argument(
        "--max-inflight-per-peer",
        type=int,
        default=16,
        metavar="N",
        help="sessions of one caller with frames in flight (default 16, the per-caller "
        "session limit)",
    )
    serve.add_argument(
        "--max-batch",
        type=int,
        default=32,
        metavar="N",
        help="most sessions whose decode steps run as one batched forward (default 32)",
    )
    serve.add_argument(
        "--max-queued",
        type=int,
        default=256,
        metavar="N",
        help="most frames waiting for the forward pass, all callers; more answer busy "
        "(default 256)",
    )
    serve.add_argument(
        "--max-session-age",
        type=_finite,
        default=3600.0,
        metavar="SECONDS",
        help="evict sessions older than this even if used (default 3600)",
    )
    serve.add_argument(
        "--reclaim-idle",
        type=_finite,
        default=30.0,
        metavar="SECONDS",
        help="when full, a session idle this long may be reclaimed for another caller from "
        "the caller holding the most (default 30)",
    )
    serve.add_argument(
        "--max-request-mb", type=_finite, default=32.0, help="largest accepted frame (default 32)"
    )
    serve.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for the forward pass (default: half the cores, 1 to 4)",
    )
    serve.add_argument(
        "--commit-dir",
        type=Path,
        metavar="DIR",
        help="record fingerprints of served blocks and spool their commit records here for "
        "the node agent (`planet join` sets it); default: record nothing",
    )
    serve.add_argument(
        "--credit-positions",
        type=int,
        default=0,
        metavar="N",
        help="charge for work: compute a session's positions only while bearer credits paid "
        "for it cover them, N positions per credit (default 0: free); needs --committee-rpc "
        "(credits are checked against its keys and spent set) and --credits-dir. Clients pay "
        "the price registered on the committee chain (the agent's --credit-positions, as "
        "`planet join` passes it): once that is read, with a node key, the node charges it",
    )
    serve.add_argument(
        "--pay-wait",
        type=_finite,
        default=5.0,
        metavar="SECONDS",
        help="with --credit-positions: how long a frame past what is paid waits for the client's "
        "credit before the session is refused payment_required (default 5)",
    )
    serve.add_argument(
        "--credit-margin-blocks",
        type=int,
        default=60,
        metavar="BLOCKS",
        help="with --credit-positions: take a credit only while the chain will still redeem it "
        "this many blocks after its latest one (the agent's redemption delay; default 60); a "
        "credit closer to its window's end is refused credit_expiring",
    )
    serve.add_argument(
        "--credit-unlocked",
        type=int,
        default=1,
        metavar="CREDITS",
        help="with --credit-positions: per session, serve on at most this many credits whose "
        "lock on the committee is still in flight (what a client that shows one credit to "
        "several nodes can get from each node that loses it; 0: none, at the cost of a block's "
        "wait before the first output; default 1)",
    )
    serve.add_argument(
        "--credits-dir",
        type=Path,
        metavar="DIR",
        help="where the credits this node is paid with are kept until its agent redeems them "
        "(`python -m node.agent --credits-dir DIR`)",
    )
    serve.add_argument(
        "--served-max-mb",
        type=_finite,
        default=256.0,
        metavar="MB",
        help="inputs and fingerprints kept for spot-check tickets (default 256)",
    )
    serve.add_argument(
        "--node-key",
        type=Path,
        metavar="FILE",
        help="node_key.json (password from PLANET_PASSWORD or --password-file): the key of the "
        "node's TLS certificate (what clients pin), and, with --committee-rpc, the key that "
        "signs and seals spot-check tickets; required unless --plaintext-links",
    )
    serve.add_argument(
        "--plaintext-links",
        action="store_true",
        help="local mode: serve plain http/ws (no TLS) and dial http:// next hops off "
        "loopback too; for loopback tests and networks you own (logged as a warning)",
    )
    serve.add_argument(
        "--committee-rpc",
        metavar="URL",
        help="a committee validator's RPC: epoch seeds and verifier sets that authorize "
        "ticket requests (with --node-key), and the routable nodes this node may forward to "
        "(--next-hops committee, the default with it); `planet join` sets it",
    )
    serve.add_argument("--password-file", type=Path, help="file holding the node key's password")
    serve.add_argument(
        "--spot-check-ppm",
        type=int,
        default=None,
        metavar="PPM",
        help="spot-check rate in parts per million, as the committee's verifiers use it "
        "(default 50000 = 5 %%)",
    )
    hops = serve.add_mutually_exclusive_group()
    hops.add_argument(
        "--next-hops",
        metavar="POLICY",
        help="which next hops a client may make this node dial: none, committee, any "
        "(development only) or URL[,URL...], e.g. http://10.0.0.8:18101 (default: committee "
        "with --committee-rpc, else none)",
    )
    hops.add_argument(
        "--next-hops-file",
        type=Path,
        metavar="FILE",
        help="the next hops this node may dial, one http(s)://host:port a line (# comments)",
    )
    serve.add_argument(
        "--chunk-rate-mb",
        type=float,
        default=32.0,
        help="MiB/s one caller may fetch of this node's shard file (joining nodes download "
        "shards from the nodes serving them; default 32)",
    )
    serve.add_argument(
        "--rendezvous",
        nargs=2,
        action="append",
        metavar=("RELAY_URL", "RELAY_KEY"),
        help="a node behind NAT: keep a link to this relay (its URL and X25519 key, as "
        "`planet relay serve` prints them) and serve the connections that reach this node's "
        "port there; repeat for up to 3 relays (docs/overlay.md, NAT rendezvous)",
    )
    serve.add_argument(
        "--private-next-hops",
        nargs="?",
        const="all",
        default=None,
        metavar="CIDR[,CIDR]",
        help="with the committee policy, also dial next hops at loopback/private/link-local "
        "addresses, or only at those in the ranges given, e.g. 10.77.0.0/24 (a devnet or LAN "
        "test network; public networks leave it off: registered endpoints are strangers' "
        "choice)",
    )


def _node_key(args: argparse.Namespace) -> object | None:
    """The node key (TLS certificate; spot-check tickets with --committee-rpc), or None."""
    if args.spot_check_ppm is not None:
        try:
            check_rate(args.spot_check_ppm)
        except SelectionError as error:
            raise UsageError(f"--spot-check-ppm: {error.reason}", hint="e.g. 50000") from None
    if args.node_key is None:
        return None
    if not args.node_key.exists():
        raise UsageError(
            f"no node key at {args.node_key}",
            hint="`planet join` creates <home>/node_key.json on first use",
        )
    from node.keys import PasswordSource, load_node_key  # lazy: eth-account, nacl

    password = PasswordSource(file=args.password_file, interactive=False).read()
    return load_node_key(args.node_key, password)


def _next_hops(args: argparse.Namespace) -> NextHopSpec:
    """The --next-hops / --next-hops-file value as a NextHopSpec (UsageError when bad)."""
    # lazy: node.server loads aiohttp and numpy
    from node.server.next_hops import (
        NextHopSpec,
        parse_next_hops,
        parse_ranges,
        read_next_hops_file,
    )

    if args.next_hops_file is not None:
        spec = read_next_hops_file(args.next_hops_file)
    elif args.next_hops is None:
        spec = NextHopSpec(mode="committee" if args.committee_rpc else "none")
    else:
        spec = parse_next_hops(args.next_hops)
    if spec.mode == "committee" and not args.committee_rpc:
        raise UsageError(
            "--next-hops committee needs --committee-rpc",
            hint="give the committee RPC, or list the next hops: --next-hops URL[,URL...]",
        )
    if args.private_next_hops:
        if spec.mode != "committee":
            raise UsageError(
                "--private-next-hops only applies to the committee policy",
                hint="a --next-hops list or `any` is dialled as given",
            )
        ranges = () if args.private_next_hops == "all" else parse_ranges(args.private_next_hops)
        spec = replace(spec, private=True, private_ranges=ranges)
    return spec


def _rendezvous(args: argparse.Namespace, node_key: object | None) -> tuple:
    """--rendezvous URL KEY (repeated) as RendezvousRelays; UsageError when bad."""
    from node.server.rendezvous import MAX_RELAYS, parse_relay  # lazy: aiohttp

    given = args.rendezvous or []
    if not given:
        return ()
    if len(given) > MAX_RELAYS:
        raise UsageError(f"--rendezvous names {len(given)} relays; at most {MAX_RELAYS}")
    if node_key is None:
        raise UsageError(
            "--rendezvous needs --node-key: the node proves its key to the relay",
            hint="`planet join` creates <home>/node_key.json on first use",
        )
    relays = []
    for url, key in given:
        try:
            relays.append(parse_relay(url, key))
        except (ValueError, ProtocolError) as error:
            message = getattr(error, "message", str(error))
            raise UsageError(
                f"--rendezvous {url} {key[:16]}…: {message}",
                hint="give the relay's URL and key as `planet relay serve` prints them",
            ) from None
    return tuple(relays)


def server_config(args: argparse.Namespace) -> tuple[ServerConfig, object | None]:
    """`planet node serve`'s arguments → (the validated ServerConfig, the node key or None);
    UsageError when they do not fit. Test entry points that wrap `serve()` reuse it
    (tests/doubles/cheating_node.py)."""
    from node.server.config import ServerConfig  # lazy: the node's runtime (aiohttp, numpy)

    next_hops = _next_hops(args)
    if args.node_key is None and not args.plaintext_links:
        raise UsageError(
            "a node serves TLS links bound to its node key: give --node-key FILE",
            hint="`planet join` creates <home>/node_key.json on first use (password from "
            "PLANET_PASSWORD or --password-file); for loopback tests and local circuits: "
            "--plaintext-links",
        )
    node_key = _node_key(args)
    if not args.manifest.exists():
        raise UsageError(
            f"no manifest at {args.manifest}",
            hint="prepare the model first: planet model prepare --parts 3",
        )
    first, last = args.shard, None
    if args.shards is not None:
        span = parse_span_arg(args.shards)
        first, last = span.first, span.last
    config = ServerConfig(
        manifest_path=args.manifest,
        shard_id=first,
        last_shard=last,
        host=args.host,
        port=args.port,
        device=args.device,
        idle_timeout_s=args.idle_timeout,
        max_sessions=args.max_sessions,
        max_cache_bytes=int(args.max_cache_mb * 1024 * 1024),
        prefix_cache_bytes=int(args.prefix_cache_mb * 1024 * 1024),
        prefix_advertise_min_sessions=args.prefix_advertise_min_sessions,
        max_request_bytes=int(args.max_request_mb * 1024 * 1024),
        max_sessions_per_peer=args.max_sessions_per_peer,
        max_cache_bytes_per_peer=int(args.max_cache_mb_per_peer * 1024 * 1024),
        max_inflight_per_peer=args.max_inflight_per_peer,
        max_batch=args.max_batch,
        max_queued=args.max_queued,
        max_session_age_s=args.max_session_age,
        reclaim_idle_s=args.reclaim_idle,
        torch_threads=args.threads,
        commit_dir=args.commit_dir,
        served_max_bytes=int(args.served_max_mb * 1024 * 1024),
        committee_rpc=args.committee_rpc,
        spot_check_ppm=args.spot_check_ppm or DEFAULT_RATE_PPM,
        next_hops=next_hops,
        plaintext_links=args.plaintext_links,
        chunk_bytes_per_s_per_peer=max(1, int(args.chunk_rate_mb * 1024 * 1024)),
        credit_positions=args.credit_positions,
        credits_dir=args.credits_dir,
        pay_wait_s=args.pay_wait,
        credit_margin_blocks=args.credit_margin_blocks,
        credit_unlocked=args.credit_unlocked,
        rendezvous=_rendezvous(args, node_key),
    ).validate()
    return config, node_key
