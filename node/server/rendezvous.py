"""The node's end of a rendezvous link: a node behind NAT keeps an outbound link to each relay it
named (`planet node serve --rendezvous URL KEY`), and serves over it the connections that reach
its port on the relay (docs/overlay.md, *NAT rendezvous*; the wire: `protocol.rendezvous`).

Each stream the relay opens becomes a TCP connection to the node's own listener on loopback, so
the node's server sees it as any connection (TLS included: the dialer's TLS ends here, not at
the relay). The link is dialled again after a failure (1 s, doubling to 30 s); a relay that
refuses (full, the port taken) is retried at the slowest pace. The node asks for the port it
had (or was told with `port`), so its address on the relay stays the one it registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from aiohttp import web
from nacl.signing import SigningKey

from node.dial import refuse_redirects
from node.tunnel import Stream, Tunnel
from protocol.errors import ProtocolError
from protocol.rendezvous import (
    CHALLENGE_BYTES,
    MAX_SEALED_FRAME_BYTES,
    TO_NODE,
    TO_RELAY,
    Challenge,
    Refused,
    RelayNotProven,
    Sealer,
    Welcome,
    make_hello,
    refusal_from_bytes,
)

log = logging.getLogger(__name__)

RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 30.0
HANDSHAKE_TIMEOUT_S: Final = 10.0
MAX_RELAYS: Final = 3  # as many as a registration may name (protocol.committee.registry)


@dataclass(frozen=True)
class RendezvousRelay:
    """A relay the node asks to front it: its URL and its X25519 key (the key the node seals to:
    only that relay can answer)."""

    url: str
    key: bytes
    port: int = 0  # the port to ask for (0: the one the relay kept, or any)


def parse_relay(url: str, key: str, port: int = 0) -> RendezvousRelay:
    """`--rendezvous URL KEY` as a RendezvousRelay; ValueError naming what is wrong."""
    from protocol.urls import canonical_url

    base = canonical_url(url)
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} is not an http(s) URL")
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"{key!r} is not a relay's X25519 key (64 hex digits)")
    return RendezvousRelay(base, raw, port)


class RendezvousLink:
    """One relay's link, kept up until `stop`. `reached` is called with the WELCOME each time
    the link comes up (the node's public host and port on the relay)."""

    def __init__(
        self,
        relay: RendezvousRelay,
        node_key: SigningKey,
        local: tuple[str, int],
        *,
        reached: Callable[[RendezvousRelay, Welcome], None] | None = None,
        callers: dict[int, str] | None = None,
    ) -> None:
        self.relay = relay
        # the local port of each stream's connection -> its dialer's address (`fronted_caller`)
        self.callers = callers if callers is not None else {}
        self._ports: dict[int, int] = {}  # stream -> the local port in `callers`
        self.node_key = node_key
        self.local = local
        self.reached = reached
        self.port = relay.port
        self.welcome: Welcome | None = None
        self.tunnel: Tunnel | None = None
        self.last_error: str | None = None

    async def run(self, http: aiohttp.ClientSession) -> None:
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._once(http)
                delay = RETRY_FIRST_S  # it was up: start again from the shortest wait
            except Refused as error:
                self.last_error = f"{error.code}: {error.message}"
                log.warning("rendezvous: %s refused: %s", self.relay.url, error.message)
                delay = RETRY_MAX_S
            except (ProtocolError, aiohttp.ClientError, OSError, TimeoutError) as error:
                self.last_error = str(getattr(error, "message", error)) or type(error).__name__
                log.info("rendezvous: link to %s down: %s", self.relay.url, self.last_error)
            self.welcome = None
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)

    async def _once(self, http: aiohttp.ClientSession) -> None:
        ws, welcome, secret = await handshake(http, self.relay, self.node_key, self.port)
        try:
            self.port = welcome.port
            self.welcome = welcome
            self.last_error = None
            incoming = Sealer(secret, TO_NODE)
            incoming.sequence = 1  # the WELCOME was frame 0
            tunnel = Tunnel(ws, Sealer(secret, TO_RELAY), incoming, on_open=self._connect)
            tunnel.on_end = self._ended
            self.tunnel = tunnel
            if self.reached is not None:
                self.reached(self.relay, welcome)
            try:
                async for message in ws:
                    if message.type != aiohttp.WSMsgType.BINARY:
                        break
                    await tunnel.receive(message.data)
            finally:
                await tunnel.close()
                self.tunnel = None
        finally:
            await ws.close()

    async def _connect(
        self, stream: int, dialer: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(*self.local)
        port = int((writer.get_extra_info("sockname") or ("", 0))[1])
        self.callers[port] = dialer
        self._ports[stream] = port
        return reader, writer

    def _ended(self, stream: Stream) -> None:
        port = self._ports.pop(stream.ident, None)
        if port is not None:
            self.callers.pop(port, None)


async def handshake(
    http: aiohttp.ClientSession, relay: RendezvousRelay, node_key: SigningKey, port: int = 0
) -> tuple[aiohttp.ClientWebSocketResponse, Welcome, bytes]:
    """Open a link to `relay` and prove the node key: (the WebSocket, the relay's WELCOME, the
    link secret). Refused (by the relay, named), RelayNotProven (the peer does not hold the
    pinned key), or a connection error."""
    target = relay.url.rstrip("/") + "/v1/rendezvous"
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
        ws = await http.ws_connect(target, max_msg_size=MAX_SEALED_FRAME_BYTES + 1024)
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            first = await ws.receive_bytes()
            if len(first) != CHALLENGE_BYTES:
                raise refusal_from_bytes(first)
            challenge = Challenge.from_bytes(first)
            hello, secret = make_hello(node_key, relay.key, challenge, port)
            await ws.send_bytes(hello.to_bytes())
            answer = await ws.receive()
        if answer.type != aiohttp.WSMsgType.BINARY:
            raise RelayNotProven("welcome", "the relay closed the link")
        try:
            welcome = Welcome.from_plain(Sealer(secret, TO_NODE).open(answer.data))
        except ProtocolError:
            refused = refusal_from_bytes(answer.data)
            if isinstance(refused, Refused):
                raise refused from None
            raise RelayNotProven(
                "welcome", "does not open: the peer is not the relay the node named"
            ) from None
    except BaseException:
        await ws.close()
        raise
    return ws, welcome, secret


async def claim_port(
    http: aiohttp.ClientSession, relay: RendezvousRelay, node_key: SigningKey
) -> Welcome:
    """The port the relay gives (and keeps for) this node key, asked once and let go: what
    `planet join` registers before the node links for good."""
    ws, welcome, _ = await handshake(http, relay, node_key, relay.port)
    await ws.close()
    return welcome


def local_target(host: str, port: int) -> tuple[str, int]:
    """Where the node's own listener is reached from the node: a wildcard bind on loopback."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1" if host != "::" else "::1"
    return host, port


def public_url(scheme: str, welcome: Welcome) -> str:
    host = f"[{welcome.host}]" if ":" in welcome.host else welcome.host
    return f"{scheme}://{host}:{welcome.port}"


def start_rendezvous(
    app: Any,
    relays: tuple[RendezvousRelay, ...],
    node_key: SigningKey,
    local: tuple[str, int],
    scheme: str,
) -> None:
    """Keep a link to each relay while `app` (the node's aiohttp app) runs; print one line each
    time a relay fronts the node."""

    def reached(relay: RendezvousRelay, welcome: Welcome) -> None:
        print(
            f"planet node: reachable at {public_url(scheme, welcome)} through relay {relay.url} "
            "(rendezvous: this node accepts no inbound connection)",
            flush=True,
        )

    callers: dict[int, str] = {}
    app[CALLERS_KEY] = callers

    async def lifecycle(_app: Any) -> Any:
        http = aiohttp.ClientSession(middlewares=(refuse_redirects,))
        links = [
            RendezvousLink(r, node_key, local, reached=reached, callers=callers) for r in relays
        ]
        tasks = [asyncio.create_task(link.run(http)) for link in links]
        _app[LINKS_KEY] = links
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await http.close()

    app.cleanup_ctx.append(lifecycle)


LINKS_KEY: Final = web.AppKey("rendezvous_links", list)
CALLERS_KEY: Final = web.AppKey("rendezvous_callers", dict)


def fronted_caller(request: web.Request) -> str | None:
    """The dialer's address of a connection a relay fronted (it arrives from the node's own
    rendezvous link on loopback), so its sessions count against that caller as a direct
    connection's would; None for any other connection."""
    callers = request.app.get(CALLERS_KEY)
    if not callers or request.transport is None:
        return None
    peer = request.transport.get_extra_info("peername")
    if not peer or peer[0] not in ("127.0.0.1", "::1"):
        return None
    return callers.get(int(peer[1]))
