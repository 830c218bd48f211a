"""A relay of the overlay: it forwards cells along paths it knows only one step of each way
(docs/overlay.md).

    client or relay ──/v1/relay──► this relay ──/v1/relay──► next relay
                                              └─/v1/overlay─► node (this relay is the exit)

A SETUP cell on an incoming link opens the relay's box of the onion (`protocol.overlay`): its
hop key and where the path goes next. The relay picks a fresh path id for its outgoing link,
dials the next hop (one WebSocket per next-hop URL, shared by every path through it) and
sends the rest of the onion on; the exit answers CREATED as soon as its link to the node is up,
and every relay passes CREATED back. DATA forward loses one layer here (ChaCha20-Poly1305 under
the hop key at the cell's sequence number), DATA backward gains one. DESTROY, or either link
closing, tears the path down both ways.

PAY cells (issue 43) carry credits for one relay of the path inside its own layer
(`protocol.relay_pay`): the relay opens its layer at the path's pay sequence and either keeps
the credits (`Earnings`, redeemed on the committee by node/relay/redeem.py) or sends the rest
on. A PAY that does not open (replayed, altered, out of order) is refused by name and ends
nothing: the path's cloves go on.

What a relay can learn: its neighbours' addresses, the path ids of its two links, cell sizes and
times. Cloves are S-IDA cloves under layers it cannot open past its own. A cell that does not
open (altered, replayed, reordered) ends its path; nothing a peer sends ends the relay.
Next hops are strangers' choice, so they are dialled only at global addresses (an IP literal)
unless `allow_private` is set (a devnet on loopback).

The exit and a node behind NAT: the onion names one URL for the node (its port at one relay
that fronts it). When that is not reached and the onion pins the node's key, an exit with a
committee (`exits`, node/relay/exit_addresses.py) dials the other addresses that key registered
on the chain (its endpoint and rendezvous addresses; the chain chooses them, not the client), in
turn, each judged by `_check_next` and pinned to the key, each within DIAL_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from nacl.public import PrivateKey

from node.dial import first_reachable
from node.links import link_ssl
from node.relay.earnings import Earnings
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import assigned, relay_party
from protocol.errors import ProtocolError
from protocol.overlay import (
    BACKWARD,
    FORWARD,
    MAX_PAYLOAD_BYTES,
    SETUP_BYTES,
    Cell,
    CellKind,
    NextKind,
    OverlayError,
    new_path_id,
    open_layer,
    peel_onion,
    seal_layer,
)
from protocol.paid_credits import AssignedCredit
from protocol.relay_pay import open_pay

log = logging.getLogger(__name__)

MAX_PATHS: Final = 4096  # over all links
MAX_PATHS_PER_LINK: Final = 256
DIAL_TIMEOUT_S: Final = 10.0
MAX_CELL_BYTES: Final = 9 + max(SETUP_BYTES, MAX_PAYLOAD_BYTES)
_DIAL_ERRORS: Final = (OverlayError, aiohttp.ClientError, OSError, TimeoutError)


class NextHopRefused(OverlayError):
    code = "next_hop_not_allowed"


class ExitFallback(Protocol):
    """Where an exit may also reach a node (node/relay/exit_addresses.py `ExitAddresses`)."""

    def known(self, key: str) -> tuple[str, ...]:
        """The node's registered addresses as last looked up, while fresh (no query)."""
        ...

    async def fallbacks(self, url: str, key: str) -> tuple[str, ...]:
        """The node's other addresses to try, in order, when `url` is not reached."""
        ...


@dataclass(eq=False)
class Path:
    key: bytes
    inbound: Any  # the WebSocket the path came in on (client or previous relay)
    in_id: int
    outbound: Link | None = None
    out_id: int = 0
    forward_seq: int = 0
    backward_seq: int = 0
    pay_seq: int = 0
    exit: bool = False  # the next hop is the node


@dataclass(eq=False)
class Link:
    """One outgoing WebSocket (to a relay's /v1/relay or a node's /v1/overlay)."""

    url: str
    ws: aiohttp.ClientWebSocketResponse
    key: str | None = None
    paths: dict[int, Path] = field(default_factory=dict)  # by out id
    reader: asyncio.Task[None] | None = None


class Relay:
    def __init__(
        self,
        private: PrivateKey,
        *,
        allow_private: bool = False,
        earnings: Earnings | None = None,
        exits: ExitFallback | None = None,
    ) -> None:
        self.private = private
        self.earnings = earnings or Earnings()
        self.allow_private = allow_private
        # an exit's other addresses for a node it does not reach (None: the onion's URL only)
        self.exits = exits
        self.exit_fallbacks = 0  # paths whose node was reached at another registered address
        self.paths: dict[tuple[int, int], Path] = {}  # (id(inbound ws), in id) -> path
        self.links: dict[str, Link] = {}
        self._dialling: dict[str, asyncio.Lock] = {}
        self.http: aiohttp.ClientSession | None = None
        self.cells_forwarded = 0

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        for link in list(self.links.values()):
            await link.ws.close()
        if self.http is not None:
            await self.http.close()

    # -- from an inbound link -------------------------------------------------------------------

    async def inbound(self, ws: Any, cell: Cell) -> None:
        key = (id(ws), cell.path)
        if cell.kind is CellKind.SETUP:
            await self._setup(ws, cell)
        elif cell.kind is CellKind.DATA:
            path = self.paths.get(key)
            if path is None or path.outbound is None:
                return  # unknown or not yet set up: dropped
            try:
                payload = open_layer(path.key, FORWARD, path.forward_seq, cell.body)
            except OverlayError:
                await self._destroy(path)
                raise
            path.forward_seq += 1
            self.cells_forwarded += 1
            await _send(path.outbound.ws, Cell(CellKind.DATA, path.out_id, payload))
        elif cell.kind is CellKind.PAY:
            path = self.paths.get(key)
            if path is None or path.outbound is None:
                return
            opened = open_pay(path.key, path.pay_seq, cell.body, exit_relay=path.exit)
            path.pay_seq += 1
            if opened.onward is not None:
                await _send(path.outbound.ws, Cell(CellKind.PAY, path.out_id, opened.onward))
            else:
                self.earnings.take(self._assigned_here(opened.credits))
        elif cell.kind is CellKind.DESTROY:
            path = self.paths.get(key)
            if path is not None:
                await self._destroy(path, tell_inbound=False)
        else:
            raise OverlayError("cell", f"{cell.kind.name} does not travel forward")

    def _assigned_here(self, credits: Sequence[ThresholdCredit]) -> list[ThresholdCredit]:
        """The credits of a note this relay can redeem: an assigned one only when its holder
        assigned it to this relay's X25519 key (the chain checks the same: CREDIT_NOT_ASSIGNED);
        the others are refused by name in the log."""
        party = relay_party(bytes(self.private.public_key))
        kept = [
            c
            for c in credits
            if not isinstance(c, AssignedCredit) or assigned(c.nonce, party, c.assignment)
        ]
        if len(kept) < len(credits):
            log.info(
                "relay: refused credit_not_assigned: %d credits for another relay",
                len(credits) - len(kept),
            )
        return kept

    async def _setup(self, ws: Any, cell: Cell) -> None:
        key = (id(ws), cell.path)
        if key in self.paths:
            raise OverlayError("setup", f"path {cell.path} is already set up on this link")
        if len(self.paths) >= MAX_PATHS:
            raise OverlayError("setup", f"this relay carries {MAX_PATHS} paths already")
        if sum(1 for (link, _) in self.paths if link == id(ws)) >= MAX_PATHS_PER_LINK:
            raise OverlayError("setup", f"a link may set up {MAX_PATHS_PER_LINK} paths")
        layer, onion = peel_onion(self.private, cell.body)
        path = Path(layer.key, ws, cell.path, exit=layer.next_kind is NextKind.NODE)
        self.paths[key] = path
        try:
            if layer.next_kind is NextKind.RELAY:
                link = await self._link(layer.next_url, "/v1/relay", layer.next_key)
            else:
                link = await self._node_link(layer.next_url, layer.next_key)
        except _DIAL_ERRORS as error:
            self.paths.pop(key, None)
            await _send(ws, Cell(CellKind.DESTROY, cell.path))
            log.info("relay: next hop %s not reached: %s", layer.next_url, error)
            return
        path.outbound = link
        path.out_id = new_path_id()
        link.paths[path.out_id] = path
        if layer.next_kind is NextKind.RELAY:
            await _send(link.ws, Cell(CellKind.SETUP, path.out_id, onion))
        else:  # the exit: the node needs no set-up, the path is ready
            await _send(ws, Cell(CellKind.CREATED, cell.path))

    # -- from an outbound link ------------------------------------------------------------------

    async def _outbound(self, link: Link) -> None:
        try:
            async for message in link.ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                try:
                    cell = Cell.from_bytes(message.data)
                except ProtocolError as error:
                    log.info("relay: bad cell from %s: %s", link.url, error.message)
                    continue
                path = link.paths.get(cell.path)
                if path is None:
                    continue
                if cell.kind is CellKind.CREATED:
                    await _send(path.inbound, Cell(CellKind.CREATED, path.in_id))
                elif cell.kind is CellKind.DATA:
                    payload = seal_layer(path.key, BACKWARD, path.backward_seq, cell.body)
                    path.backward_seq += 1
                    self.cells_forwarded += 1
                    await _send(path.inbound, Cell(CellKind.DATA, path.in_id, payload))
                elif cell.kind is CellKind.DESTROY:
                    await self._destroy(path, tell_outbound=False)
        finally:
            self.links.pop(link.url, None)
            for path in list(link.paths.values()):
                await self._destroy(path, tell_outbound=False)

    async def _node_link(self, url: str, key: str | None) -> Link:
        """The exit's link to the path's node: at `url`, else (the onion pins `key` and this
        relay has `exits`) at the other addresses that key registered, in turn, each judged
        by `_check_next` and within DIAL_TIMEOUT_S. None reached: the error at `url`. While
        a fallback's lookup is fresh, an open link at any of the node's registered addresses
        is taken first: the other paths to a node whose first relay is down do not wait for
        that relay's dial again."""
        if self.exits is not None and key is not None and url not in self._open_urls():
            for other in self.exits.known(key):
                link = self.links.get(other.rstrip("/") + "/v1/overlay")
                if link is not None and link.key == key and not link.ws.closed:
                    self.exit_fallbacks += 1
                    return link
        try:
            return await self._link(url, "/v1/overlay", key)
        except _DIAL_ERRORS as error:
            if self.exits is None or key is None:
                raise
            first = error
        others = [u for u in await self.exits.fallbacks(url, key) if self._allowed(u)]
        if not others:
            raise first
        try:
            reached, link = await first_reachable(
                others,
                lambda other: self._link(other, "/v1/overlay", key),
                total_s=DIAL_TIMEOUT_S * len(others),
                each_s=DIAL_TIMEOUT_S,
                what=f"exit: node {key[:16]}…",
                errors=_DIAL_ERRORS,
            )
        except _DIAL_ERRORS:
            raise first from None
        self.exit_fallbacks += 1
        log.info("relay: node %s… not reached at %s, reached at %s", key[:16], url, reached)
        return link

    def _open_urls(self) -> set[str]:
        """The next-hop URLs this relay holds an open link to (without the path suffix)."""
        return {
            link.url.removesuffix("/v1/overlay")
            for link in self.links.values()
            if not link.ws.closed
        }

    def _allowed(self, url: str) -> bool:
        """Whether this relay's address policy lets it dial `url` (refusals logged)."""
        try:
            self._check_next(url)
        except NextHopRefused as error:
            log.info("relay: a registered address refused: %s", error.message)
            return False
        return True

    async def _link(self, url: str, suffix: str, key: str | None) -> Link:
        target = url.rstrip("/") + suffix
        self._check_next(url)
        try:  # an https:// node proves the key the onion names (node/links.py)
            pin = link_ssl(url, key, plaintext_ok=True)
        except ProtocolError as error:
            raise NextHopRefused("next hop", error.message) from None
        async with self._dialling.setdefault(target, asyncio.Lock()):
            link = self.links.get(target)
            if link is not None and key is not None and link.key != key:
                link = None  # another key for the same URL: its own link, its own pin
            if link is not None and not link.ws.closed:
                return link
            assert self.http is not None
            async with asyncio.timeout(DIAL_TIMEOUT_S):
                ws = await self.http.ws_connect(target, max_msg_size=MAX_CELL_BYTES, ssl=pin)
            link = Link(target, ws, key)
            self.links[target] = link
            link.reader = asyncio.create_task(self._outbound(link))
            return link

    def _check_next(self, url: str) -> None:
        parts = urlsplit(url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
        ):
            raise NextHopRefused("next hop", f"{url!r} is not an http(s) origin")
        try:
            address = ipaddress.ip_address(parts.hostname)
        except ValueError:
            raise NextHopRefused("next hop", f"{parts.hostname!r} is not an IP address") from None
        if not address.is_global and not self.allow_private:
            raise NextHopRefused("next hop", f"{address} is not a public address")

    async def _destroy(
        self, path: Path, *, tell_inbound: bool = True, tell_outbound: bool = True
    ) -> None:
        if self.paths.pop((id(path.inbound), path.in_id), None) is None:
            return
        if path.outbound is not None:
            path.outbound.paths.pop(path.out_id, None)
            if tell_outbound:
                await _send(path.outbound.ws, Cell(CellKind.DESTROY, path.out_id))
        if tell_inbound:
            await _send(path.inbound, Cell(CellKind.DESTROY, path.in_id))

    async def inbound_gone(self, ws: Any) -> None:
        for (link, _), path in list(self.paths.items()):
            if link == id(ws):
                await self._destroy(path, tell_inbound=False)


async def _send(ws: Any, cell: Cell) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_bytes(cell.to_bytes())


RELAY_KEY: Final = web.AppKey("relay", Relay)
FRONTING_INFO_KEY: Final = web.AppKey("fronting_info", Callable[[], dict[str, Any]])


async def relay_link(request: web.Request) -> web.WebSocketResponse:
    """`/v1/relay`: a client's or a previous relay's link."""
    relay = request.app[RELAY_KEY]
    ws = web.WebSocketResponse(max_msg_size=MAX_CELL_BYTES, autoping=True)
    await ws.prepare(request)
    try:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                break
            try:
                await relay.inbound(ws, Cell.from_bytes(message.data))
            except ProtocolError as error:  # one bad cell ends its path at most
                log.info("relay: refused %s from %s: %s", error.code, request.remote, error.message)
    finally:
        await relay.inbound_gone(ws)
    return ws


async def info(request: web.Request) -> web.Response:
    relay = request.app[RELAY_KEY]
    fronting = request.app.get(FRONTING_INFO_KEY)
    return web.json_response(
        {
            # the nodes behind NAT this relay fronts (node/relay/fronting.py), when it does
            **({"rendezvous": fronting()} if fronting is not None else {}),
            "role": "relay",
            "key": bytes(relay.private.public_key).hex(),
            "paths": len(relay.paths),
            "cells_forwarded": relay.cells_forwarded,
            # paths whose node the exit reached at another address its key registered
            "exit_fallbacks": relay.exit_fallbacks,
            # credits taken in PAY cells, and those held until redeemed (docs/overlay.md)
            "credits_received": relay.earnings.received,
            "credits_held": len(relay.earnings.held),
        }
    )


def create_app(relay: Relay) -> web.Application:
    app = web.Application()
    app[RELAY_KEY] = relay

    async def lifecycle(app: web.Application) -> Any:
        await relay.start()
        yield
        await relay.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/v1/relay", relay_link)
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    return app


async def health(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})
