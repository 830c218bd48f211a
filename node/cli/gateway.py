"""`planet gateway serve`: the OpenAI-compatible API in front of the network, paid per question."""

from __future__ import annotations

import argparse
from pathlib import Path

from node.cli.overlay_args import (
    CHAIN_RELAYS,
    add_overlay_arguments,
    chain_relays,
    overlay_route,
    read_file_relays,
    ring_default,
)
from node.client.credit_sizes import MAX_BUY
from node.config import resolve_config
from node.gateway.config import NODE_COOLDOWN_S
from node.gateway.credit_defaults import MIN_CREDIT_POSITIONS, TOP_UP, TOP_UP_BELOW
from node.gateway.guards import ROUTES
from protocol.errors import UsageError
from protocol.frames.dtypes import WIRE_DTYPE, WIRE_DTYPE_HELP, WIRE_DTYPES

EXAMPLES = """\
examples:
  planet gateway serve --deployment deployment.json --manifest M/manifest.json \\
      --wallet ~/.cache/planet/gateway/wallet.json --password-file pw.txt
  planet gateway serve ... --evm-rpc http://127.0.0.1:8545 --committee-rpc http://127.0.0.1:26657 \\
      --price-wei-per-token 1000000000000 --port 8000
then, with the official OpenAI client (the API key is the payment proof, see docs/gateway.md):
  OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="planet-pay-v1.<query>.<cap>.<sig>")
it pays the nodes that charge with credits it buys as it runs low (--top-up), from its wallet's
balance at the escrow:
  planet balance deposit 0.1 --credits --wallet ~/.cache/planet/gateway/wallet.json
your own client, paying the nodes with your credits (no deposit, loopback only; the API key is
the token it prints at its first start and keeps in $PLANET_HOME/personal-token, mode 0600):
  planet credits buy 50
  planet gateway serve --personal --manifest M/manifest.json --committee-rpc http://HOST:26657
  OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=TOKEN)   # TOKEN: that file's one line
  planet gateway serve --personal --port 8001   on the running devnet: its committee and model
ready when GET /health answers 200; logs go to stderr.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="run an OpenAI-compatible gateway",
        description="Run an OpenAI-compatible gateway over the network's routable nodes.",
    )
    sub = parser.add_subparsers(dest="gateway_command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve /v1/chat/completions, /v1/completions, /v1/pools, receipts",
        description="Serve OpenAI's API. Each question is paid by a QueryEscrow deposit whose "
        "depositor signs the API key; answers carry a receipt signed by the gateway wallet. "
        "Nodes that charge are paid with the gateway's bearer credits, bought as it runs low.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--evm-rpc",
        default=None,
        help="EVM JSON-RPC URL (else $PLANET_EVM_RPC, config.toml, http://127.0.0.1:8545)",
    )
    serve.add_argument(
        "--deployment", type=Path, help="contract deployment JSON (addresses, ABIs; hosted only)"
    )
    serve.add_argument(
        "--committee-rpc",
        default=None,
        help="a validator's CometBFT RPC (else $PLANET_COMMITTEE_RPC, config.toml, :26657)",
    )
    serve.add_argument(
        "--manifest",
        type=Path,
        action="append",
        default=None,
        help="a model's manifest.json; again for each more model served (a question names its "
        "model: docs/gateway.md); --personal: default the running devnet's models",
    )
    serve.add_argument(
        "--wallet", type=Path, help="gateway keystore (created on first use; hosted only)"
    )
    serve.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="wallet password file (else $PLANET_PASSWORD_FILE, config.toml, $PLANET_PASSWORD)",
    )
    serve.add_argument(
        "--price-wei-per-token",
        type=int,
        default=10**12,
        help="price of one prompt or completion token in wei (default 10^12)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    serve.add_argument(
        "--receipts", type=Path, default=None, help="receipt log (default: next to the wallet)"
    )
    serve.add_argument(
        "--max-sessions-per-node",
        type=int,
        default=16,
        help="questions at once on one node from this gateway; more wait (default 16, the "
        "nodes' default per-caller session and in-flight quotas)",
    )
    serve.add_argument(
        "--failover-attempts",
        type=int,
        default=5,
        help="circuits one question may use: a hop that fails mid-answer is replaced and the "
        "answer replayed there, at most this many circuits in all (default 5)",
    )
    serve.add_argument(
        "--stall-s",
        type=float,
        default=10.0,
        help="seconds without an answer after which a circuit counts as stalled and fails "
        "over (default 10)",
    )
    serve.add_argument(
        "--node-cooldown-s",
        type=float,
        default=NODE_COOLDOWN_S,
        metavar="SECONDS",
        help="how long a node that failed a question sits out before it is routed again "
        f"(default {NODE_COOLDOWN_S:g}; a test network with one node per shard sets it short)",
    )
    serve.add_argument(
        "--speculate",
        type=int,
        default=0,
        metavar="K",
        help="guess up to K tokens per decode pass from the text so far and verify them in one "
        "pass through the circuit (fewer round trips over slow links; greedy answers unchanged); "
        "rejected guesses cost the nodes unpaid positions (default 0: off)",
    )
    serve.add_argument(
        "--ring",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the circuit's first node run the decode loop (its copy of the model's public "
        "head chooses each token, the client checks every one and pays as they come): no round "
        "trip to the client per token, which over --relays is most of a token's time; the first "
        "node learns the generated token ids it already sees as embeddings (docs/overlay.md, "
        "docs/privacy.md). Used on circuits whose nodes all offer it; not with --speculate. "
        "Default: on for --personal --relays (unless --speculate), else off",
    )
    serve.add_argument(
        "--wire-dtype",
        choices=WIRE_DTYPES,
        default=WIRE_DTYPE,
        help=WIRE_DTYPE_HELP,
    )
    serve.add_argument(
        "--report-min-questions",
        type=int,
        default=4,
        help="questions batched into one work report to the committee, so a report's time "
        "does not single out one question (default 4)",
    )
    serve.add_argument(
        "--report-max-wait",
        type=float,
        default=60.0,
        help="seconds a smaller batch waits before it is reported anyway (default 60)",
    )
    serve.add_argument(
        "--refund-margin-s",
        type=int,
        default=None,
        metavar="SECONDS",
        help="refuse a per-query deposit whose refund opens within SECONDS, so its user cannot "
        "take it back before the epoch's root lands (else $PLANET_REFUND_MARGIN_S, config.toml "
        "refund_margin_s, else derived from the settlement timeline: report wait + epoch + "
        "posting, docs/gateway.md)",
    )
    serve.add_argument(
        "--committee-block-s",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="the committee's block interval the settlement timeline assumes (default 1.0)",
    )
    serve.add_argument(
        "--private-endpoints",
        action="store_true",
        help="also dial nodes registered on loopback or private addresses (a devnet or LAN); "
        "by default only globally routable endpoints are probed and dialled",
    )
    credits = serve.add_argument_group(
        "paying the nodes that charge, with bearer credits",
        "both a hosted gateway and your own client pay each node that charges credits (its "
        "/info credit_positions) as answers run; free nodes are not paid (docs/gateway.md)",
    )
    credits.add_argument(
        "--credits-file",
        type=Path,
        default=None,
        help="credits to pay with (default: hosted, <wallet>-credits.json next to --wallet; "
        "--personal, $PLANET_HOME/credits.json, as `planet credits`)",
    )
    credits.add_argument(
        "--min-credit-positions",
        type=int,
        default=MIN_CREDIT_POSITIONS,
        metavar="N",
        help="never pay a node that asks a credit per fewer than N positions: such a node is "
        f"never put in a circuit (default {MIN_CREDIT_POSITIONS})",
    )
    credits.add_argument(
        "--top-up-below",
        type=int,
        default=None,
        metavar="N",
        help=f"hosted: buy credits when the wallet holds fewer than N (default {TOP_UP_BELOW})",
    )
    credits.add_argument(
        "--top-up",
        type=int,
        default=None,
        metavar="N",
        help=f"hosted: credits bought each time, in mints of at most {MAX_BUY}, paid from the "
        "gateway wallet's balance at the escrow (`planet balance deposit X --credits --wallet "
        f"W`); 0: never buy (default {TOP_UP})",
    )
    credits.add_argument(
        "--validator-rpc",
        action="append",
        default=None,
        metavar="URL",
        help="hosted: a validator's CometBFT RPC to buy credits from; give one per validator, "
        "each blind-signs its share (default: the running devnet's validators when "
        "--committee-rpc is one of them, else --committee-rpc alone)",
    )
    personal = serve.add_argument_group(
        "your own client (--personal)",
        "OpenAI's API on this machine for your own tools: circuits from the committee's node "
        "directory, the nodes paid with your bearer credits as answers run (docs/privacy.md says "
        "what this hides from whom)",
    )
    personal.add_argument(
        "--personal",
        action="store_true",
        help="serve yourself: no deposits or payment keys, loopback only, a bearer token of "
        "your own (--token-file), nodes paid with credits",
    )
    personal.add_argument(
        "--route",
        choices=ROUTES,
        default=None,
        help="how each shard's node is chosen. private (default): one node per shard drawn at "
        "random and kept until it fails or 30 days pass, so no node gets your questions by "
        "being fast or cheap; cost: the cheapest nodes by load and latency, drawn afresh for "
        "every question (faster, but a fast stranger draws most of your questions); uniform: "
        "drawn at random afresh for every question (a verifier's client: its challenges reach "
        "every node)",
    )
    personal.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the bearer token every request must carry (your tools' API key): drawn at the "
        "first start, printed once, kept here with mode 0600 and reused (default "
        "$PLANET_PERSONAL_TOKEN_FILE, else $PLANET_HOME/personal-token)",
    )
    add_overlay_arguments(
        personal,
        refreshed=" at start, every page, and again every --relays-refresh seconds and when a "
        "relay is unreachable",
    )
    personal.add_argument(
        "--relays-refresh",
        type=_refresh_seconds,
        default=None,
        metavar="SECONDS",
        help="with --relays chain: read the committee's /relays again about every SECONDS "
        "(±10%% jitter; default 60): relays that left are no longer drawn for new questions, "
        "new ones are; a failed read keeps the last good list",
    )
    serve.set_defaults(handler=_serve)
    parser.set_defaults(help_parser=parser)


def _refresh_seconds(text: str) -> float:
    try:  # ASCII only: float() also takes other scripts' digits
        seconds = float(text) if text.isascii() else 0.0
    except ValueError:
        seconds = 0.0
    if not 1 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: need seconds from 1 to 86400")
    return seconds


def _serve(args: argparse.Namespace) -> int:
    # lazy: the gateway's runtime (aiohttp, numpy, web3); even its config costs ~8 % of start-up
    from node.gateway.config import GatewayConfig
    from node.gateway.run import serve
    from node.keys import PasswordSource

    if args.personal:
        return _serve_personal(args)
    if args.token_file is not None:
        raise UsageError(
            "--token-file is a personal client's",
            hint="a hosted gateway's callers pay with their own API keys; add --personal",
        )
    if args.route is not None:
        raise UsageError(
            "--route is a personal client's choice",
            hint="a hosted gateway chooses by cost for all its users; add --personal",
        )
    if args.relays is not None or args.overlay is not None or args.relays_refresh is not None:
        raise UsageError(
            "--relays, --overlay and --relays-refresh are a personal client's",
            hint="the overlay hides a user's address from nodes; a hosted gateway's address is "
            "no one's secret; add --personal",
        )
    if args.deployment is None or args.wallet is None or args.manifest is None:
        raise UsageError(
            "a hosted gateway needs --deployment, --wallet and --manifest",
            hint="or serve yourself with --personal (paying the nodes with your credits)",
        )
    if args.price_wei_per_token < 1:
        raise UsageError("--price-wei-per-token must be at least 1")
    # The same precedence and URL checks as every operator command: flags > env > config.toml.
    chains = resolve_config(
        {
            "evm_rpc": args.evm_rpc,
            "committee_rpc": args.committee_rpc,
            "password_file": args.password_file.resolve() if args.password_file else None,
            "refund_margin_s": args.refund_margin_s,
        }
    )
    config = GatewayConfig(
        evm_rpc=chains.evm_rpc,
        deployment=args.deployment,
        committee_rpc=chains.committee_rpc,
        manifest=args.manifest[0],
        more_manifests=tuple(args.manifest[1:]),
        wallet=args.wallet,
        price_wei_per_token=args.price_wei_per_token,
        host=args.host,
        port=args.port,
        receipts=args.receipts,
        max_sessions_per_node=args.max_sessions_per_node,
        attempts=args.failover_attempts,
        stall_s=args.stall_s,
        node_cooldown_s=args.node_cooldown_s,
        speculate=args.speculate,
        ring=bool(args.ring),
        wire_dtype=args.wire_dtype,
        report_min_questions=args.report_min_questions,
        report_max_wait_s=args.report_max_wait,
        refund_margin_s=chains.refund_margin_s,
        committee_block_s=args.committee_block_s,
        private_endpoints=args.private_endpoints,
        credits=args.credits_file,
        min_credit_positions=args.min_credit_positions,
        top_up_below=TOP_UP_BELOW if args.top_up_below is None else args.top_up_below,
        top_up=TOP_UP if args.top_up is None else args.top_up,
        validator_rpcs=_validator_rpcs(args.validator_rpc, chains.committee_rpc),
    ).validate()
    password = PasswordSource(file=chains.password_file).read(confirm=not args.wallet.exists())
    serve(config, password)
    return 0


def _serve_personal(args: argparse.Namespace) -> int:
    from node.client.nodesfile import planet_home
    from node.gateway.config import GatewayConfig
    from node.gateway.guards import GUARDS_FILE
    from node.gateway.personal import PersonalSettings, serve
    from node.gateway.personal_token import default_token_file

    for flag, value in (
        ("--top-up-below", args.top_up_below),
        ("--top-up", args.top_up),
        ("--validator-rpc", args.validator_rpc),
    ):
        if value is not None:
            raise UsageError(
                f"{flag} is a hosted gateway's: it buys its own credits as it runs low",
                hint="a personal client pays with the credits you buy: planet credits buy N",
            )
    if args.relays_refresh is not None and args.relays != CHAIN_RELAYS:
        raise UsageError(
            "--relays-refresh re-reads the committee's relays: a relays file is read once",
            hint="use --relays chain, or drop --relays-refresh",
        )
    # a relays file is read first: its mistakes need no chain to find
    relays = read_file_relays(args.relays, args.overlay)
    chains = resolve_config({"committee_rpc": args.committee_rpc})
    if args.relays == CHAIN_RELAYS:
        relays = chain_relays(chains.committee_rpc)
    overlay = None
    if relays is not None:
        overlay = overlay_route(
            relays,
            args.overlay,
            home=planet_home(),
            committee_rpc=chains.committee_rpc,
            credits_file=args.credits_file or planet_home() / "credits.json",
        )
    relay_refresh = None
    if overlay is not None and args.relays == CHAIN_RELAYS:
        from node.client.relay_refresh import DEFAULT_INTERVAL_S, RelayRefresh

        relay_refresh = RelayRefresh(overlay, interval_s=args.relays_refresh or DEFAULT_INTERVAL_S)
    manifests, private = _personal_devnet_defaults(args, chains.committee_rpc)
    config = GatewayConfig(
        evm_rpc="",  # no EVM: the nodes are paid with credits, not through an escrow
        deployment=Path(),
        committee_rpc=chains.committee_rpc,
        manifest=manifests[0],
        more_manifests=manifests[1:],
        wallet=Path(),
        host=args.host,
        port=args.port,
        max_sessions_per_node=args.max_sessions_per_node,
        attempts=args.failover_attempts,
        stall_s=args.stall_s,
        node_cooldown_s=args.node_cooldown_s,
        speculate=args.speculate,
        ring=ring_default(args.ring, relays=args.relays is not None, speculate=args.speculate),
        wire_dtype=args.wire_dtype,
        private_endpoints=private,
        min_credit_positions=args.min_credit_positions,  # checked with the rest: validate()
    ).validate()
    settings = PersonalSettings(
        overlay=overlay,
        relay_refresh=relay_refresh,
        credits_file=args.credits_file or planet_home() / "credits.json",
        min_credit_positions=args.min_credit_positions,
        route=args.route or "private",
        guards_file=planet_home() / GUARDS_FILE,
        token_file=default_token_file(args.token_file),
    )
    serve(config, settings)
    return 0


def _validator_rpcs(flags: list[str] | None, committee_rpc: str) -> tuple[str, ...]:
    """The validators a hosted gateway buys credits from: `--validator-rpc` (each checked), else
    the running devnet's when the committee RPC is one of them, else () (the committee RPC)."""
    from node.config import find_devnet, rpc_url

    if flags:
        return tuple(rpc_url(url, "--validator-rpc") for url in flags)
    devnet = find_devnet()
    if devnet is not None and committee_rpc in devnet.committee_rpc:
        return devnet.committee_rpc
    return ()


def _personal_devnet_defaults(
    args: argparse.Namespace, committee_rpc: str
) -> tuple[tuple[Path, ...], bool]:
    """The manifests and the private-endpoints rule of a personal client: the flags, else, when
    its committee is the running devnet's, that devnet's models (all it registers) and its
    loopback/private node addresses (a devnet registers nothing else). A committee of
    strangers keeps the public-only default."""
    from node.config import find_devnet

    devnet = find_devnet()
    ours = devnet is not None and committee_rpc in devnet.committee_rpc
    manifests: tuple[Path, ...] = tuple(args.manifest or ())
    if not manifests and ours and devnet is not None and devnet.manifest is not None:
        manifests = (devnet.manifest, *devnet.more_manifests)
    if not manifests:
        raise UsageError(
            "--personal needs --manifest (no running devnet whose model to use)",
            hint="the model's manifest.json, e.g. ~/.cache/planet/models/<model>/manifest.json "
            "(planet model prepare)",
        )
    return manifests, args.private_endpoints or ours
