"""A node's /info over the overlay (issue 43): the INFO_ASK / INFO link messages (hostile
bodies refused by name), and the personal client's router reading nodes' /info, stats and health
through real relays (aiohttp on loopback, in one process) to a real `OverlayDoor`, with every
request of the client's HTTP session recorded: none goes to the node."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from nacl.public import PrivateKey

from harness.ports import ephemeral_port
from node.client.overlay import OverlayLink, OverlayRoute
from node.gateway.engine import RouterCircuits
from node.gateway.node_info import DirectInfo, InfoUnavailable, OverlayInfo
from node.gateway.router import RoutableNode, Router
from node.relay.relay import Relay, create_app
from node.server import overlay as server_overlay
from node.server.overlay import DOOR_KEY, OverlayDoor, overlay
from protocol.overlay import (
    MAX_INFO_BYTES,
    CellMalformed,
    Hop,
    InfoInvalid,
    LinkMessage,
    MessageKind,
    parse_info,
)
from tests.unit.test_relay_paid_paths import FakeConfig
from tests.unit.test_relay_paid_paths import Net as RelayNet

pytestmark = pytest.mark.unit

LINK = b"L" * 16
MODEL = "sha256:" + "0" * 64
KEY = "ab" * 32


# -- the wire ---------------------------------------------------------------------------------


def test_info_messages_round_trip() -> None:
    ask = LinkMessage(LINK, 0, MessageKind.INFO_ASK)
    assert LinkMessage.from_bytes(ask.to_bytes()) == ask
    answer = LinkMessage(LINK, 1, MessageKind.INFO, json.dumps({"shard": 0}).encode())
    assert LinkMessage.from_bytes(answer.to_bytes()) == answer
    assert parse_info(answer.body) == {"shard": 0}


def test_an_info_ask_with_a_body_is_refused_by_name() -> None:
    raw = LinkMessage(LINK, 0, MessageKind.INFO_ASK, b"x").to_bytes()
    with pytest.raises(CellMalformed) as caught:
        LinkMessage.from_bytes(raw)
    assert caught.value.code == "cell_malformed"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[1, 2]",
        b"7",
        b'"an object"',
        b"null",
        b"{",
        b"\xff\xfe{}",
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser recurses
        b'{"a": "' + b"x" * MAX_INFO_BYTES + b'"}',  # over the bound
    ],
)
def test_hostile_info_bodies_are_refused_by_name(body: bytes) -> None:
    with pytest.raises(InfoInvalid) as caught:
        parse_info(body)
    assert caught.value.code == "overlay_info_invalid"
    with pytest.raises(InfoInvalid):
        LinkMessage.from_bytes(LinkMessage(LINK, 0, MessageKind.INFO, body).to_bytes())


# -- a node behind relays, in one process ------------------------------------------------------


def node_info(shard: int = 0) -> dict[str, Any]:
    return {"model_hash": MODEL, "shard": shard, "layers": [0, 30], "credit_positions": 0}


class Net(RelayNet):
    """A node (only its overlay door, plus a /info and /health that count direct readers) and
    relays in front of it; `seen`: every URL the client's HTTP session asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.direct = 0  # requests that reached the node other than its overlay door
        self.asked = 0  # INFO_ASKs the door answered
        self.seen: list[str] = []

    def info(self) -> dict[str, Any]:
        self.asked += 1
        return node_info()

    async def start(self, relays: int) -> None:
        async def stream(link: Any, _caller: str) -> None:
            async for _message in link:
                pass

        async def direct(_request: web.Request) -> web.Response:
            self.direct += 1
            return web.json_response(node_info())

        door = OverlayDoor(None, None, serve=stream, info=self.info)  # type: ignore[arg-type]
        door.config = FakeConfig()  # type: ignore[assignment]
        app = web.Application()
        app[DOOR_KEY] = door
        app.router.add_get("/v1/overlay", overlay)
        app.router.add_get("/info", direct)
        app.router.add_get("/health", direct)
        self.node_url = await self.serve(app)
        for _ in range(relays):
            private = PrivateKey.generate()
            relay = Relay(private, allow_private=True)
            self.relays.append(relay)
            self.hops.append(Hop(await self.serve(create_app(relay)), bytes(private.public_key)))

    def session(self) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()

        async def started(_session: Any, _context: Any, params: Any) -> None:
            self.seen.append(str(params.url))

        trace.on_request_start.append(started)
        return aiohttp.ClientSession(trace_configs=[trace])

    def to_node(self) -> list[str]:
        return [url for url in self.seen if url.startswith(self.node_url)]


@contextlib.asynccontextmanager
async def network(relays: int = 3) -> AsyncIterator[tuple[Net, aiohttp.ClientSession]]:
    net = Net()
    try:
        await net.start(relays)
        async with net.session() as http:
            yield net, http
    finally:
        await net.stop()


class Source:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


def router(net: Net, http: aiohttp.ClientSession, *, overlay: bool) -> Router:
    route = OverlayRoute(tuple(net.hops), paths=3, needed=2, length=1)
    entry = {"key": KEY, "endpoint": net.node_url, "shards": [0], "routable": True}
    return Router(
        Source([entry]),
        model_hash=MODEL,
        shard_layers=[(0, 30)],
        http=http,
        public_only=False,  # loopback test endpoints
        refresh_s=0,
        info=OverlayInfo(route, http) if overlay else None,
    )


async def test_overlay_link_reads_the_nodes_info_through_the_relays() -> None:
    async with network() as (net, http):
        async with OverlayLink(http, [[hop] for hop in net.hops], net.node_url, k=2) as link:
            assert await link.info() == node_info()
            assert await link.info() == node_info()  # a link answers every ask
        assert net.asked == 2
        assert net.direct == 0 and net.to_node() == []


async def test_the_router_over_the_overlay_never_reaches_a_node_directly() -> None:
    async with network() as (net, http):
        routed = router(net, http, overlay=True)
        circuit = await routed.circuit()  # verified first: its /info over the relays
        node = circuit.nodes[0]
        assert node == RoutableNode(KEY, net.node_url, 0)
        assert routed.prices[net.node_url] == 0
        await routed._observe(node)  # the background refresh of its stats
        assert routed.costs.get(net.node_url).updated_s > 0
        await routed.probe(circuit)  # health after a failed question
        assert not routed._cooling(node)
        engine = RouterCircuits(routed, None)  # type: ignore[arg-type]
        engine.circuits.append(circuit)
        assert await engine.probe() == set()
        assert net.asked == 4
        assert net.direct == 0 and net.to_node() == []  # every read rode the relays
        assert any("/v1/relay" in url for url in net.seen)


async def test_the_direct_router_reads_the_node_itself() -> None:
    """The default (the hosted gateway, a personal client without relays): what the overlay
    router must not do."""
    async with network() as (net, http):
        routed = router(net, http, overlay=False)
        assert isinstance(routed.info, DirectInfo)
        circuit = await routed.circuit()
        await routed.probe(circuit)
        assert net.to_node() == [f"{net.node_url}/info", f"{net.node_url}/health"]
        assert net.asked == 0


async def test_an_overlay_router_refreshes_stats_at_the_overlay_rate() -> None:
    async with network() as (net, http):
        routed = router(net, http, overlay=True)
        circuit = await routed.circuit()
        routed.costs.get(net.node_url).updated_s = 0.0  # stale by the cost book's 2 s
        routed._observe_stale(circuit.nodes)
        assert routed._observing == {}  # read at verify less than 30 s ago: not again yet
        routed._observed[net.node_url] -= OverlayInfo.observe_s
        routed._observe_stale(circuit.nodes)
        await routed._observing[net.node_url]
        assert net.asked == 2 and net.to_node() == []


async def test_a_hostile_info_is_refused_by_name_and_the_node_cooled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def lies(self: server_overlay.OverlayLink) -> None:
        await self._send(MessageKind.INFO, b"[1, 2]")

    monkeypatch.setattr(server_overlay.OverlayLink, "send_info", lies)
    async with network() as (net, http):
        async with OverlayLink(http, [[hop] for hop in net.hops], net.node_url, k=2) as link:
            with pytest.raises(InfoInvalid):
                await link.info()
        routed = router(net, http, overlay=True)
        with pytest.raises(InfoUnavailable):
            await routed.info.info(net.node_url, KEY, None, 10.0)
        node = RoutableNode(KEY, net.node_url, 0)
        assert not await routed._verify(node)
        assert routed._cooling(node)
        assert net.direct == 0 and net.to_node() == []


async def test_a_client_sending_the_nodes_kind_gets_no_answer() -> None:
    async with network() as (net, http):
        async with OverlayLink(http, [[hop] for hop in net.hops], net.node_url, k=2) as link:
            await link._send(MessageKind.INFO, json.dumps(node_info()).encode())
            assert await link.info() == node_info()  # the link still serves
        assert net.asked == 1


async def test_overlay_health_fails_for_a_node_that_is_gone() -> None:
    async with network() as (net, http):
        fetcher = OverlayInfo(OverlayRoute(tuple(net.hops), paths=3, needed=2, length=1), http)
        fetcher.timeout_s = 5.0
        gone = f"http://127.0.0.1:{ephemeral_port()}"
        assert not await fetcher.healthy(gone, KEY, 0.1)
        assert [url for url in net.seen if url.startswith(gone)] == []
