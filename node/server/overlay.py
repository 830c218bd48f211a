"""The node's end of the overlay (`/v1/overlay`): cloves in from the exits of users' paths,
whole stream messages to the node's own link code, cloves back out (docs/overlay.md).

Exit relays connect here and send DATA cells, each carrying one S-IDA clove
(`protocol.sida`). Once k cloves of a message agree it is a link message (`protocol.overlay`):
a link id the client chose, a sequence number and a WebSocket message of the ordinary stream
protocol. Each link id gets one `serve_link` (node/server/stream.py), exactly what a direct
`/v1/stream` connection gets, fed in sequence order; what it sends back is dispersed into as
many cloves as the link has paths (at least k) and sent one per path. The paths of a link are
the (exit connection, path id) pairs whose cloves made its messages, including cloves that
arrived after their message was already whole.

Acknowledgements (issue 43): the node counts, per link and clove index, the bytes of the
distinct cloves that reached it for the link's messages (late ones too) and sends the counts
back as an ACK link message (`protocol.relay_pay.Acks`) every ACK_EVERY messages received and
once more when the link ends (the client's CLOSE): what the client pays each path's relays
for. A clove counts once however often an exit repeats it.

INFO (issue 43): an INFO_ASK on a link is answered with an INFO link message holding what GET
/info answers (node/server/info_body.py), so a client on the overlay reads a node's /info
without its address reaching the node. A link that only asks INFO opens no session.

The node sees exits' addresses and path ids, never the client's. Sessions opened over the
overlay count against the caller `overlay:<link id>` (a link is as much of a caller as an
address is; each costs its user n paths of relays).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp import web

from node.server.config import ServerConfig
from node.server.info_body import info_body
from node.server.state import CONFIG_KEY, STATE_KEY, NodeState
from node.server.stream import serve_link
from protocol import sida
from protocol.errors import ProtocolError
from protocol.overlay import (
    MAX_INFO_BYTES,
    Cell,
    CellKind,
    InOrder,
    LinkMessage,
    MessageKind,
    OverlayError,
)
from protocol.relay_pay import Acks

log = logging.getLogger(__name__)

MAX_LINKS: Final = 1024  # links served at once over all exits
MAX_PATHS_PER_LINK: Final = sida.MAX_CLOVES
MAX_EARLY_MESSAGES: Final = 64  # messages held per link while an earlier one is missing
_RECENT: Final = 4096  # message ids remembered: late cloves still add their path
ACK_EVERY: Final = 32  # messages received on a link between two acknowledgements


@dataclass(eq=False)
class OverlayLink:
    """One user's link: its paths, its incoming order, and the message queue `serve_link`
    reads."""

    ident: bytes
    k: int
    paths: list[tuple[web.WebSocketResponse, int]] = field(default_factory=list)
    order: InOrder = field(default_factory=lambda: InOrder(MAX_EARLY_MESSAGES))
    inbox: asyncio.Queue[aiohttp.WSMessage | None] = field(default_factory=asyncio.Queue)
    sent: int = 0  # sequence numbers of what the node sends back
    task: asyncio.Task[None] | None = None
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    received: list[int] = field(default_factory=list)  # distinct clove bytes per clove index
    delivered: int = 0  # messages handed to serve_link (or ended it)
    acks: set[asyncio.Task[None]] = field(default_factory=set)
    # what an INFO_ASK is answered with (the node's /info body); None: INFO_ASK is ignored
    info: Callable[[], dict[str, Any]] | None = None

    def count(self, index: int, n: int, size: int) -> None:
        """One more distinct clove of index `index` (of a message with `n` cloves), `size`
        bytes."""
        if len(self.received) < n:
            self.received.extend([0] * (n - len(self.received)))
        self.received[index] += size

    def acks_now(self) -> Acks | None:
        """The counts to acknowledge (None before 2 clove indexes are known)."""
        if len(self.received) < 2:
            return None
        return Acks(tuple(self.received))

    async def send_ack(self) -> None:
        acks = self.acks_now()
        if acks is not None:
            with contextlib.suppress(ConnectionError):
                await self._send(MessageKind.ACK, acks.to_bytes())

    async def send_info(self) -> None:
        """Answer an INFO_ASK: the node's /info body as an INFO message."""
        assert self.info is not None
        body = json.dumps(self.info()).encode()
        if len(body) > MAX_INFO_BYTES:  # the client would refuse it: say so here instead
            log.warning("overlay: /info is %d bytes, more than an INFO carries", len(body))
            return
        with contextlib.suppress(ConnectionError):
            await self._send(MessageKind.INFO, body)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.acks.add(task)
        task.add_done_callback(self.acks.discard)

    def add_path(self, ws: web.WebSocketResponse, path: int) -> None:
        if (ws, path) not in self.paths and len(self.paths) < MAX_PATHS_PER_LINK:
            self.paths.append((ws, path))

    def deliver(self, message: LinkMessage) -> None:
        """Queue `message` for serve_link in sequence order (a duplicate or stale one is
        dropped; too many out of order ends the link)."""
        ready = self.order.add(message)
        if ready is None:  # a gap that never fills: the link is over
            self.inbox.put_nowait(None)
            return
        for one in ready:
            self.delivered += 1
            if self.delivered % ACK_EVERY == 0 and one.kind is not MessageKind.CLOSE:
                self._spawn(self.send_ack())
            if one.kind in (MessageKind.ACK, MessageKind.INFO):
                continue  # the node's own kinds: a client does not send them
            if one.kind is MessageKind.INFO_ASK:
                if self.info is not None:
                    self._spawn(self.send_info())
                continue
            if one.kind is MessageKind.CLOSE:
                self.inbox.put_nowait(None)
            elif one.kind is MessageKind.TEXT:
                self.inbox.put_nowait(
                    aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, one.body.decode(), None)
                )
            else:
                self.inbox.put_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, one.body, None))

    # -- what serve_link sees as its WebSocket -------------------------------------------------

    def __aiter__(self) -> OverlayLink:
        return self

    async def __anext__(self) -> aiohttp.WSMessage:
        message = await self.inbox.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def send_bytes(self, data: bytes) -> None:
        await self._send(MessageKind.BINARY, data)

    async def send_json(self, body: Any) -> None:
        await self._send(MessageKind.TEXT, json.dumps(body).encode())

    async def _send(self, kind: MessageKind, body: bytes) -> None:
        async with self.send_lock:  # sequence numbers in the order cloves leave
            message = LinkMessage(self.ident, self.sent, kind, body)
            self.sent += 1
            paths = list(self.paths)
            if len(paths) < self.k:
                raise ConnectionError("the link has fewer paths than it needs")
            cloves = sida.disperse(message.to_bytes(), len(paths), self.k)
            for (ws, path), clove in zip(paths, cloves, strict=True):
                cell = Cell(CellKind.DATA, path, clove.to_bytes())
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_bytes(cell.to_bytes())


class OverlayDoor:
    """Every overlay link of one node (`app[DOOR_KEY]`)."""

    def __init__(
        self,
        state: NodeState,
        config: ServerConfig,
        serve: Callable[[OverlayLink, str], Awaitable[None]] | None = None,
        info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.state = state
        self.config = config
        # what an INFO_ASK gets (the node's /info body; tests give their own)
        self.info = info or (lambda: info_body(state, config))
        # what a link gets: the stream protocol's serve_link (tests give their own)
        self.serve = serve or (lambda link, caller: serve_link(state, config, link, caller))
        self.collector = sida.Collector()
        self.links: dict[bytes, OverlayLink] = {}
        # message id -> the paths its cloves came on, and (once whole) its link
        self.arrivals: OrderedDict[bytes, list[tuple[web.WebSocketResponse, int]]] = OrderedDict()
        self.owner: OrderedDict[bytes, bytes] = OrderedDict()
        # message id -> {digest list: {index: size} of the intact cloves with it}, until whole
        self.indexes: OrderedDict[bytes, dict[tuple[bytes, ...], dict[int, int]]] = OrderedDict()
        # message id -> (its digest list, the indexes acknowledged), once whole
        self.counted: OrderedDict[bytes, tuple[tuple[bytes, ...], set[int]]] = OrderedDict()

    def clove(self, ws: web.WebSocketResponse, path: int, raw: bytes) -> None:
        clove = sida.Clove.from_bytes(raw)
        arrived = self.arrivals.setdefault(clove.message_id, [])
        arrived.append((ws, path))
        while len(self.arrivals) > _RECENT:
            self.arrivals.popitem(last=False)
        try:
            whole = self.collector.add(clove)
        except sida.CloveReplayed:
            ident = self.owner.get(clove.message_id)
            if ident in self.links:  # a late clove: its path is one of the link's
                self.links[ident].add_path(ws, path)
                self._late(self.links[ident], clove)
            return
        # intact (the collector checked its body against its digest): noted for acknowledgement
        groups = self.indexes.setdefault(clove.message_id, {})
        groups.setdefault(clove.digests, {})[clove.index] = len(raw)
        while len(self.indexes) > _RECENT:
            self.indexes.popitem(last=False)
        if whole is None:
            return
        message = LinkMessage.from_bytes(whole)
        link = self.links.get(message.link)
        if link is None:
            if len(self.links) >= MAX_LINKS:
                raise OverlayError("link", f"this node serves {MAX_LINKS} overlay links already")
            link = OverlayLink(message.link, clove.k, info=self.info)
            self.links[message.link] = link
            link.task = asyncio.create_task(self._serve(link))
        self.owner[clove.message_id] = message.link
        while len(self.owner) > _RECENT:
            self.owner.popitem(last=False)
        for ws_path in self.arrivals.pop(clove.message_id, []):
            link.add_path(*ws_path)
        # acknowledged: the cloves that agree with the recovered message, each index once
        indexes = self.indexes.pop(clove.message_id, {}).get(clove.digests, {})
        for index, size in sorted(indexes.items()):
            link.count(index, clove.n, size)
        self.counted[clove.message_id] = (clove.digests, set(indexes))
        while len(self.counted) > _RECENT:
            self.counted.popitem(last=False)
        link.deliver(message)

    def _late(self, link: OverlayLink, clove: sida.Clove) -> None:
        """A clove of a message already whole counts once for its index, when it agrees with
        the recovered message (the same digest list, a body matching its digest)."""
        done = self.counted.get(clove.message_id)
        if done is None or clove.digests != done[0] or clove.index in done[1]:
            return
        if clove.intact():
            done[1].add(clove.index)
            link.count(clove.index, clove.n, len(clove.to_bytes()))

    async def _serve(self, link: OverlayLink) -> None:
        try:
            await self.serve(link, f"overlay:{link.ident.hex()}")
        finally:
            self.links.pop(link.ident, None)
            await link.send_ack()  # the last count: what the client pays the paths' relays for

    def exit_gone(self, ws: web.WebSocketResponse) -> None:
        for link in list(self.links.values()):
            link.paths = [(w, p) for w, p in link.paths if w is not ws]

    async def close(self) -> None:
        for link in list(self.links.values()):
            link.inbox.put_nowait(None)
            if link.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await link.task


DOOR_KEY: Final = web.AppKey("overlay_door", OverlayDoor)


async def overlay(request: web.Request) -> web.WebSocketResponse:
    """`/v1/overlay`: one exit relay's connection; DATA cells of cloves both ways."""
    door = request.app[DOOR_KEY]
    ws = web.WebSocketResponse(max_msg_size=door.config.max_request_bytes + 4096, autoping=True)
    await ws.prepare(request)
    try:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                break
            try:
                cell = Cell.from_bytes(message.data)
                if cell.kind is CellKind.DATA:
                    door.clove(ws, cell.path, cell.body)
                elif cell.kind is not CellKind.DESTROY:
                    raise OverlayError("cell", f"{cell.kind.name} is not for a node")
            except ProtocolError as error:  # one bad clove ends nothing but itself
                log.info("overlay: refused %s from %s", error.code, request.remote)
    finally:
        door.exit_gone(ws)
    return ws


async def _door(app: web.Application) -> Any:
    app[DOOR_KEY] = OverlayDoor(app[STATE_KEY], app[CONFIG_KEY])
    yield
    await app[DOOR_KEY].close()


def install_overlay(app: web.Application) -> None:
    app.cleanup_ctx.append(_door)
    app.router.add_get("/v1/overlay", overlay)
