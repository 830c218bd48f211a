"""A relay as the rendezvous point of nodes behind NAT (docs/overlay.md, *NAT rendezvous*).

A node that cannot accept connections opens `/v1/rendezvous` here and proves its node key
(`protocol.rendezvous`); the relay gives it a port of its own from the relay's rendezvous range
and listens there for it. Every TCP connection that arrives at that port is one stream of the
node's link: its bytes go to the node and the node's back, untouched (TLS between the dialer and
the node, pinned to the node key, for an https:// node). So the node's address is
`scheme://<relay's public host>:<its port>`, and clients, previous hops and exits dial it as any
node's: nothing changes for them.

Admission (node/relay/admission.py): a key the committee shows as a staked node (a MEMBER)
gets a port kept for it; any other key gets at most a *lease*: a port for `lease_s`, at most
`provisional_per_address` leases per source address and `max_provisional` in all (a quarter of
the ports), so throwaway keys never hold more than that and the other ports stay for real
nodes. `sweep` (every few seconds) looks again at each lease that ran out: staked, the port is
kept for the key; registered and waiting for its stake, the lease is renewed; otherwise the
lease ends, its link (if up) is closed and the port is free. A key with no lease to be had is
refused `not_registered`.

Limits: at most `max_nodes` nodes fronted (the size of the port range, or less), at most
`per_address` links from one IP address, one link (and one port) per node key, `MAX_STREAMS`
connections at once per node (more are closed at once), `WINDOW_BYTES` buffered per stream and
direction. A member keeps its port while the relay runs, and across restarts when the relay has
a home (`<home>/rendezvous-ports.json`), so the address it registered stays its own; a kept port
of a key that is no longer a member (left, unstaked) is taken back when a member finds the range
full (`reclaim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web
from nacl.public import PrivateKey

from node.relay.admission import LookUp, Standing, admit_any
from node.relay.relay import FRONTING_INFO_KEY
from node.tunnel import Tunnel
from protocol.errors import ConfigError, ProtocolError
from protocol.rendezvous import (
    HELLO_BYTES,
    MAX_SEALED_FRAME_BYTES,
    MAX_STREAMS,
    TO_NODE,
    TO_RELAY,
    WINDOW_BYTES,
    Challenge,
    Frame,
    Hello,
    RefuseCode,
    Sealer,
    Welcome,
    open_hello,
    refusal_bytes,
)

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S: Final = 10.0
PER_ADDRESS: Final = 4
LEASE_S: Final = 120.0  # how long a key the committee does not show staked holds a port
PROVISIONAL_PER_ADDRESS: Final = 2  # leases one source address may hold at once
SWEEP_S: Final = 5.0  # how often leases that ran out are looked at again
RECLAIM_LOOKUPS: Final = 32  # kept ports looked at per `reclaim`
PORTS_FILE: Final = "rendezvous-ports.json"


def parse_port_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (1024..65535, at most 4096 ports) as a pair; ConfigError otherwise."""
    first, dash, last = text.partition("-")
    if not dash or not all(part.isascii() and part.isdigit() for part in (first, last)):
        raise ConfigError(f"rendezvous ports {text!r} are not FIRST-LAST", hint="e.g. 44000-44063")
    a, b = int(first), int(last)
    if not 1024 <= a <= b <= 65535 or b - a >= 4096:
        raise ConfigError(
            f"rendezvous ports {text!r}: want 1024 <= FIRST <= LAST <= 65535, at most 4096 ports",
            hint="e.g. 44000-44063 (one node per port)",
        )
    return a, b


@dataclass(eq=False)
class Fronted:
    node_key: str
    port: int
    address: str
    tunnel: Tunnel
    server: asyncio.Server | None = None
    next_stream: int = 1
    streams_opened: int = 0


@dataclass(eq=False)
class Lease:
    """A port held for a key the committee does not show staked, until `expires` (monotonic s).
    `address`: the source address it was given to (counted against its leases)."""

    port: int
    address: str
    expires: float


@dataclass(eq=False)
class Fronting:
    """The nodes this relay fronts (`app[FRONTING_KEY]`)."""

    private: PrivateKey
    ports: tuple[int, int]
    host: str  # the public host dialers reach the ports at
    bind: str = "127.0.0.1"
    max_nodes: int = 0  # 0: one per port
    per_address: int = PER_ADDRESS
    home: Path | None = None
    # what the committee says a key is (node/relay/admission.py); admit_any: every key a member
    look_up: LookUp = admit_any
    lease_s: float = LEASE_S
    provisional_per_address: int = PROVISIONAL_PER_ADDRESS
    max_provisional: int = 0  # leases in all; 0: a quarter of max_nodes (at least 1)
    clock: Callable[[], float] = time.monotonic
    nodes: dict[str, Fronted] = field(default_factory=dict)  # by node key (hex)
    assigned: dict[str, int] = field(default_factory=dict)  # member key -> port, kept
    leases: dict[str, Lease] = field(default_factory=dict)  # other keys -> a port for a while
    # key -> the port of its lease that ended: given again, if free, when the key asks for any
    # (a node whose lease ran out before it registered the address relinks to the same one)
    ended: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        size = self.ports[1] - self.ports[0] + 1
        self.max_nodes = min(self.max_nodes or size, size)
        self.max_provisional = min(self.max_provisional or max(1, self.max_nodes // 4), size)
        if self.home is not None:
            self.assigned = _load(self.home / PORTS_FILE, self.ports)

    def _taken(self, node_key: str) -> set[int]:
        kept = {p for k, p in self.assigned.items() if k != node_key}
        return kept | {lease.port for k, lease in self.leases.items() if k != node_key}

    def port_for(self, node_key: str, wanted: int) -> int | RefuseCode:
        """The node's port (kept or leased from before, the one it asks for, or the lowest
        free), or why not."""
        lease = self.leases.get(node_key)
        mine = self.assigned.get(node_key, lease.port if lease is not None else None)
        taken = self._taken(node_key)
        if wanted:
            if not self.ports[0] <= wanted <= self.ports[1] or wanted in taken:
                return RefuseCode.PORT_TAKEN
            return wanted
        if mine is not None:
            return mine
        if len(self.assigned) + len(self.leases) >= self.max_nodes:
            return RefuseCode.FULL
        before = self.ended.get(node_key)
        if before is not None and before not in taken:
            return before
        for port in range(self.ports[0], self.ports[1] + 1):
            if port not in taken:
                return port
        return RefuseCode.FULL

    def admit(
        self, node_key: str, address: str, wanted: int, standing: Standing = Standing.MEMBER
    ) -> int | RefuseCode:
        """The port `node_key` (linking from `address`, asking for `wanted`, 0: any) gets, or
        why not. A MEMBER's port is kept for it; a key holding a kept port keeps it whatever
        the committee says now (`reclaim` takes such ports back); any other key gets (or
        keeps, without renewal) a lease."""
        if node_key in self.nodes:
            return RefuseCode.ALREADY_FRONTED
        if len(self.nodes) >= self.max_nodes:
            return RefuseCode.FULL
        if sum(1 for f in self.nodes.values() if f.address == address) >= self.per_address:
            return RefuseCode.TOO_MANY_FROM_ADDRESS
        if standing is not Standing.MEMBER and node_key not in self.assigned:
            return self._lease(node_key, address, wanted)
        port = self.port_for(node_key, wanted)
        if isinstance(port, RefuseCode):
            return port
        self.leases.pop(node_key, None)
        if self.assigned.get(node_key) != port:
            self.assigned = {k: p for k, p in self.assigned.items() if k != node_key}
            self.assigned[node_key] = port
            self._save()
        return port

    def _lease(self, node_key: str, address: str, wanted: int) -> int | RefuseCode:
        lease = self.leases.get(node_key)
        if lease is None:
            held = sum(1 for other in self.leases.values() if other.address == address)
            if held >= self.provisional_per_address or len(self.leases) >= self.max_provisional:
                return RefuseCode.NOT_REGISTERED
        port = self.port_for(node_key, wanted)
        if isinstance(port, RefuseCode):
            return port
        if lease is None:
            self.leases[node_key] = Lease(port, address, self.clock() + self.lease_s)
        else:
            lease.port = port  # the same lease, not renewed: linking again buys no time
        return port

    async def sweep(self) -> None:
        """Look again at each lease that ran out: the key staked now keeps its port; one
        registered and waiting for its stake gets another lease; any other loses its port and
        its link."""
        now = self.clock()
        for key in [k for k, lease in self.leases.items() if lease.expires <= now]:
            standing = await self.look_up(key)
            lease = self.leases.get(key)
            if lease is None or lease.expires > now:
                continue  # promoted or taken back meanwhile
            if standing is Standing.MEMBER:
                del self.leases[key]
                self.assigned[key] = lease.port
                self._save()
                log.info("rendezvous: node %s… staked: port %d kept", key[:16], lease.port)
            elif standing is Standing.PENDING:
                lease.expires = self.clock() + self.lease_s
                log.info("rendezvous: node %s… registered, not staked: lease renewed", key[:16])
            else:
                del self.leases[key]
                self.ended[key] = lease.port
                while len(self.ended) > 4 * self.max_nodes:  # the oldest forgotten first
                    del self.ended[next(iter(self.ended))]
                log.info(
                    "rendezvous: lease of %s… ended (not registered): port %d free",
                    key[:16],
                    lease.port,
                )
                fronted = self.nodes.get(key)
                if fronted is not None:
                    await fronted.tunnel.ws.close()

    async def reclaim(self) -> int:
        """Take back the kept ports of keys that are not linked and no longer members (left,
        unstaked, or kept by a relay of an older release that fronted any key): at most
        RECLAIM_LOOKUPS looked at. How many were freed."""
        freed = 0
        idle = [k for k in sorted(self.assigned) if k not in self.nodes][:RECLAIM_LOOKUPS]
        for key in idle:
            if await self.look_up(key) is not Standing.MEMBER and key not in self.nodes:
                self.assigned.pop(key, None)
                freed += 1
        if freed:
            self._save()
            log.info("rendezvous: took back %d kept ports of keys no longer members", freed)
        return freed

    async def keep_sweeping(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_S, max(self.lease_s / 4, 0.05)))
            try:
                await self.sweep()
            except Exception:  # a sweep that failed is done again next time, never given up
                log.exception("rendezvous: lease sweep failed")

    def _save(self) -> None:
        if self.home is None:
            return
        path = self.home / PORTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.assigned, sort_keys=True))
        os.replace(tmp, path)

    def info(self) -> dict[str, Any]:
        return {
            "ports": list(self.ports),
            "max_nodes": self.max_nodes,
            "kept": len(self.assigned),
            "leases": len(self.leases),
            "max_leases": self.max_provisional,
            "nodes": [
                {
                    "key": f.node_key,
                    "port": f.port,
                    "streams": len(f.tunnel.streams),
                    "streams_opened": f.streams_opened,
                }
                for f in self.nodes.values()
            ],
        }

    # -- one node's link ------------------------------------------------------------------------

    async def serve(self, ws: web.WebSocketResponse, address: str) -> None:
        challenge = Challenge.fresh(bytes(self.private.public_key))
        await ws.send_bytes(challenge.to_bytes())
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                message = await ws.receive()
        except TimeoutError:
            return
        if message.type != aiohttp.WSMsgType.BINARY or len(message.data) != HELLO_BYTES:
            await _refuse(ws, RefuseCode.VERSION, "not a rendezvous hello")
            return
        try:
            hello = Hello.from_bytes(message.data)
            secret = open_hello(self.private, challenge, hello)
        except ProtocolError as error:
            log.info("rendezvous: refused %s from %s: %s", error.code, address, error.message)
            await _refuse(ws, RefuseCode.FORGED, error.message)
            return
        node_key = hello.node_key.hex()
        standing = Standing.MEMBER
        if node_key not in self.assigned:  # a kept port was a member's: no committee read
            standing = await self.look_up(node_key)
        port = self.admit(node_key, address, hello.port, standing)
        if port is RefuseCode.FULL and standing is Standing.MEMBER and await self.reclaim():
            port = self.admit(node_key, address, hello.port, standing)
        if isinstance(port, RefuseCode):
            log.info(
                "rendezvous: refused %s for node %s… from %s (%s)",
                port.name.lower(),
                node_key[:16],
                address,
                standing.value,
            )
            await _refuse(ws, port, _REASONS.get(port, port.name.lower()))
            return
        tunnel = Tunnel(ws, Sealer(secret, TO_NODE), Sealer(secret, TO_RELAY))
        fronted = Fronted(node_key, port, address, tunnel)
        try:
            fronted.server = await asyncio.start_server(
                lambda r, w: self._arrived(fronted, r, w), self.bind, port
            )
        except OSError as error:
            log.warning("rendezvous: port %d not bound for %s…: %s", port, node_key[:16], error)
            await _refuse(ws, RefuseCode.PORT_TAKEN, f"port {port} is busy on the relay")
            return
        self.nodes[node_key] = fronted
        log.info(
            "rendezvous: fronting node %s… on port %d (%s)",
            node_key[:16],
            port,
            "kept" if node_key in self.assigned else "leased",
        )
        try:
            welcome = Welcome(port, MAX_STREAMS, WINDOW_BYTES, self.host)
            await ws.send_bytes(tunnel.outgoing.seal(welcome.to_plain()))
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                await tunnel.receive(message.data)
        except ProtocolError as error:  # only the node could have sent it: its link ends
            log.info(
                "rendezvous: link of %s… ended: %s %s", node_key[:16], error.code, error.message
            )
        finally:
            self.nodes.pop(node_key, None)
            fronted.server.close()
            await tunnel.close()
            with contextlib.suppress(Exception):
                await fronted.server.wait_closed()
            held = "leased" if node_key in self.leases else "free"
            held = "kept for it" if node_key in self.assigned else held
            log.info("rendezvous: node %s… gone; port %d %s", node_key[:16], port, held)

    async def _arrived(
        self, fronted: Fronted, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        tunnel = fronted.tunnel
        if tunnel.closed or len(tunnel.streams) >= MAX_STREAMS:
            writer.close()
            return
        ident = fronted.next_stream
        fronted.next_stream = ident % 0xFFFFFFFF + 1
        fronted.streams_opened += 1
        peer = writer.get_extra_info("peername") or ("0.0.0.0", 0)
        dialer = str(ipaddress.ip_address(str(peer[0]).split("%", 1)[0]))
        try:
            await tunnel.send(Frame.open(ident, dialer))
        except (ConnectionError, RuntimeError):
            writer.close()
            return
        tunnel.attach(ident, reader, writer)

    async def close(self) -> None:
        for fronted in list(self.nodes.values()):
            await fronted.tunnel.ws.close()


_REASONS: Final = {
    RefuseCode.NOT_REGISTERED: "not_registered: the committee shows no staked node with this "
    "key, and this relay holds as many ports for such keys (from this address, or in all) as "
    "it will; register and stake, then link again",
}


async def _refuse(ws: web.WebSocketResponse, code: RefuseCode, reason: str) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_bytes(refusal_bytes(code, reason))
    await ws.close()


def _load(path: Path, ports: tuple[int, int]) -> dict[str, int]:
    """The kept assignments; entries that are not (64-hex key, port in range, unique) are
    dropped."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    kept: dict[str, int] = {}
    if isinstance(raw, dict):
        for key, port in sorted(raw.items()):
            ok_key = (
                isinstance(key, str)
                and len(key) == 64
                and all(c in "0123456789abcdef" for c in key)
            )
            ok_port = isinstance(port, int) and not isinstance(port, bool)
            if ok_key and ok_port and ports[0] <= port <= ports[1] and port not in kept.values():
                kept[key] = port
    return kept


FRONTING_KEY: Final = web.AppKey("fronting", Fronting)


async def rendezvous(request: web.Request) -> web.WebSocketResponse:
    """`/v1/rendezvous`: a node behind NAT keeps its link to this relay here."""
    fronting = request.app[FRONTING_KEY]
    ws = web.WebSocketResponse(max_msg_size=MAX_SEALED_FRAME_BYTES + 1024, autoping=True)
    await ws.prepare(request)
    await fronting.serve(ws, request.remote or "?")
    return ws


DIALBACK_TIMEOUT_S: Final = 3.0
_DIALBACKS: Final = asyncio.Semaphore(8)  # at once, over all askers


async def dialback(request: web.Request) -> web.Response:
    """`/v1/dialback?port=N`: can this relay open a TCP connection to the asker's own address
    at port N? (`planet join` asks before it registers an endpoint.) Only the address the
    request came from is dialled, so the relay cannot be sent at anyone else; nothing is sent
    on the connection."""
    text = request.query.get("port", "")
    # ASCII digits only: str.isdigit takes "８０" and int() reads it as 80
    if not (text.isascii() and text.isdigit()) or len(text) > 5 or not 0 < int(text) < 65536:
        return web.json_response({"code": "bad_port", "message": "port: 1..65535"}, status=400)
    address = request.remote or ""
    reachable = False
    async with _DIALBACKS:
        try:
            async with asyncio.timeout(DIALBACK_TIMEOUT_S):
                _, writer = await asyncio.open_connection(address, int(text))
            writer.close()
            reachable = True
        except (OSError, TimeoutError, ValueError):
            reachable = False
    return web.json_response({"address": address, "port": int(text), "reachable": reachable})


def install_fronting(app: web.Application, fronting: Fronting) -> None:
    app[FRONTING_KEY] = fronting
    app[FRONTING_INFO_KEY] = fronting.info
    app.router.add_get("/v1/dialback", dialback)

    async def lifecycle(app: web.Application) -> Any:
        sweeping = asyncio.create_task(fronting.keep_sweeping())
        yield
        sweeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeping
        await fronting.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/v1/rendezvous", rendezvous)
