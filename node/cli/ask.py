"""`planet ask PROMPT`: run a prompt through the shard nodes of a nodes file, stream the answer.

The prompt goes through the circuit of the nodes file (node/client/circuit.py: this client →
node A → B → C → this client, the nodes forwarding to each other, one WebSocket per link). The
circuit is checked first over GET /info (model hash, shards, layers 0..total). A nodes file may
list several nodes for a shard: the cheapest serves (node/client/costs.py) and the others are
spares; a node that fails mid-answer is replaced and the answer goes on, same text
(node/client/failover.py).

`planet ask --pay PROMPT` asks a gateway instead and pays for the question from the CLI wallet:
a QueryEscrow deposit bound to that gateway (no other gateway can serve it), a signed payment
proof as the API key, the answer streamed through the OpenAI-shaped API, then the gateway's
signed receipt (see node/gateway/client.py).
`planet ask --voucher PROMPT` pays from the prepaid balance at that gateway (`planet balance
deposit`) instead: a signed voucher as the API key, no transaction.

`planet ask --relays chain|FILE PROMPT` reaches the nodes of the nodes file over the overlay, as
the personal client does (node/cli/overlay_args.py: the same flags, the same `OverlayRoute`):
every circuit link and every /info and health read rides n relay paths as S-IDA cloves, so no
node is reached from this machine's address (issue 43). With `--credits` the relays are paid
from the same credit file for the clove bytes that arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from node.cli.overlay_args import (
    CHAIN_RELAYS,
    add_overlay_arguments,
    chain_relays,
    overlay_route,
    read_file_relays,
    ring_default,
)
from node.client.credit_sizes import MIN_POSITIONS as DEFAULT_MIN_POSITIONS
from node.client.nodesfile import NodesFile, default_nodes_path, planet_home
from node.config import find_devnet, resolve_config
from node.model.manifest import Manifest
from protocol.errors import UsageError
from protocol.frames.dtypes import WIRE_DTYPE, WIRE_DTYPE_HELP, WIRE_DTYPES

EXAMPLES = """\
examples:
  planet ask "What is the capital of France?"
  planet ask "Write a haiku about rivers" --temperature 0.8 --top-p 0.9 --seed 7
  planet ask "Hello" --nodes my-nodes.json --max-tokens 32 --json
  planet ask --pay "What is the capital of France?"       (defaults from planet devnet up)
  planet ask --voucher "Hello"      (pays from `planet balance deposit`: no transaction)
  planet ask "Hello" --credits --relays relays.txt   (no node sees your address; see below)
  planet ask --pay "Hi" --gateway http://127.0.0.1:8000 --deployment deployment.json \\
      --evm-rpc http://127.0.0.1:8545 --wallet ~/.cache/planet/wallet.json
note: nodes see the activations of your prompt and could read it back; they never see who
asked (no account, wallet or query id is sent with the activations). Asked directly, every node
sees your IP address; with --relays they see only exit relays (docs/privacy.md, docs/overlay.md).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ask",
        help="ask a question through the running shard nodes",
        description="Ask a question through the shard nodes listed in a nodes file "
        "(default: the one `planet local up` wrote). Greedy unless --temperature is given.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("prompt", help="the question (one user turn, chat template applied)")
    parser.add_argument(
        "--nodes",
        type=Path,
        default=None,
        help="nodes file (default: $PLANET_HOME/local/nodes.json)",
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens at most (128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    parser.add_argument("--seed", type=int, default=None, help="seed for sampling")
    parser.add_argument(
        "--compress",
        action="store_true",
        help="compress activations on the wire (hq9: ~30 %% of fp32 bytes; lossy, see docs)",
    )
    parser.add_argument(
        "--wire-dtype", choices=WIRE_DTYPES, default=WIRE_DTYPE, help=WIRE_DTYPE_HELP
    )
    parser.add_argument(
        "--speculate",
        type=int,
        nargs="?",
        const=16,
        default=0,
        metavar="K",
        help="guess up to K next tokens from the text so far (prompt lookup, default K 16: "
        "drafts start at 8 and grow while every guess is kept) and "
        "check them in one pass through the circuit: fewer round trips over slow links; greedy "
        "tokens are plain decoding's, sampled ones follow the same distribution (docs/compute.md)",
    )
    parser.add_argument(
        "--ring",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the circuit's first node run the decode loop (its copy of the model's public "
        "head chooses each token; this client checks every one and pays as they come): no "
        "round trip to you per token, which over --relays is most of a token's time; the first "
        "node learns the generated token ids it already sees as embeddings (docs/overlay.md). "
        "Used where every node of the circuit offers it. Default: on with --relays (unless "
        "--speculate), off without; --no-ring keeps the loop here",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (text, tokens, timings, circuit, speculation)",
    )
    parser.add_argument(
        "--plaintext-links",
        action="store_true",
        help="local mode: dial http:// nodes off loopback too (unencrypted; a network you own); "
        "https:// nodes are always pinned to the node key the nodes file gives",
    )
    parser.add_argument(
        "--credits",
        action="store_true",
        help="pay the nodes that charge with bearer credits from your credit file as the answer "
        "runs: a credit per chunk of positions per node, nothing that names you (buy them with "
        "`planet credits buy N`). Only a price it can check is paid: the one the node registered "
        "on the committee chain (--committee-rpc), or, with no chain, its /info price only under "
        "an explicit --min-credit-positions; a charging node with neither stops the question "
        "(price_unregistered)",
    )
    parser.add_argument(
        "--committee-rpc",
        default=None,
        metavar="URL",
        help="with --credits: read each node's price from this committee (`/nodes`), never from "
        "its /info alone (default: the nodes file's `committee_rpc`, if any)",
    )
    parser.add_argument(
        "--min-credit-positions",
        type=int,
        default=None,
        metavar="N",
        help="with --credits: never pay a node that asks a credit per fewer than N positions "
        f"(default {DEFAULT_MIN_POSITIONS}). Given explicitly with no committee, it is also "
        "your consent to pay the price a node's /info states, which nothing else checks: at "
        "most a credit per N positions",
    )
    parser.add_argument(
        "--credits-file",
        type=Path,
        default=None,
        help="credits to pay with (default $PLANET_HOME/credits.json, as `planet credits`)",
    )
    relays = parser.add_argument_group(
        "reaching the nodes through relays (--relays)",
        "as `planet gateway serve --personal --relays`: the question, the answer and every /info\n"
        "read of the nodes of the nodes file travel as S-IDA cloves over relay paths, so no node\n"
        "sees your IP address (a relay sees only its neighbours); with --credits the relays are\n"
        "paid from your credit file. With --pay or --voucher a hosted gateway asks the nodes for\n"
        "you: they see the gateway, never you, but the gateway sees your address, your wallet\n"
        "and your prompt, and relays cannot hide them from it, so --relays is refused there (ask\n"
        "the nodes directly, or run your own `planet gateway serve --personal --relays`).",
    )
    add_overlay_arguments(relays, refreshed=" once, at start")
    paying = parser.add_argument_group("paying a gateway (--pay)")
    paying.add_argument(
        "--pay", action="store_true", help="ask a gateway, paying from your wallet (QueryEscrow)"
    )
    paying.add_argument(
        "--voucher",
        action="store_true",
        help="ask a gateway, paying by a signed voucher from your prepaid balance (no gas)",
    )
    paying.add_argument(
        "--voucher-ttl",
        type=int,
        default=600,
        help="seconds the voucher stays valid (default 600); a gateway refuses one that expires "
        "before it can report the charge (voucher_expiring: under 185 s on a default gateway)",
    )
    paying.add_argument("--gateway", default=None, help="gateway URL (default: the devnet's)")
    paying.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="the model to ask, as the gateway's /v1/models names it (its id, an alias or its "
        "model hash; default: the gateway's first model); the payment is signed for it",
    )
    paying.add_argument(
        "--wallet",
        type=Path,
        default=None,
        help="your keystore (default $PLANET_HOME/wallet.json, else the devnet's user wallet)",
    )
    paying.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="wallet password file (else $PLANET_PASSWORD)",
    )
    paying.add_argument("--evm-rpc", default=None, help="EVM RPC URL (default: the devnet's)")
    paying.add_argument(
        "--deployment", type=Path, default=None, help="contract deployment JSON (default: devnet's)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from node.client.sampling import SamplingConfig  # lazy: numpy
    from node.client.speculation import MAX_LOOKAHEAD

    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    if not args.prompt.strip():
        raise UsageError("the prompt is empty")
    sampling = SamplingConfig(args.temperature, args.top_p, args.seed).validate()
    if args.pay and args.voucher:
        raise UsageError("--pay and --voucher are two ways to pay; pick one")
    if not 1 <= args.voucher_ttl <= 86_400:
        raise UsageError("--voucher-ttl must be 1 … 86400 seconds")
    if not 0 <= args.speculate <= MAX_LOOKAHEAD:
        raise UsageError(f"--speculate takes 1 … {MAX_LOOKAHEAD} guesses per pass")
    if args.min_credit_positions is not None and args.min_credit_positions < 1:
        raise UsageError("--min-credit-positions must be >= 1")
    if args.credits and (args.pay or args.voucher):
        raise UsageError(
            "--credits pays the nodes you ask directly; --pay and --voucher pay a gateway",
            hint="pick one way to pay",
        )
    if args.ring and (args.speculate or args.pay or args.voucher):
        raise UsageError(
            "--ring is for the nodes you ask directly, one token a pass",
            hint="drop --speculate, --pay or --voucher, or drop --ring",
        )
    if args.speculate and (args.pay or args.voucher):
        raise UsageError(
            "--speculate is for the nodes you ask directly; a gateway decodes for you",
            hint="drop --speculate, or ask the nodes of a nodes file (without --pay/--voucher)",
        )
    if args.model is not None and not (args.pay or args.voucher):
        raise UsageError(
            "--model picks a gateway's model: add --pay or --voucher",
            hint="asked directly, the nodes are those of the nodes file, which names the model",
        )
    if (args.relays is not None or args.overlay is not None) and (args.pay or args.voucher):
        raise UsageError(
            "--relays reaches the nodes of a nodes file; with --pay or --voucher a hosted "
            "gateway asks the nodes for you",
            hint="the gateway sees your address, wallet and prompt whatever relays do: ask the "
            "nodes directly (--credits --relays), or through your own personal client "
            "(`planet gateway serve --personal --relays`)",
        )
    if args.relays is not None and args.plaintext_links:
        raise UsageError(
            "--plaintext-links is for direct links; with --relays the exit relays dial the nodes",
            hint="drop one of them",
        )
    if args.pay or args.voucher:
        result = asyncio.run(_ask_paid(args, _pay_defaults(args)))
        if args.json:
            print(json.dumps(result, ensure_ascii=False))
        return 0
    # Before torch loads: our idle OpenMP threads sleep instead of spinning on the cores the
    # nodes need while they compute (same setting the local nodes get).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    relays = read_file_relays(args.relays, args.overlay)  # its mistakes before anything else
    nodes = NodesFile.load(args.nodes or default_nodes_path())
    if not nodes.manifest.is_file():
        raise UsageError(
            f"the nodes file names a manifest that does not exist: {nodes.manifest}",
            hint="run `planet local up` again",
        )
    route = _overlay_route(args, nodes, relays)
    result = asyncio.run(_ask(args, nodes, sampling, route))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    return 0


def _overlay_route(args: argparse.Namespace, nodes: Any, relays: Any) -> Any:
    """The personal client's `OverlayRoute` (node/cli/overlay_args.py) for --relays, else
    None: the relays of the file or of the committee (`chain`: --committee-rpc, the nodes
    file's, else the operator config's), paid with --credits from the same credit file."""
    committee = args.committee_rpc or nodes.committee_rpc
    if args.relays == CHAIN_RELAYS:
        committee = committee or resolve_config({}).committee_rpc
        relays = chain_relays(committee)
    if relays is None:
        return None
    credits_file = (args.credits_file or planet_home() / "credits.json") if args.credits else None
    return overlay_route(
        relays, args.overlay, home=planet_home(), committee_rpc=committee, credits_file=credits_file
    )


async def _ask(
    args: argparse.Namespace, nodes: Any, sampling: Any, route: Any = None
) -> dict[str, Any]:
    # lazy: aiohttp and numpy (the client, its head and the wire codecs)
    import aiohttp

    from node.client.chain_prices import read_chain_prices
    from node.client.failover import FailoverPolicy, generate
    from node.client.info import check_circuit
    from node.client.replicas import ReplicaCircuits
    from node.client.speculation import SpeculationConfig, SpeculationStats
    from node.client.types import Hop, Timings
    from node.model.head import ClientHead
    from node.server.run import configure_torch_threads
    from protocol.frames.codecs import COMPRESSED_CODEC

    manifest = Manifest.load(nodes.manifest)
    configure_torch_threads(0)
    head = ClientHead.load(nodes.manifest, device="cpu")
    prompt_ids = head.chat_ids([{"role": "user", "content": args.prompt}])
    hops = [Hop(url=n.url, shard=n.shard, key=n.key, last=n.last) for n in nodes.nodes]
    plaintext = bool(args.plaintext_links)
    timings = Timings()
    speculation = SpeculationConfig(lookahead=args.speculate) if args.speculate else None
    stats = SpeculationStats()
    tokens: list[int] = []
    printed = ""
    codec = COMPRESSED_CODEC if args.compress else "raw"
    expected = {s.shard_id: (manifest.model_hash, s.layers) for s in manifest.shards}
    async with aiohttp.ClientSession(skip_auto_headers=("User-Agent",)) as http:
        overlay = reader = None
        if route is not None:  # every link and /info read over relay paths (issue 43)
            from node.gateway.node_info import OverlayHopReader

            overlay, reader = route.dialer(http), OverlayHopReader(route, http)
        checked: list[dict[str, Any]] = []
        started, read_s = time.perf_counter(), 0.0
        if len({hop.shard for hop in hops}) == len(hops):  # one node a shard: check it first
            checked = await check_circuit(
                http,
                hops,
                manifest.model_hash,
                manifest.total_layers,
                plaintext_links=plaintext,
                reader=reader,
            )
            read_s = time.perf_counter() - started
        # more than one node for a shard: the cheapest serves, the others are spares
        # (node/client/replicas.py); a node that fails mid-answer is replaced by a spare
        credits = _credit_wallet(args)
        committee = args.committee_rpc or nodes.committee_rpc
        chain_prices = None
        if credits is not None and committee:
            chain_prices = await read_chain_prices(committee, manifest.model_hash, hops)
        source = ReplicaCircuits(
            http,
            hops,
            expected=expected,
            hidden_size=manifest.hidden_size,
            codec=codec,
            dtype=args.wire_dtype,
            plaintext_links=plaintext,
            credits=credits,
            min_credit_positions=args.min_credit_positions or DEFAULT_MIN_POSITIONS,
            chain_prices=chain_prices,
            info_prices=args.min_credit_positions is not None,
            prompt=prompt_ids,
            overlay=overlay,
            reader=reader,
        )
        for hop, info in zip(hops, checked, strict=False):  # read once (a link each, relayed)
            source.take_info(hop, info, read_s)
        async for token in generate(
            source,
            head,
            prompt_ids,
            max_new_tokens=args.max_tokens,
            sampling=sampling,
            timings=timings,
            policy=FailoverPolicy(),
            speculation=speculation,
            stats=stats,
            ring=ring_default(args.ring, relays=args.relays is not None, speculate=args.speculate),
        ):
            tokens.append(token)
            if not args.json:
                text = head.decode(tokens)
                # print only what is new and stable (a partial UTF-8 sequence decodes to U+FFFD)
                if text.startswith(printed) and not text.endswith("\ufffd"):
                    sys.stdout.write(text[len(printed) :])
                    sys.stdout.flush()
                    printed = text
    text = head.decode(tokens)
    purse = None if route is None else route.purse
    relay_spent = None if purse is None else sum(purse.paid.values())
    if not args.json:
        sys.stdout.write((text[len(printed) :] if text.startswith(printed) else "") + "\n")
        sys.stdout.flush()
        if source.payer is not None:
            relayed = "" if relay_spent is None else f" and {relay_spent} to the relays"
            print(
                f"paid {source.payer.spent} credits to the nodes{relayed}; "
                f"{source.payer.wallet.count()} left in {source.payer.wallet.path}",
                file=sys.stderr,
            )
    final = source.current or ()
    return {
        "text": text,
        "tokens": tokens,
        "timings": timings.to_json(),
        "circuit": [
            {
                "url": hop.url,
                "shards": list(hop.span.shards),
                "shard": hop.shard,
                "layers": [expected[hop.shard][1][0], expected[hop.span.last][1][1]],
            }
            for hop in final
        ],
        "model": manifest.model_id,
        "codec": codec,
        "wire_dtype": args.wire_dtype if codec == "raw" else None,
        "speculation": {"lookahead": args.speculate, **stats.to_json()} if speculation else None,
        "credits_spent": None if source.payer is None else source.payer.spent,
        "relays": None
        if route is None
        else {
            "paths": route.paths,
            "needed": route.needed,
            "length": route.length,
            "credits_spent": relay_spent,
        },
    }


def _credit_wallet(args: argparse.Namespace) -> Any:
    """The credit file `--credits` pays from (None without --credits); a missing or empty one
    is a usage error before anything is dialled."""
    if not args.credits:
        return None
    from node.client.credit_wallet import CreditWallet

    path = args.credits_file or planet_home() / "credits.json"
    wallet = CreditWallet(path)
    if not path.is_file() or wallet.count() == 0:
        raise UsageError(
            f"no credits to pay with in {path}",
            hint="buy some with `planet credits buy N` (a running devnet: `planet devnet up`)",
        )
    return wallet


# --- paying a gateway ---------------------------------------------------------------------------


def _pay_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """Gateway URL, EVM RPC, deployment and wallet: flags, else the running devnet (the rule
    of every command, `node.config.find_devnet`), else defaults."""
    devnet = find_devnet()
    deployment = args.deployment or (devnet.deployment if devnet else None)
    gateway = args.gateway or (devnet.gateway_url if devnet else None) or "http://127.0.0.1:8000"
    if deployment is None:
        raise UsageError(
            "--pay needs the contract deployment file",
            hint="pass --deployment FILE, or start a devnet with `planet devnet up`",
        )
    accounts = [dict(a) for a in devnet.accounts] if devnet else []
    wallet, password_file = args.wallet, args.password_file
    if wallet is None:
        wallet = planet_home() / "wallet.json"
        users = [a for a in accounts if a.get("name") == "user" and a.get("keystore")]
        if not wallet.exists() and users:  # the devnet's funded user wallet
            wallet = Path(users[0]["keystore"])
            if password_file is None and "PLANET_PASSWORD" not in os.environ and devnet:
                password_file = devnet.password_file
    return {
        "gateway": str(gateway).rstrip("/"),
        "evm_rpc": args.evm_rpc or (devnet.evm_rpc if devnet else None) or "http://127.0.0.1:8545",
        "deployment": Path(deployment),
        "wallet": Path(wallet),
        "password_file": Path(password_file) if password_file else None,
        "accounts": accounts,
    }


def _open_wallet(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    from node.keys import PasswordSource, load_wallet  # lazy: eth-account

    wallet = settings["wallet"]
    if not wallet.exists():
        known = [a.get("keystore") for a in settings["accounts"] if isinstance(a, dict)]
        hint = "create one with a funded key, or pass --wallet FILE"
        if any(known):
            hint = f"the devnet funded these keystores: {', '.join(map(str, filter(None, known)))}"
        raise UsageError(f"no wallet at {wallet}", hint=hint)
    return load_wallet(wallet, PasswordSource(file=settings["password_file"]).read())


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _ask_paid(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    # lazy: aiohttp and the web3 stack
    import aiohttp

    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.gateway import client as gw

    gateway = settings["gateway"]
    if not settings["deployment"].exists():
        raise UsageError(f"no deployment file at {settings['deployment']}")
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        pool = await gw.fetch_pool(http, gateway, args.model)
        account = _open_wallet(args, settings)
        deployment = Deployment.load(settings["deployment"])
        chain = await asyncio.to_thread(
            PlanetChain, deployment, bytes(account.key), rpc_url=settings["evm_rpc"]
        )
        gw.check_chain(pool, chain.chain_id, deployment.address("QueryEscrow"))
        quote = gw.quote(pool, args.prompt, args.max_tokens)
        model_id = bytes.fromhex(str(pool["model_id"])[2:])
        query_id = gw.new_query_id()
        if args.voucher:
            key = await _voucher_key(
                args, gateway, pool, chain, quote, query_id, bytes(account.key)
            )
        else:
            key = await _deposit_key(pool, chain, quote, query_id, model_id, account)
        body = {
            "model": pool["model"],
            "messages": [{"role": "user", "content": args.prompt}],
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "stream_options": {"include_usage": True},
        }
        if args.seed is not None:
            body["seed"] = args.seed
        text, receipt = "", None
        async for chunk in gw.stream_chat(http, gateway, key, body):
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                text += piece
                if piece and not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            receipt = chunk.get("planet_receipt") or receipt
        if not args.json:
            sys.stdout.write("\n")
            sys.stdout.flush()
    if receipt is None:
        raise UsageError("the gateway sent no receipt", hint="ask the gateway operator")
    checked = gw.check_receipt(pool, receipt, query_id)
    paid = "allowed by the voucher" if args.voucher else "deposited"
    _say(
        f"receipt: {checked.prompt_tokens} prompt + {checked.completion_tokens} completion tokens, "
        f"fee {checked.fee} wei of {quote.amount} {paid}, circuit of {len(receipt['nodes'])} "
        f"nodes, signed by gateway {pool['gateway']} (verified)"
    )
    return {
        "text": text,
        "query_id": "0x" + query_id.hex(),
        ("voucher_cap_wei" if args.voucher else "deposit_wei"): str(quote.amount),
        "receipt": receipt,
    }


async def _deposit_key(
    pool: dict[str, Any], chain: Any, quote: Any, query_id: bytes, model_id: bytes, account: Any
) -> str:
    """Per-query path: deposit the quote into QueryEscrow, sign the payment proof."""
    # lazy: the web3 stack
    from node.chain.evm.errors import InsufficientFunds
    from node.gateway import client as gw

    balance = await asyncio.to_thread(chain.balance)
    _say(
        f"price {quote.price} wei/token × (≤ {quote.prompt_bound} prompt + "
        f"{quote.max_tokens} max tokens) = deposit {quote.amount} wei "
        f"({quote.amount / 10**18:.6f} ETH) from {account.address}; unused wei stay refundable"
    )
    if balance < quote.amount:
        raise InsufficientFunds(
            f"{account.address} holds {balance} wei, the deposit needs {quote.amount} wei",
            hint="fund the wallet, or ask with a smaller --max-tokens",
        )
    tx = await asyncio.to_thread(
        chain.escrow.deposit, query_id, model_id, pool["gateway"], quote.amount
    )
    _say(
        f"deposited: query 0x{query_id.hex()} for gateway {pool['gateway']} "
        f"(tx {tx.tx_hash}, gas fee {tx.fee_wei} wei)"
    )
    return gw.api_key_for(pool, query_id, quote.amount, bytes(account.key))


async def _voucher_key(
    args: argparse.Namespace,
    gateway_url: str,
    pool: dict[str, Any],
    chain: Any,
    quote: Any,
    query_id: bytes,
    private_key: bytes,
) -> str:
    """Prepaid path: check the balance at this gateway, sign a voucher capped at the quote (no
    transaction)."""
    from protocol.payment import Voucher, payment_domain, sign_voucher  # lazy: eth-abi

    state = await asyncio.to_thread(chain.escrow.prepaid_of, chain.address, pool["gateway"])
    at = f"--gateway {gateway_url}"
    if state["withdrawable_at"]:
        raise UsageError(
            f"your prepaid balance at gateway {pool['gateway']} is being withdrawn; it refuses "
            "its vouchers",
            hint=f"planet balance withdraw --cancel {at}, or ask with --pay",
        )
    if state["balance"] < quote.amount:
        raise UsageError(
            f"your prepaid balance at gateway {pool['gateway']} is {state['balance']} wei, this "
            f"question may cost up to {quote.amount} wei (a balance pays one gateway only)",
            hint=f"planet balance deposit 0.01 {at} (or a smaller --max-tokens)",
        )
    domain = payment_domain(int(pool["chain_id"]), pool["escrow"])
    expiry = int(time.time()) + args.voucher_ttl
    model_id = bytes.fromhex(str(pool["model_id"])[2:])
    voucher = Voucher(pool["gateway"], query_id, model_id, quote.amount, expiry, pool["escrow"])
    _say(
        f"voucher: up to {quote.amount} wei from the prepaid balance of {chain.address} "
        f"({state['balance']} wei), query 0x{query_id.hex()}, valid {args.voucher_ttl} s"
    )
    return sign_voucher(private_key, voucher, domain)
