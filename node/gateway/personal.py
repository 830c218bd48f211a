"""The personal client: `planet gateway serve --personal` — OpenAI's API on 127.0.0.1 for the
user's own tools, the nodes paid with the user's own bearer credits (issue 28).

The same app as the hosted gateway (node/gateway/app.py: request parsing, streaming, failover,
the router over the committee's directory of routable nodes), with two parts swapped:

- **No payer at the door, but a lock.** `PersonalDesk` charges nothing and asks for no payment
  key: the user is the only caller, and what a question costs is paid to the nodes directly.
  The server binds loopback only (`--host` must be a loopback address), and every request must
  carry the client's bearer token (drawn at the first start, kept in a 0600 file:
  personal_token.py), name this client in its Host, and come from no foreign web Origin
  (personal_guard.py): a web page the user visits cannot spend the user's credits.
- **The nodes are paid as the answer runs** (node/client/paying.py): each circuit client pays
  every charging node of its circuit one credit per chunk of positions, from the user's credit
  file (`planet credits buy`), at the price each node registered on the committee chain
  (its `/info` checked against it: node/gateway/router.py), never dearer than
  `--min-credit-positions`. Each answer's `planet_receipt` says how many credits the client had
  spent by then and how many are left.

No work report, no receipt signed by a gateway wallet, no EVM chain: the committee RPC (the
node directory) and the model's manifest are all it needs. See docs/privacy.md for what it
hides (the hosted gateway's view of every prompt and payer) and what it does not (nodes see the
user's IP address; timing).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from node.client.credit_wallet import CreditWallet, retired_note
from node.client.paying import CreditExpiry, CreditPayer
from node.gateway.app import Gateway, create_app
from node.gateway.config import GatewayConfig
from node.gateway.guards import Guards
from node.gateway.models import routes_after_first
from node.gateway.node_info import OverlayInfo
from node.gateway.personal_guard import personal_guard
from node.gateway.personal_token import default_token_file, load_or_create
from node.gateway.run import committee_router, listen, model_infos, node_session
from node.http_logs import quiet_malformed_http_logs
from protocol.errors import ConfigError, PlanetError, UnavailableError
from protocol.links import is_loopback_host

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PersonalReservation:
    """A question of the user's own: nothing held, a fresh id for the logs."""

    query_id: bytes
    ticket: int
    prepaid: bool = False

    @property
    def query_hex(self) -> str:
        return "0x" + self.query_id.hex()


class PersonalDesk:
    """The hosted gateway's payment desk, for one user who pays the nodes with credits."""

    gateway = "personal"
    price = 0

    def __init__(self, payer: CreditPayer, expiry: CreditExpiry | None = None) -> None:
        self.payer = payer
        self.expiry = expiry
        self._open: dict[int, PersonalReservation] = {}
        self._tickets = itertools.count(1)
        self._numbers: dict[bytes, int] = {}

    @property
    def domain(self) -> Any:
        raise UnavailableError("a personal client takes no payments: it pays the nodes itself")

    def required_wei(self, prompt_tokens: int, max_tokens: int) -> int:
        return 0

    async def reserve(
        self, proof: Any, required: int, model_id: bytes | None = None
    ) -> PersonalReservation:
        if self.expiry is not None:  # never pay with a credit the chain no longer redeems
            await self.expiry.check_quietly()
        reservation = PersonalReservation(secrets.token_bytes(32), next(self._tickets))
        self._open[reservation.ticket] = reservation
        return reservation

    def release(self, reservation: PersonalReservation) -> bool:
        return self._open.pop(reservation.ticket, None) is not None

    def settle(
        self,
        reservation: PersonalReservation,
        prompt_tokens: int,
        completion_tokens: int,
        keys: tuple[str, ...],
    ) -> dict[str, Any]:
        self._open.pop(reservation.ticket, None)
        self._numbers[reservation.query_id] = len(self._numbers) + 1
        return {
            "paid_with": "credits",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "credits_spent": self.payer.spent,
            "credits_left": self.payer.wallet.count(),
            # the circuit (then any node of a circuit it left), for the user's own tools: a
            # verifier attributes its challenges by it (node/verifier/asker.py PersonalAsker)
            "nodes": list(keys),
        }

    def receipt_number(self, query_id: bytes) -> int:
        return self._numbers[query_id]

    def in_flight(self) -> tuple[int, int]:
        return len(self._open), 0

    def receipt_for(self, proof: Any, query_id: bytes) -> Any:
        raise UnavailableError("a personal client signs no receipts")

    def key_status(self, proof: Any) -> Any:
        raise UnavailableError("a personal client takes no payment keys")

    async def revoke(self, key_id: bytes, signature: bytes) -> Any:
        raise UnavailableError("a personal client takes no payment keys")


@dataclass(frozen=True, slots=True)
class PersonalSettings:
    credits_file: Path  # the user's credits (`planet credits buy`)
    min_credit_positions: int  # never pay a node a credit per fewer positions
    route: str = "private"  # how each shard's node is chosen (node/gateway/guards.py ROUTES)
    guards_file: Path | None = None  # route="private": where the guards are kept (None: memory)
    # the bearer token every request must carry (personal_token.py; drawn there if absent)
    token_file: Path | None = None  # None: <PLANET_HOME>/personal-token
    # reach every node through relay paths (node/client/overlay.py `OverlayRoute`); None: direct
    overlay: Any = None
    # --relays chain: re-reads /relays into `overlay` (node/client/relay_refresh.py); None: never
    relay_refresh: Any = None


async def build(config: GatewayConfig, settings: PersonalSettings) -> tuple[Gateway, list[Any]]:
    """The personal Gateway and the resources to close at shutdown."""
    credits_file, min_credit_positions = settings.credits_file, settings.min_credit_positions
    from node.chain.committee_rpc import CommitteeRpc
    from node.model.head import ClientHead
    from node.model.manifest import Manifest
    from node.server.run import configure_torch_threads

    manifests = [Manifest.load(path) for path in config.manifests]
    infos = model_infos(config, manifests)
    wallet = CreditWallet(credits_file)
    retired = wallet.retired() if credits_file.is_file() else 0
    old = f" ({retired_note(retired)})" if retired else ""
    if not credits_file.is_file() or wallet.count() == 0:
        raise ConfigError(
            f"no credits to pay the nodes with in {credits_file}{old}",
            hint="buy some with `planet credits buy N`",
        )
    if retired:
        log.warning("%s: %s", credits_file, retired_note(retired))
    committee = CommitteeRpc(config.committee_rpc)
    expiry = CreditExpiry(wallet, committee.abci_query)
    try:
        await committee.abci_query("/params")
        expired = await expiry.check()
    except PlanetError as error:
        await committee.close()
        raise UnavailableError(
            f"the committee RPC {config.committee_rpc} does not answer: {error.message}",
            hint="pass --committee-rpc (a validator of the network you pay)",
        ) from None
    if wallet.count() == 0:
        await committee.close()
        raise ConfigError(
            f"the {expired} credits in {credits_file} are past their epochs: no node takes them",
            hint="buy fresh ones with `planet credits buy N`",
        )
    configure_torch_threads(int(os.environ.get("PLANET_GATEWAY_THREADS", "1")))
    heads = [await asyncio.to_thread(ClientHead.load, path, "cpu") for path in config.manifests]
    http = node_session(config)
    prices: dict[str, int] = {}  # every model's nodes' prices, by endpoint: one payer reads them
    parties: dict[str, bytes] = {}  # and the parties their credits are assigned to
    guards = Guards(settings.guards_file, manifests[0].model_hash)  # one file, every model
    # with relays, the routers read nodes' /info and health over them too (issue 43): no
    # request of this client reaches a node from the user's address
    info = None if settings.overlay is None else OverlayInfo(settings.overlay, http)
    routers = [
        committee_router(
            config,
            manifest,
            committee,
            http,
            min_credit_positions,
            route=settings.route,
            guards=guards.sibling(manifest.model_hash) if index else guards,
            prices=prices,
            parties=parties,
            info=info,
        )
        for index, manifest in enumerate(manifests)
    ]
    payer = CreditPayer(wallet, prices, min_positions=min_credit_positions, parties=parties)
    gateway = Gateway(
        config=config,
        model=infos[0],
        head=heads[0],
        router=routers[0],
        more_models=routes_after_first(infos, heads, routers),
        desk=PersonalDesk(payer, expiry),  # type: ignore[arg-type]
        committee=committee,
        http=http,
        chain_id=0,
        escrow="",
        payer=payer,
        overlay=settings.overlay,
    )
    return gateway, [http, committee]


def serve(config: GatewayConfig, settings: PersonalSettings) -> None:
    """Blocks until SIGINT/SIGTERM."""
    config.validate()
    if not is_loopback_host(config.host):
        raise ConfigError(
            f"a personal client serves its own user only: {config.host} is not a loopback address",
            hint="drop --host (127.0.0.1), or run the hosted gateway for others",
        )
    token_file = settings.token_file or default_token_file(None)
    token, created = load_or_create(token_file)
    if created:  # printed once: later starts reuse it (delete the file for a new one)
        print(
            f"personal client token (your tools' API key), kept in {token_file} (mode 0600):\n"
            f"  {token}\n"
            f'  OpenAI(base_url="http://{_url_host(config.host)}:{config.port}/v1", '
            'api_key="<the token>")',
            flush=True,
        )
    quiet_malformed_http_logs()
    asyncio.run(_serve(config, settings, token, token_file))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _serve(
    config: GatewayConfig, settings: PersonalSettings, token: str, token_file: Path
) -> None:
    gateway, resources = await build(config, settings)
    refresher: asyncio.Task[None] | None = None
    app = create_app(gateway, guards=[personal_guard(token, config.host)])
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        await listen(runner, config)
        log.info(
            "personal client serving url=http://%s:%d models=%s credits=%s (%d held) route=%s "
            "token_file=%s",
            _url_host(config.host),
            config.port,
            ",".join(gateway.models.names()),
            settings.credits_file,
            gateway.desk.payer.wallet.count(),  # type: ignore[attr-defined]
            settings.route,
            token_file,
        )
        if settings.relay_refresh is not None:
            reread = settings.relay_refresh.run(gateway.committee.abci_query)
            refresher = asyncio.create_task(reread)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        await runner.cleanup()
        for resource in resources:
            await resource.close()
