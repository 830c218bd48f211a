"""`python -m node.agent`: the node agent process (started by `planet join`, stopped by
`planet leave` with SIGTERM, which makes it send `leave` before exiting).

    python -m node.agent --home H --manifest M --shard 0 --endpoint https://127.0.0.1:18100 \
        --committee-rpc http://127.0.0.1:27001 [--committee-rpc URL ...] [--capacity 64] \
        [--commit-dir H/run/served]

With `--rebalance` the agent also moves the node to another shard of its model when the pool
gains from it (node/agent/mover.py, rebalance.py; `planet join` passes it for auto placement):
it starts the new shard's compute node the way `planet join` did (`<home>/run/node_launch.json`).

Keys come from the operator home (`wallet.json`, `node_key.json`); the password from
`--password-file` or `$PLANET_PASSWORD` (never a prompt: the agent runs detached).
Logs go to stderr as key=value lines.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from dataclasses import replace
from pathlib import Path

import aiohttp

from node.agent import swap_memory
from node.agent.agent import AgentConfig, NodeAgent
from node.agent.commitments import Committer
from node.agent.credit_spools import ShardSpools
from node.agent.mover import Rebalancer
from node.agent.node_host import ProcessHost, read_launch
from node.agent.numerics_keeper import NumericsKeeper
from node.agent.pricing import PriceKeeper
from node.agent.rebalance import RebalancePolicy
from node.chain.committee_link import CommitteeLink
from node.keys import PasswordSource, load_node_key, load_wallet
from node.links import NodeKeyPin, link_ssl
from node.model.manifest import Manifest
from node.procs import exit_process, run_service
from protocol.committee.prices import MAX_PRICE_POSITIONS
from protocol.committee.registry import Rendezvous, sign_registration
from protocol.errors import UsageError
from protocol.spans import ShardSpan, parse_span_arg

log = logging.getLogger("node.agent")
AGENT_MARKER = "node.agent"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m node.agent", description=__doc__)
    parser.add_argument("--home", type=Path, required=True, help="operator home (keys)")
    parser.add_argument("--manifest", type=Path, required=True, help="the model manifest")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--shard", type=int, help="shard index served")
    which.add_argument(
        "--shards", metavar="A-B", help="shards A to B served as one hop (a span), e.g. 1-2"
    )
    parser.add_argument("--endpoint", required=True, help="the compute node's base URL")
    parser.add_argument("--capacity", type=int, default=64, help="max sessions (default 64)")
    parser.add_argument(
        "--rendezvous",
        nargs=2,
        action="append",
        default=[],
        metavar=("RELAY", "ENDPOINT"),
        help="a relay (its committee key) fronting the node behind NAT, and the node's "
        "address there: registered with the node (repeatable, up to 3)",
    )
    parser.add_argument(
        "--committee-rpc", action="append", required=True, help="validator RPC URL (repeatable)"
    )
    parser.add_argument("--password-file", type=Path, help="else $PLANET_PASSWORD")
    parser.add_argument(
        "--heartbeat-every", type=int, default=0, help="blocks between heartbeats (0: auto)"
    )
    parser.add_argument(
        "--commit-dir",
        type=Path,
        help="the compute node's --commit-dir: commit and reveal its served work from there",
    )
    parser.add_argument(
        "--credits-dir",
        type=Path,
        help="the base of the compute nodes' credit spools: the node serving shard K spools to "
        "DIR/shard-K (credits directly in DIR count as --shard's); each is redeemed on its "
        "shard, also after a move (node/agent/credit_spools.py)",
    )
    parser.add_argument(
        "--credit-positions",
        type=int,
        help="register this price on the committee chain: positions one credit buys on the "
        "shard (0: free); a change counts from the next epoch",
    )
    parser.add_argument(
        "--no-auto-numerics",
        dest="auto_numerics",
        action="store_false",
        default=None,
        help="do not announce this release's numerics when the registration announces others "
        "(set_numerics; default: announce, once the chain's cooldown allows; "
        "PLANET_AUTO_NUMERICS=0 also turns it off)",
    )
    parser.add_argument(
        "--rebalance",
        action="store_true",
        help="move to another shard of the model when the pool gains from it (rebalance.py)",
    )
    policy = RebalancePolicy()
    parser.add_argument(
        "--rebalance-every",
        type=int,
        default=policy.every_blocks,
        help=f"blocks between periodic looks at the pool (default {policy.every_blocks})",
    )
    parser.add_argument(
        "--rebalance-cooldown-s",
        type=float,
        default=policy.cooldown_s,
        help=f"at most one move in this many seconds (default {policy.cooldown_s:.0f})",
    )
    parser.add_argument(
        "--rebalance-jitter-s",
        type=float,
        default=policy.max_jitter_s,
        help="a move first waits a delay in [0, this) drawn from the node key "
        f"(default {policy.max_jitter_s:.0f})",
    )
    parser.add_argument(
        "--rebalance-drain-s",
        type=float,
        default=policy.drain_s,
        help=f"live sessions on the old shard may finish this long (default {policy.drain_s:.0f})",
    )
    parser.add_argument(
        "--rebalance-follow-margin-s",
        type=float,
        default=policy.follow_margin_s,
        help="a swap's partner follows within its remaining cooldown plus this, else the swap is "
        f"undone (default {policy.follow_margin_s:.0f}; node/agent/swap_memory.py)",
    )
    parser.add_argument(
        "--rebalance-swap-backoff-s",
        type=float,
        default=policy.swap_backoff_s,
        help="a partner that did not follow a swap is not chosen again for this long "
        f"(default {policy.swap_backoff_s:.0f})",
    )
    parser.add_argument("--log-level", default=os.environ.get("PLANET_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    if args.auto_numerics is None:
        env = os.environ.get("PLANET_AUTO_NUMERICS", "1")
        if env not in ("0", "1"):
            parser.error(f"PLANET_AUTO_NUMERICS must be 0 or 1, got {ascii(env)[:20]}")
        args.auto_numerics = env == "1"
    seconds = (
        args.rebalance_cooldown_s,
        args.rebalance_jitter_s,
        args.rebalance_drain_s,
        args.rebalance_follow_margin_s,
        args.rebalance_swap_backoff_s,
    )
    if args.rebalance_every < 1 or not all(0 <= s < float("inf") for s in seconds):
        parser.error("--rebalance-every must be >= 1 and the --rebalance-*-s values >= 0")
    if args.credit_positions is not None and not 0 <= args.credit_positions <= MAX_PRICE_POSITIONS:
        parser.error(f"--credit-positions must be 0 (free) … {MAX_PRICE_POSITIONS}")
    return args


async def _healthy(session: aiohttp.ClientSession, endpoint: str, pin: NodeKeyPin | bool) -> bool:
    try:
        async with asyncio.timeout(2.0), session.get(f"{endpoint}/health", ssl=pin) as answer:
            return answer.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def run(args: argparse.Namespace) -> int:
    password = PasswordSource(file=args.password_file, interactive=False).read()
    wallet = load_wallet(args.home / "wallet.json", password)
    node_key = load_node_key(args.home / "node_key.json", password)
    manifest = Manifest.load(args.manifest)
    span = (
        ShardSpan.one(args.shard)
        if args.shards is None
        else parse_span_arg(args.shards, shard_count=len(manifest.shards))
    )
    if span.size > 1 and args.rebalance:
        raise UsageError("a span is not rebalanced", hint="drop --rebalance with --shards")
    args.shard = span.first
    for shard in span:
        manifest.shard(shard)  # refuses an unknown shard index
    signer = node_key.verify_key.encode().hex()
    config = AgentConfig(
        evm_address=wallet.address,
        evm_signature=sign_registration(wallet.key, signer),
        model=manifest.model_hash,
        shards=span.shards,
        endpoint=args.endpoint.rstrip("/"),
        capacity=args.capacity,
        rendezvous=tuple(
            Rendezvous.from_json({"relay": relay, "endpoint": endpoint})
            for relay, endpoint in args.rendezvous
        ),
        heartbeat_every=args.heartbeat_every,
        rebalances=bool(args.rebalance),
    )
    # its own node: an https endpoint must prove this agent's node key (the one registered)
    pin = link_ssl(config.endpoint, signer, plaintext_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    link = CommitteeLink(args.committee_rpc, node_key)
    log.info(
        "agent starting node=%s address=%s model=%s shards=%s endpoint=%s",
        signer[:16],
        wallet.address,
        manifest.model_hash,
        span,
        config.endpoint,
    )
    async with aiohttp.ClientSession() as session:
        committer = Committer(args.commit_dir, link) if args.commit_dir is not None else None
        agent = NodeAgent(
            config,
            link,
            healthy=lambda: _healthy(session, config.endpoint, pin),
            committer=committer,
        )
        _serve_shard(agent, link, args, manifest.model_hash, args.shard)
        if span.size > 1:  # each shard of the span has its own price on the chain
            agent.pricer = _span_pricer(link, args, manifest.model_hash, span)
        if args.auto_numerics:
            agent.numerics = NumericsKeeper(agent, link)
        if args.rebalance:
            agent.rebalancer = _rebalancer(agent, link, args, manifest, signer, password)
        try:
            return await agent.run(stop)
        finally:
            await link.close()


def _serve_shard(
    agent: NodeAgent, link: CommitteeLink, args: argparse.Namespace, model: str, shard: int
) -> None:
    """The agent's price keeper and credit redeemer for `shard` (again after a move)."""
    agent.pricer = (
        None
        if args.credit_positions is None
        else PriceKeeper(link, model, shard, args.credit_positions)
    )
    if isinstance(agent.redeemer, ShardSpools):  # after a move: the old shard's spool stays
        agent.redeemer.shard = shard
    elif args.credits_dir is not None:
        agent.redeemer = ShardSpools(link, model, args.credits_dir, shard, legacy_shard=shard)


def _span_pricer(
    link: CommitteeLink, args: argparse.Namespace, model: str, span: ShardSpan
) -> SpanPrices | None:
    """A price keeper per shard of a span (a span is priced and redeemed per shard)."""
    if args.credit_positions is None:
        return None
    return SpanPrices([PriceKeeper(link, model, s, args.credit_positions) for s in span])


class SpanPrices:
    """The price keepers of a span's shards, stepped together."""

    def __init__(self, keepers: list[PriceKeeper]) -> None:
        self.keepers = keepers

    async def step(self) -> None:
        for keeper in self.keepers:
            await keeper.step()


def _rebalancer(
    agent: NodeAgent,
    link: CommitteeLink,
    args: argparse.Namespace,
    manifest: Manifest,
    signer: str,
    password: str,
) -> Rebalancer:
    run_dir = args.home / "run"
    host = ProcessHost(run_dir, read_launch(run_dir), signer, password, link)

    async def before_move() -> None:  # what the old shard earned, redeemed early (it stays
        # redeemable there after the move too: abci_app/left_shards.py)
        if agent.redeemer is not None:
            await agent.redeemer.step()

    async def on_moved(shard: int, endpoint: str) -> None:
        agent.config = replace(agent.config, shards=(shard,), endpoint=endpoint)
        _serve_shard(agent, link, args, manifest.model_hash, shard)

    return Rebalancer(
        key=signer,
        model=manifest.model_hash,
        shard_count=len(manifest.shards),
        link=link,
        host=host,
        chain=agent,
        policy=RebalancePolicy(
            every_blocks=args.rebalance_every,
            cooldown_s=args.rebalance_cooldown_s,
            max_jitter_s=args.rebalance_jitter_s,
            drain_s=args.rebalance_drain_s,
            follow_margin_s=args.rebalance_follow_margin_s,
            swap_backoff_s=args.rebalance_swap_backoff_s,
        ),
        before_move=before_move,
        on_moved=on_moved,
        memory_path=run_dir / swap_memory.FILE,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_service(lambda: run(args), log_level=args.log_level, log=log)


if __name__ == "__main__":
    exit_process(main)
