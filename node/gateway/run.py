"""Start-up of `planet gateway serve`: wallet, EVM chain, committee, client head, the credit
wallet that pays charging nodes (credit_payer.py) and its top-up task (topup.py), then serve.

Everything that can be wrong (deployment for another chain, an unreachable RPC, a missing
manifest, a model not registered on chain, an escrow whose refund timeout is shorter than the
settlement timeline needs: timeline.py) fails here, before the port is bound, with a
`PlanetError` and a hint. `/health` answers 200 once the app is serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from node.client.credit_wallet import CreditWallet
from node.client.paying import CreditExpiry, accepts_price
from node.dial import refuse_redirects
from node.gateway.app import Gateway, create_app
from node.gateway.binding import ensure_bound
from node.gateway.config import GatewayConfig
from node.gateway.credit_payer import HostedPayer
from node.gateway.escrow_reads import BoundedReads, ChainEscrow
from node.gateway.models import ModelInfo, routes_after_first, served_names
from node.gateway.payments import PaymentDesk
from node.gateway.router import CommitteeNodes, Router
from node.gateway.settlement import DebitTracker, WorkLedger, WorkReporter, ledger_paths
from node.gateway.timeline import Timeline, check_refund_timeout
from node.gateway.topup import CommitteeShop, TopUp
from node.http_logs import quiet_malformed_http_logs
from node.server.next_hops import PublicResolver
from protocol.eip712 import as_bytes32
from protocol.errors import ConfigError, PlanetError, UnavailableError
from protocol.payment import payment_domain

log = logging.getLogger(__name__)


def _open_chain(config: GatewayConfig, private_key: bytes) -> Any:
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment

    deployment = Deployment.load(config.deployment)
    return PlanetChain(deployment, private_key, rpc_url=config.evm_rpc)


async def build(config: GatewayConfig, password: str) -> tuple[Gateway, list[Any]]:
    """The Gateway and the resources to close at shutdown."""
    from node.chain.committee_rpc import CommitteeRpc
    from node.keys import load_or_create_wallet
    from node.model.head import ClientHead
    from node.model.manifest import Manifest
    from node.server.run import configure_torch_threads

    manifests = [Manifest.load(path) for path in config.manifests]
    infos = model_infos(config, manifests)
    config.wallet.parent.mkdir(parents=True, exist_ok=True)
    wallet = load_or_create_wallet(config.wallet, password)
    chain = await asyncio.to_thread(_open_chain, config, bytes(wallet.key))
    model_id = infos[0].model_id
    for info in infos:
        registered = await asyncio.to_thread(chain.registry.manifest_hash_of, info.model_id)
        if registered == bytes(32):
            log.warning(
                "model %s is not registered in ModelRegistry on chain %d; serving anyway",
                info.model_hash,
                chain.chain_id,
            )
    committee = CommitteeRpc(config.committee_rpc)
    try:
        params = await committee.abci_query("/params")
    except PlanetError as error:
        await committee.close()
        raise UnavailableError(
            f"the committee RPC {config.committee_rpc} does not answer: {error.message}",
            hint="start the committee (planet committee up) or pass --committee-rpc",
        ) from None
    configure_torch_threads(int(os.environ.get("PLANET_GATEWAY_THREADS", "1")))
    heads = [await asyncio.to_thread(ClientHead.load, path, "cpu") for path in config.manifests]
    escrow_reader = ChainEscrow(chain, wallet.address)
    timeline = Timeline(
        report_max_wait_s=config.report_max_wait_s,
        report_every_s=config.report_every_s,
        epoch_blocks=_epoch_blocks(params),
        block_time_s=config.committee_block_s,
        commit_margin_s=config.commit_margin_s,
        posting_margin_s=config.posting_margin_s,
    )
    refund_margin_s = _refund_margin(config, timeline)
    refund_timeout = await asyncio.to_thread(escrow_reader.refund_timeout)
    try:
        check_refund_timeout(refund_timeout, refund_margin_s, timeline)
    except PlanetError:
        await committee.close()
        raise
    http = node_session(config)
    prices: dict[str, int] = {}  # every model's nodes' prices, by endpoint: one payer reads them
    parties: dict[str, bytes] = {}  # and the parties their credits are assigned to
    routers = [
        committee_router(
            config, m, committee, http, config.min_credit_positions, prices=prices, parties=parties
        )
        for m in manifests
    ]
    credits = CreditWallet(config.credits_path)
    payer = HostedPayer(credits, prices, min_positions=config.min_credit_positions, parties=parties)
    expiry = CreditExpiry(credits, committee.abci_query)
    shop = CommitteeShop(config.credit_rpcs, bytes(wallet.key), credits)
    top_up = TopUp(
        credits, shop.buy, shop.finish, config.top_up_below, config.top_up, expiry=expiry
    )
    _log_credits(config, credits)  # a credit file that is not one stops the start here, by name
    escrow = chain.deployment.address("QueryEscrow")
    reads = BoundedReads(
        escrow_reader, max_concurrent=config.chain_reads, max_waiting=config.chain_read_queue
    )
    desk = PaymentDesk(
        reads,
        domain=payment_domain(chain.chain_id, escrow),
        gateway_address=wallet.address,
        gateway_key=bytes(wallet.key),
        model_id=model_id,
        more_model_ids=[info.model_id for info in infos[1:]],
        price_wei_per_token=config.price_wei_per_token,
        receipts_path=config.receipts_path,
        max_voucher_lifetime_s=config.max_voucher_lifetime_s,
        max_key_lifetime_s=config.max_key_lifetime_s,
        min_authorization_lifetime_s=timeline.min_authorization_lifetime_s,
        refund_margin_s=refund_margin_s,
    )
    log.info(
        "payment timeline: vouchers and keys must live >= %d s after a question; deposits "
        "must stay unrefundable >= %d s (escrow refund timeout %d s); %s",
        timeline.min_authorization_lifetime_s,
        refund_margin_s,
        refund_timeout,
        timeline.describe(),
    )
    ledger = WorkLedger(
        min_questions=config.report_min_questions,
        max_wait_s=config.report_max_wait_s,
        journal=ledger_paths(config.receipts_path)[0],
        refused_path=ledger_paths(config.receipts_path)[1],
    )
    ledger.catch_up(desk.receipts_after(ledger.recorded_through))  # killed between the files
    gateway = Gateway(
        config=config,
        model=infos[0],
        head=heads[0],
        router=routers[0],
        more_models=routes_after_first(infos, heads, routers),
        desk=desk,
        committee=committee,
        http=http,
        chain_id=chain.chain_id,
        escrow=escrow,
        ledger=ledger,
        payer=payer,
        top_up=top_up,
    )
    return gateway, [http, committee]


def model_infos(config: GatewayConfig, manifests: Sequence[Any]) -> list[ModelInfo]:
    """Each served model's names (node/gateway/models.py `served_names`) and ids, in order."""
    names = served_names(
        [
            (m.model_id, m.model_hash, path)
            for m, path in zip(manifests, config.manifests, strict=True)
        ]
    )
    return [
        ModelInfo(
            served.name,
            m.model_hash,
            as_bytes32(m.model_hash, "model_hash"),
            len(m.shards),
            served.aliases,
        )
        for m, served in zip(manifests, names, strict=True)
    ]


def committee_router(
    config: GatewayConfig,
    manifest: Any,
    committee: Any,
    http: Any,
    min_credit_positions: int,
    **choice: Any,
) -> Router:
    """A gateway's router over the committee's routable nodes of `manifest`'s model: free
    nodes, and those charging a credit per `min_credit_positions` positions or more (paid from
    its credit wallet as the answer runs); a dearer node is never put in a circuit. `choice`:
    how a personal client draws each shard's node (`route`, `guards`: router.py)."""
    return Router(
        CommitteeNodes(committee, manifest.model_hash),
        model_hash=manifest.model_hash,
        shard_layers=[tuple(s.layers) for s in manifest.shards],
        http=http,
        refresh_s=config.routing_refresh_s,
        max_sessions_per_node=config.max_sessions_per_node,
        slot_wait_s=config.slot_wait_s,
        public_only=not config.private_endpoints,
        accept_price=accepts_price(min_credit_positions),
        cooldown_s=config.node_cooldown_s,
        **choice,
    )


def node_session(config: GatewayConfig) -> aiohttp.ClientSession:
    """The session the gateway dials nodes on (probes, circuits). Registered endpoints are
    strangers' choice: public addresses only unless `private_endpoints` (names resolve to
    global addresses only), and never a redirect's Location (router.py, node/dial.py)."""
    resolver = None if config.private_endpoints else PublicResolver()
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=300, resolver=resolver),
        timeout=aiohttp.ClientTimeout(total=config.node_timeout_s),
        skip_auto_headers=("User-Agent",),
        middlewares=(refuse_redirects,),
    )


def _epoch_blocks(params: Any) -> int:
    """The committee's epoch length in blocks (genesis `epoch_length` in `/params`)."""
    genesis = params.get("genesis") if isinstance(params, dict) else None
    length = genesis.get("epoch_length") if isinstance(genesis, dict) else None
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        return length
    raise UnavailableError(
        "the committee's /params names no epoch_length",
        hint="point --committee-rpc at a Planet committee validator",
    )


def _refund_margin(config: GatewayConfig, timeline: Timeline) -> int:
    """The configured margin, else the one the timeline derives (a smaller configured one is
    the operator's choice, logged)."""
    derived = timeline.refund_margin_s
    if config.refund_margin_s is None:
        return derived
    if config.refund_margin_s < derived:
        log.warning(
            "refund margin %d s is below the %d s the settlement timeline needs (%s): a "
            "deposit could be refunded before its charge lands",
            config.refund_margin_s,
            derived,
            timeline.describe(),
        )
    return config.refund_margin_s


def _log_credits(config: GatewayConfig, credits: CreditWallet) -> None:
    log.info(
        "paying charging nodes with credits file=%s held=%d in_flight=%d floor=%d positions; "
        "top-up: %s",
        credits.path,
        credits.count(),
        len(credits.pending()),
        config.min_credit_positions,
        f"buy {config.top_up} when fewer than {config.top_up_below} held, from "
        f"{len(config.credit_rpcs)} validator RPC(s)"
        if config.top_up
        else "off (--top-up 0)",
    )


def committee_key_path(config: GatewayConfig) -> Path:
    """The gateway's ed25519 committee key (signs `work_report` and its `gateway` binding), next
    to its wallet; bound on chain to the wallet's address at the first start (binding.py)."""
    return config.wallet.with_name("committee_key.json")


async def _work_reporter(
    config: GatewayConfig, ledger: WorkLedger, password: str, desk: PaymentDesk
) -> Any:
    from node.chain.committee_link import CommitteeLink
    from node.keys import load_or_create_node_key

    key = await asyncio.to_thread(load_or_create_node_key, committee_key_path(config), password)
    log.info("work reports signed by gateway key=%s", key.verify_key.encode().hex())
    link = CommitteeLink([config.committee_rpc], key)
    try:  # the chain pays this key's fees to the address it is bound to: bind it once
        if await ensure_bound(link, desk.signing_key, desk.gateway, await link.params()):
            print(  # the operator's one line about it (logs are off by default)
                f"gateway bound: committee key {link.signer} is now paid at {desk.gateway.lower()}"
                " (gateway tx): its users' fees are paid to this address",
                flush=True,
            )
    except PlanetError:
        await link.close()
        raise
    escrow = desk.escrow.inner.escrow  # BoundedReads → ChainEscrow → the QueryEscrow binding
    debits = DebitTracker(link, escrow, desk)  # prepaid charges a posted root covered
    return WorkReporter(ledger, link, every_s=config.report_every_s, debits=debits)


async def listen(runner: web.AppRunner, config: GatewayConfig) -> None:
    """Bind the app on config.host:port (ConfigError naming the port when it cannot)."""
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError as error:
        raise ConfigError(
            f"cannot listen on {config.host}:{config.port}: {error.strerror}",
            hint="pick another --port",
        ) from None


def serve(config: GatewayConfig, password: str) -> None:
    """Blocks until SIGINT/SIGTERM."""
    config.validate()
    quiet_malformed_http_logs()  # a stranger's unparseable request: one line, not a traceback
    asyncio.run(_serve(config, password))


async def _serve(config: GatewayConfig, password: str) -> None:
    gateway, resources = await build(config, password)
    # a client that hangs up cancels its handler at once: the nodes stop, and the question's
    # payment charges what the nodes did for it (payment_state.py)
    runner = web.AppRunner(create_app(gateway), access_log=None, handler_cancellation=True)
    await runner.setup()
    reporter, started = None, False
    try:
        if gateway.ledger is not None:  # bound on chain before it serves a paid question
            reporter = await _work_reporter(config, gateway.ledger, password, gateway.desk)
        await listen(runner, config)
        log.info(
            "gateway serving url=http://%s:%d models=%s gateway=%s price=%d",
            config.host,
            config.port,
            ",".join(gateway.models.names()),
            gateway.desk.gateway,
            config.price_wei_per_token,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        reporter_task = None
        if reporter is not None:
            reporter_task = asyncio.create_task(reporter.run(stop))
            started = True
        top_up_task = asyncio.create_task(gateway.top_up.run(stop)) if gateway.top_up else None
        await stop.wait()
        if top_up_task is not None:  # a purchase in flight is on disk: the next start ends it
            top_up_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await top_up_task
        if reporter_task is not None:
            await reporter_task
            try:  # what the last questions earned; the ledger file keeps whatever is left
                await asyncio.wait_for(reporter.flush(force=True), timeout=30)
            except Exception as error:  # the committee may be down too at shutdown
                log.warning("last work_report not sent (kept in the ledger file): %r", error)
            await reporter.link.close()
    finally:
        if reporter is not None and not started:  # stopped before serving (a port in use)
            await reporter.link.close()
        await runner.cleanup()
        for resource in resources:
            await resource.close()
