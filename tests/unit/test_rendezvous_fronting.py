"""A relay fronting nodes behind NAT (node/relay/fronting.py) and the node's link to it
(node/server/rendezvous.py), in one process over loopback: bytes to the node's port on the relay
reach the node's own listener and back, beyond the window (flow control); the relay's limits
(nodes, one link per key, per address, the port range) refuse by name; a relay that does not
hold the pinned key is never trusted; a node that breaks the frame rules loses its link."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.ports import ephemeral_port, port_free
from node.relay.fronting import Fronting, dialback, parse_port_range
from node.server.rendezvous import RendezvousLink, RendezvousRelay
from protocol.errors import ConfigError
from protocol.rendezvous import (
    TO_RELAY,
    WINDOW_BYTES,
    Challenge,
    Frame,
    FrameKind,
    RefuseCode,
    Sealer,
    make_hello,
)
from tests.unit.fronting_relay import serve_fronting_relay

pytestmark = pytest.mark.unit


def _port_run(count: int) -> int:
    while True:
        first = ephemeral_port()
        if all(port_free(first + i) for i in range(1, count)):
            return first


class Setup:
    def __init__(self, private: PrivateKey, fronting: Fronting, url: str) -> None:
        self.private = private
        self.fronting = fronting
        self.url = url
        self.http = aiohttp.ClientSession()
        self.tasks: list[asyncio.Task[None]] = []

    def relay(self, port: int = 0, key: bytes | None = None) -> RendezvousRelay:
        return RendezvousRelay(self.url, key or bytes(self.private.public_key), port)

    async def link(self, local: tuple[str, int], **kw) -> RendezvousLink:
        reached = asyncio.Event()
        link = RendezvousLink(
            kw.pop("relay", None) or self.relay(),
            kw.pop("key", None) or SigningKey.generate(),
            local,
            reached=lambda _r, _w: reached.set(),
        )
        self.tasks.append(asyncio.create_task(link.run(self.http)))
        if kw.get("wait", True):
            async with asyncio.timeout(10):
                await reached.wait()
        return link


async def _echo() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    private = PrivateKey.generate()
    first = _port_run(3)
    fronting = Fronting(private, (first, first + 2), "127.0.0.1", per_address=2, home=tmp_path)
    runner, url = await serve_fronting_relay(private, fronting)
    ready = Setup(private, fronting, url)
    try:
        yield ready
    finally:
        for task in ready.tasks:
            task.cancel()
        for task in ready.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await ready.http.close()
        await runner.cleanup()


async def _round_trip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:  # while reading: an echo of more than the buffers would stall
        writer.write(payload)
        await writer.drain()

    sending = asyncio.create_task(send())
    got = await reader.readexactly(len(payload))
    await sending
    writer.close()
    return got


async def test_fronted_port_reaches_the_nodes_listener_beyond_the_window(setup: Setup) -> None:
    server, local = await _echo()
    async with server:
        link = await setup.link(("127.0.0.1", local))
        assert link.welcome is not None and link.welcome.host == "127.0.0.1"
        port = link.welcome.port
        payload = os.urandom(4 * WINDOW_BYTES + 123)  # needs credit to come back, many times
        results = await asyncio.gather(*(_round_trip(port, payload) for _ in range(3)))
        assert all(r == payload for r in results)
        info = setup.fronting.info()["nodes"]
        assert [n["port"] for n in info] == [port] and info[0]["streams_opened"] == 3


async def test_node_knows_each_fronted_connections_dialer(setup: Setup) -> None:
    """The node's local connection of each stream maps to the dialer's address (what its
    per-caller limits count against), and is forgotten when the stream ends."""
    server, local = await _echo()
    async with server:
        link = await setup.link(("127.0.0.1", local))
        assert await _round_trip(link.welcome.port, b"x") == b"x"
        reader, writer = await asyncio.open_connection("127.0.0.1", link.welcome.port)
        writer.write(b"y")
        assert await reader.readexactly(1) == b"y"
        assert list(link.callers.values()) == ["127.0.0.1"]
        writer.close()
        async with asyncio.timeout(10):
            while link.callers:
                await asyncio.sleep(0.02)


async def test_node_keeps_its_port_across_links(setup: Setup, tmp_path: Path) -> None:
    server, local = await _echo()
    key = SigningKey.generate()
    async with server:
        link = await setup.link(("127.0.0.1", local), key=key)
        port = link.welcome.port
        await link.tunnel.ws.close()  # the link drops: the node dials again
        async with asyncio.timeout(10):
            while link.welcome is None or link.tunnel is None or link.tunnel.ws.closed:
                await asyncio.sleep(0.05)
        assert link.welcome.port == port
        assert await _round_trip(port, b"again") == b"again"
    kept = Fronting(setup.private, setup.fronting.ports, "127.0.0.1", home=tmp_path)
    assert kept.assigned == {key.verify_key.encode().hex(): port}


async def test_limits_refuse_by_name(setup: Setup) -> None:
    server, local = await _echo()
    async with server:
        key = SigningKey.generate()
        await setup.link(("127.0.0.1", local), key=key)
        twice = await setup.link(("127.0.0.1", local), key=key, wait=False)
        await setup.link(("127.0.0.1", local))  # the second from this address
        third = await setup.link(("127.0.0.1", local), wait=False)
        async with asyncio.timeout(10):
            while None in (twice.last_error, third.last_error):
                await asyncio.sleep(0.05)
        assert twice.last_error.startswith("rendezvous_refused") and "already_fronted" in (
            twice.last_error
        )
        assert "too_many_from_address" in third.last_error
        assert len(setup.fronting.nodes) == 2


def test_fronting_admits_no_more_nodes_than_ports(tmp_path: Path) -> None:
    fronting = Fronting(PrivateKey.generate(), (44000, 44001), "h", per_address=9)
    keys = [os.urandom(32).hex() for _ in range(3)]
    assert fronting.admit(keys[0], "a", 0) == 44000
    assert fronting.admit(keys[1], "a", 44000) is RefuseCode.PORT_TAKEN
    assert fronting.admit(keys[1], "a", 44002) is RefuseCode.PORT_TAKEN  # outside the range
    assert fronting.admit(keys[1], "a", 0) == 44001
    assert fronting.admit(keys[2], "a", 0) is RefuseCode.FULL


async def test_relay_without_the_pinned_key_is_not_trusted(setup: Setup) -> None:
    """A node that names another key (an impostor at the relay's URL, from its view) never
    comes up: the relay cannot open its HELLO."""
    server, local = await _echo()
    async with server:
        link = await setup.link(
            ("127.0.0.1", local), relay=setup.relay(key=os.urandom(32)), wait=False
        )
        async with asyncio.timeout(10):
            while link.last_error is None:
                await asyncio.sleep(0.05)
        assert "forged" in link.last_error and link.welcome is None
        assert setup.fronting.nodes == {}


async def test_node_breaking_the_flow_rules_loses_its_link(setup: Setup) -> None:
    """A node that sends past a stream's credit (or any frame that does not open) ends its own
    link, and its port stops answering."""
    server, local = await _echo()
    async with server:
        link = await setup.link(("127.0.0.1", local))
        port = link.welcome.port
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(10):
            while not link.tunnel.streams:
                await asyncio.sleep(0.02)
        ident = next(iter(link.tunnel.streams))
        chunk = Frame(FrameKind.DATA, ident, b"x" * 16384)
        for _ in range(WINDOW_BYTES // 16384 + 1):  # one DATA past the window
            await link.tunnel.send(chunk)
        async with asyncio.timeout(10):
            while setup.fronting.nodes:
                await asyncio.sleep(0.02)
        writer.close()


async def test_hello_replayed_to_the_relay_is_refused(setup: Setup) -> None:
    async with setup.http.ws_connect(setup.url + "/v1/rendezvous") as ws:
        challenge = Challenge.from_bytes(await ws.receive_bytes())
    relay_key = bytes(setup.private.public_key)
    hello, _ = make_hello(SigningKey.generate(), relay_key, challenge, 0)
    async with setup.http.ws_connect(setup.url + "/v1/rendezvous") as ws:
        await ws.receive_bytes()  # a fresh challenge
        await ws.send_bytes(hello.to_bytes())
        answer = await ws.receive_bytes()
    assert answer[:2] == bytes([0xFF, RefuseCode.FORGED])
    assert Sealer(os.urandom(32), TO_RELAY).sequence == 0


async def test_fronted_caller_is_the_dialer_only_for_a_fronted_connection() -> None:
    """The node's handlers count a fronted connection against its dialer: its local port is in
    the callers map; any other connection keeps its own address."""
    from node.server.rendezvous import CALLERS_KEY, fronted_caller

    callers: dict[int, str] = {}
    app = web.Application()
    app[CALLERS_KEY] = callers

    async def who(request: web.Request) -> web.Response:
        return web.Response(text=fronted_caller(request) or f"direct {request.remote}")

    app.router.add_get("/who", who)
    runner = web.AppRunner(app)
    await runner.setup()
    port = ephemeral_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        callers[writer.get_extra_info("sockname")[1]] = "203.0.113.9"
        writer.write(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).endswith(b"203.0.113.9")
        writer.close()
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/who") as answer,
        ):
            assert await answer.text() == "direct 127.0.0.1"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "port", ["", "0", "65536", "-1", "+80", " 80", "８０", "٨٠", "1e3", "0x50", "9" * 100]
)
async def test_dialback_refuses_a_port_a_stranger_sends_and_keeps_answering(port: str) -> None:
    """`/v1/dialback?port=` takes 1..65535 in ASCII digits only, refuses anything else as
    `bad_port` without dialling, and answers the next asker."""
    app = web.Application()
    app.router.add_get("/v1/dialback", dialback)
    async with TestClient(TestServer(app)) as client:
        refused = await client.get("/v1/dialback", params={"port": port})
        assert refused.status == 400
        assert (await refused.json())["code"] == "bad_port"
        with socket.socket() as listener:  # a port that is open on the asker's own address
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            open_port = listener.getsockname()[1]
            answer = await client.get("/v1/dialback", params={"port": str(open_port)})
            assert answer.status == 200
            doc = await answer.json()
            assert doc == {"address": "127.0.0.1", "port": open_port, "reachable": True}


@pytest.mark.parametrize(
    "text",
    [
        *("", "44000", "44000-", "-44063", "４４０００-44063", "44000-4406٣", "80-90"),
        *("44063-44000", "40000-50000", "44000--44063", "44000-44063-1"),
    ],
)
def test_rendezvous_ports_that_are_not_a_range_of_ascii_ports_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_port_range(text)
    assert parse_port_range("44000-44063") == (44000, 44063)
