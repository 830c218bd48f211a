"""Compute nodes among strangers: one test per class of issue #13 part 3, on a node's links.

- what one hop learns (its capability, the next hop's feed token) is useless against another
  hop's session, and a public session tag names nothing anyone can act on;
- one caller cannot take every session slot, another caller still gets one;
- a malformed frame never desyncs a session (test_stream_hostile.py: every malformed class
  gets a named refusal and the node keeps serving);
- the client bounds what it reads and names a malformed answer;
- `planet ask` with a bad nodes file prints error:/hint:, exits != 0, no traceback.

Real WebSockets on loopback with fake shards (no model); callers are told apart by their source
address (127.0.0.1 vs 127.0.0.2, both loopback).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from node.client.capabilities import new_session_id
from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from protocol.errors import ProtocolError, RemoteError, UnavailableError
from protocol.frames.codecs import encode_body
from protocol.frames.header import FrameHeader, pack_frame, parse_frame
from protocol.frames.sessions import session_tag
from tests.doubles.fake_shard import FakeShard
from tests.unit.fake_head import FakeHead
from tests.unit.stream_circuit import serve_circuit
from tests.unit.stream_link import Link, Refused

pytestmark = pytest.mark.unit

H = 8
CAP = "hostile-test-capability-0001"


def _app(shard: int = 0, **config: object) -> web.Application:
    backend = FakeShard(shard_id=shard, hidden_size=H, layers=(shard * 2, shard * 2 + 2))
    return create_app(ServerConfig(manifest_path=Path("x"), shard_id=shard, **config), backend)  # type: ignore[arg-type]


def _hidden(count: int, value: float = 1.0) -> np.ndarray:
    return np.full((1, count, H), value, dtype=np.float32)


def _session_for(address: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))


async def _link(http: aiohttp.ClientSession, server) -> Link:
    return Link(await http.ws_connect(str(server.make_url("/v1/stream"))), H)


async def _refused(awaitable) -> Refused:
    with pytest.raises(Refused) as refused:
        await awaitable
    return refused.value


# ------------------------------------------------------------------------- cross-hop hijack
async def test_what_one_hop_learns_cannot_continue_read_or_close_another_hops_session(
    aiohttp_server,
):
    """Hop 0 learns its own capability and hop 1's feed token. With them, on hop 1: opening
    gives the attacker a session of its own (another tag), closing the client's session is
    refused, and a feed's outputs go to the client's link only; the client goes on."""
    nodes = [
        (
            ServerConfig(manifest_path=Path("x"), shard_id=k),
            FakeShard(shard_id=k, hidden_size=H, layers=(2 * k, 2 * k + 2)),
        )
        for k in range(2)
    ]
    servers, hops = await serve_circuit(aiohttp_server, nodes)
    secret = new_session_id()
    async with CircuitClient(hops, hidden_size=H) as client, aiohttp.ClientSession() as http:
        sid = await client.open(secret)
        stolen, feed = client.capabilities(secret)[0], client.feeds(secret)[1]
        victim = client.capabilities(secret)[1]
        assert session_tag(stolen) != session_tag(victim)
        assert secret not in (stolen, victim, feed)  # the secret itself never leaves
        attacker = await _link(http, servers[1])
        assert (await attacker.open(sid + 1, stolen, 1))["op"] == "opened"  # its own session
        assert session_tag(victim) in servers[1].app[STATE_KEY].store
        assert (await _refused(attacker.close(sid))).code == "unknown_stream"
        await attacker.close(sid + 1)
        # the owner goes on undisturbed on both hops: 1 + (1 + 2)
        await client.send(sid, 0, _hidden(3))
        out = await client.receive(sid, 2, 1)
        assert out.shape == (1, 1, H) and float(out[0, 0, 0]) == 1.0 + 1 + 2
        await client.close(sid)
    for _ in range(50):
        if all(len(s.app[STATE_KEY].store) == 0 for s in servers):
            break
        await asyncio.sleep(0.02)
    assert all(len(s.app[STATE_KEY].store) == 0 for s in servers)


async def test_session_tag_logged_by_a_node_cannot_act_on_the_session(aiohttp_server):
    server = await aiohttp_server(_app())
    async with aiohttp.ClientSession() as http:
        owner = await _link(http, server)
        await owner.open(1, CAP, 0)
        await owner.forward(1, 0, _hidden(2))
        store = server.app[STATE_KEY].store
        tag = next(iter(store._sessions))
        assert tag == session_tag(CAP) and CAP not in tag
        stranger = await _link(http, server)
        await stranger.open(1, tag[:64], 0)  # the tag as a capability names another session
        assert session_tag(tag[:64]) != tag and len(store) == 2
        header, _ = await stranger.forward(1, 0, _hidden(1))
        assert header.start == 0  # a fresh session, not the owner's at position 2
        header, _ = await owner.forward(1, 2, _hidden(1))
        assert header.start == 2


# ------------------------------------------------------------------------- slot exhaustion
async def test_one_caller_filling_slots_is_refused_while_another_caller_gets_a_session(
    aiohttp_server,
):
    server = await aiohttp_server(_app())  # default limits
    max_sessions = ServerConfig(manifest_path=Path("x"), shard_id=0).max_sessions
    async with _session_for("127.0.0.1") as attacker:
        link = await _link(attacker, server)
        refused = None
        for i in range(max_sessions):
            try:
                await link.open(i + 1, f"{CAP}-attacker{i:04d}", 0)
            except Refused as error:
                refused = error
                break
        assert refused is not None, "one caller took every slot"
        assert refused.code == "busy" and "quota" in refused.body["message"]
    async with _session_for("127.0.0.2") as honest:
        link = await _link(honest, server)
        assert (await link.open(1, f"{CAP}-honest", 0))["op"] == "opened"


async def test_slots_held_by_idle_refreshes_are_reclaimed_for_a_newcomer(aiohttp_server):
    server = await aiohttp_server(_app(max_sessions=2, reclaim_idle_s=0.0))
    async with _session_for("127.0.0.1") as attacker, _session_for("127.0.0.2") as honest:
        squatter = await _link(attacker, server)
        for i in range(2):
            await squatter.open(i + 1, f"{CAP}-a{i}", 0)
            await squatter.forward(i + 1, 0, _hidden(1))
        newcomer = await _link(honest, server)
        assert (await newcomer.open(1, f"{CAP}-honest", 0))["op"] == "opened"
        # the newcomer does not reclaim from itself: a second one waits
        refused = await _refused(newcomer.open(2, f"{CAP}-honest2", 0))
        assert refused.code == "busy" and "cap 2" in refused.body["message"]


class _SlowShard(FakeShard):
    """Records who was computed (the first value of the frame) and takes 50 ms per frame."""

    def __init__(self) -> None:
        super().__init__(shard_id=0, hidden_size=H, layers=(0, 2))
        self.order: list[float] = []

    def forward(self, hidden, positions, cache):
        self.order.append(float(hidden[0, 0, 0]))
        time.sleep(0.05)
        return super().forward(hidden, positions, cache)


async def test_one_caller_cannot_have_unbounded_sessions_in_flight(aiohttp_server):
    app = create_app(
        ServerConfig(
            manifest_path=Path("x"), shard_id=0, max_inflight_per_peer=2, max_sessions_per_peer=64
        ),
        _SlowShard(),
    )
    server = await aiohttp_server(app)
    async with _session_for("127.0.0.1") as attacker:
        link = await _link(attacker, server)
        for i in range(12):
            await link.open(i + 1, f"{CAP}-q{i:03d}", 0)
        for i in range(12):
            await link.send(i + 1, 0, _hidden(64))
        answers = []
        for _ in range(12):
            try:
                answers.append((await link.frame())[0].count)
            except Refused as refused:
                answers.append(refused.code)
    assert "busy" in answers and 64 in answers, answers


async def test_answer_rejected_after_compute_closes_session_instead_of_desyncing(aiohttp_server):
    server = await aiohttp_server(_app())
    async with aiohttp.ClientSession() as http:
        link = await _link(http, server)
        await link.open(1, CAP, 0)
        await link.forward(1, 0, _hidden(1), dtype="float16")
        overflow = np.full((1, 1, H), 65504.0, dtype=np.float32)
        # the fake shard adds 1: the answer overflows float16 after the cache advanced
        refused = await _refused(link.forward(1, 1, overflow, dtype="float16"))
        assert refused.code == "non_finite"
        refused = await _refused(link.forward(1, 2, _hidden(1), dtype="float16"))
        assert refused.code == "session_expired"


async def test_flooding_caller_does_not_starve_another_callers_frame(aiohttp_server):
    shard = _SlowShard()
    server = await aiohttp_server(
        create_app(ServerConfig(manifest_path=Path("x"), shard_id=0), shard)
    )
    async with _session_for("127.0.0.1") as attacker, _session_for("127.0.0.2") as honest:
        flood = await _link(attacker, server)
        for i in range(6):
            await flood.open(i + 1, f"{CAP}-flood{i}", 0)
        # prefill chunks (8 positions): each runs alone, none is batched with another
        for i in range(6):
            await flood.send(i + 1, 0, _hidden(8, 1.0))
        while not shard.order:  # the flood is queued and computing
            await asyncio.sleep(0.01)
        mine = await _link(honest, server)
        await mine.open(1, f"{CAP}-honest", 0)
        header, _ = await mine.forward(1, 0, _hidden(1, 7.0))
        assert header.count == 1
        for _ in range(6):
            assert (await flood.frame())[0].count == 8
    # served right after the frame computing when it arrived, not behind the whole flood
    assert shard.order.index(7.0) <= 2, shard.order


async def test_frame_trickled_slowly_holds_no_slot_while_others_are_served(aiohttp_server):
    """A stranger upgrades to a link and trickles half a frame: nothing is counted against it
    until the whole message arrived, and another caller is served meanwhile."""
    server = await aiohttp_server(_app(max_inflight_per_peer=1))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"GET /v1/stream HTTP/1.1\r\nHost: n\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await writer.drain()
    status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert b" 101 " in status
    # a masked binary frame announcing 1000 payload bytes, of which only 4 are sent
    writer.write(bytes([0x82, 0x80 | 126]) + (1000).to_bytes(2, "big") + bytes(4) + b"\x01\x01")
    await writer.drain()
    async with aiohttp.ClientSession() as http:
        link = await _link(http, server)
        await link.open(1, CAP, 0)
        header, _ = await link.forward(1, 0, _hidden(2))
        assert header.count == 2
    assert server.app[STATE_KEY].peer_in_flight == {}
    writer.close()


# ------------------------------------------------------------------------- client bounds
def _hostile_node(respond) -> web.Application:
    """A node whose link answers opens properly and each frame with `respond(header)`."""
    app = web.Application()

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                body = json.loads(message.data)
                if body["op"] == "open":
                    await ws.send_json({"op": "opened", "sid": body["sid"]})
            elif message.type == aiohttp.WSMsgType.BINARY:
                header, _ = parse_frame(message.data, H, 1 << 20)
                await ws.send_bytes(respond(header))
        return ws

    app.router.add_get("/v1/stream", stream)
    return app


async def _client_error(aiohttp_server, respond) -> Exception:
    server = await aiohttp_server(_hostile_node(respond))
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=0)
    async with CircuitClient([hop], hidden_size=H, request_timeout_s=1.0) as client:
        with pytest.raises((ProtocolError, UnavailableError)) as caught:
            [t async for t in client.generate(FakeHead(), [1, 2], max_new_tokens=2)]
    return caught.value


def _answer(header: FrameHeader, rows: int, start: int | None = None) -> bytes:
    at = header.start if start is None else start
    out = FrameHeader(header.sid, at, rows, header.dtype, header.codec)
    return pack_frame(out, encode_body(_hidden(rows), header.dtype, header.codec))


async def test_client_oversize_answer_is_named_error(aiohttp_server):
    error = await _client_error(aiohttp_server, lambda h: _answer(h, 5000))
    assert isinstance(error, ProtocolError) and error.code == "bad_answer"


async def test_client_answer_for_other_rows_is_named_error(aiohttp_server):
    error = await _client_error(aiohttp_server, lambda h: _answer(h, 1, start=h.start + 7))
    assert isinstance(error, ProtocolError) and error.code == "bad_answer"
    assert "expected" in error.message


async def test_client_garbage_answer_is_dropped_and_the_wait_named(aiohttp_server):
    error = await _client_error(aiohttp_server, lambda h: b"\x01\x01" + bytes(200))
    assert isinstance(error, UnavailableError) and "no answer from the circuit" in error.message


async def test_client_refusal_from_a_node_is_a_named_remote_error(aiohttp_server):
    server = await aiohttp_server(_app(shard=0))
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=1)  # the node serves shard 0
    async with CircuitClient([hop], hidden_size=H) as client:
        with pytest.raises(RemoteError) as caught:
            await client.open(new_session_id())
    assert caught.value.code == "wrong_shard" and caught.value.http_status == 502


async def test_client_info_not_an_object_is_named_error(aiohttp_server):
    app = web.Application()

    async def info(request):
        return web.json_response([1, 2, 3])

    app.router.add_get("/info", info)
    server = await aiohttp_server(app)
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=0)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ProtocolError) as caught:
            await check_circuit(http, [hop], "sha256:" + "0" * 64, 2)
    assert caught.value.code == "bad_answer"


# ------------------------------------------------------------------------- CLI
def test_ask_nodes_directory_prints_error_and_hint_without_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "planet", "ask", "hello", "--nodes", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error:") and "\nhint:" in done.stderr


GARBLED = {
    "not_json": b"{nodes",
    "not_utf8": b'{"manifest": "\xff"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "list": b"[1, 2]",
    "nodes_object": b'{"manifest": "m.json", "nodes": {"url": 1}}',
    "float_shard": b'{"manifest": "m.json", "nodes": [{"url": "http://h:1", "shard": 1.5, '
    b'"layers": [0, 2]}]}',
    "bad_url": b'{"manifest": "m.json", "nodes": [{"url": "ftp://h", "shard": 0, '
    b'"layers": [0, 2]}]}',
    "bad_port": b'{"manifest": "m.json", "nodes": [{"url": "http://h:99999", "shard": 0, '
    b'"layers": [0, 2]}]}',
    "manifest_number": b'{"manifest": 7, "nodes": []}',
}


@pytest.mark.parametrize("name", list(GARBLED))
def test_ask_garbled_nodes_file_is_error_and_hint(tmp_path, capsys, name):
    from planet.main import main

    path = tmp_path / "nodes.json"
    path.write_bytes(GARBLED[name])
    status = main(["ask", "hello", "--nodes", str(path)])
    err = capsys.readouterr().err
    assert status != 0 and err.startswith("error:") and "\nhint:" in err


def test_ask_nodes_file_naming_a_directory_as_manifest_is_error(tmp_path, capsys):
    from planet.main import main

    path = tmp_path / "nodes.json"
    nodes = [{"url": "http://127.0.0.1:1", "shard": 0, "layers": [0, 2]}]
    path.write_text(json.dumps({"manifest": str(tmp_path), "nodes": nodes}))
    assert main(["ask", "hello", "--nodes", str(path)]) != 0
    assert capsys.readouterr().err.startswith("error:")
