"""Streams against strangers and overload (fake shards, real WebSockets on loopback):
back-pressure answers `busy` by name while KV memory stays under the cap, a full compute queue
answers `busy`, a feed token cannot close or read a session, malformed control and data get
named refusals and the node keeps serving."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

import node.server.stream
from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.server.app import STATE_KEY
from node.server.config import ServerConfig
from node.server.next_hops import ForwardAny, ForwardNone
from protocol.errors import BusyError, ConfigError, RemoteError
from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.header import FrameHeader, pack_frame, parse_frame
from protocol.stream import MAX_SESSION_FRAMES, NextHop, open_message
from tests.doubles.fake_shard import FakeShard
from tests.unit.fake_head import FakeHead, H
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit


class _SlowShard(FakeShard):
    def forward(self, hidden, positions, cache):
        time.sleep(0.02)
        return super().forward(hidden, positions, cache)


async def _nodes(aiohttp_server, count: int, shard_cls=FakeShard, **config: Any):
    return await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=Path("x"), shard_id=shard, **config),
                shard_cls(shard_id=shard, hidden_size=H, layers=(2 * shard, 2 * shard + 2)),
            )
            for shard in range(count)
        ],
    )


async def _generate(client: CircuitClient, prompt: list[int], n: int) -> list[int]:
    gen = client.generate(FakeHead(), prompt, max_new_tokens=n, stop_on_eos=False)
    return [t async for t in gen]


async def test_stream_fake_chain_adds_every_shards_offset(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 3)
    async with CircuitClient(hops, hidden_size=H, prefill_chunk=2) as client:
        tokens = await _generate(client, [1, 2, 3, 4, 5], 4)
    assert tokens == [11, 17, 23, 29]  # each pass adds 1 + 2 + 3


async def test_stream_kv_cap_answers_busy_and_memory_stays_under_cap(aiohttp_server):
    cap = 40 * 1024  # FakeShard: 1024 bytes per position -> 40 positions
    servers, hops = await _nodes(
        aiohttp_server, 2, max_cache_bytes=cap, max_cache_bytes_per_peer=cap
    )
    stores = [s.app[STATE_KEY].store for s in servers]
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max([peak, *(s.total_cache_bytes for s in stores)])
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    async with CircuitClient(hops, hidden_size=H) as client:
        results = await asyncio.gather(
            *(_generate(client, list(range(1, 13)), 8) for _ in range(6)), return_exceptions=True
        )
        watcher.cancel()
        busy = [r for r in results if isinstance(r, BusyError)]
        assert busy and all(isinstance(r, (list, BusyError)) for r in results), results
        assert "KV cache" in busy[0].message  # refused by name, not by running out of memory
        assert peak <= cap
        assert peak > 0  # the watcher saw the caches fill
        assert await _generate(client, [1, 2], 3) == [5, 8, 11]  # still serving


async def test_stream_full_queue_answers_busy_then_serves(aiohttp_server):
    _, hops = await _nodes(
        aiohttp_server,
        1,
        _SlowShard,
        max_queued=2,
        max_batch=1,
        max_inflight_per_peer=64,
        max_sessions_per_peer=64,
    )
    async with CircuitClient(hops, hidden_size=H) as client:
        results = await asyncio.gather(
            *(_generate(client, [1, 2, 3], 3) for _ in range(12)), return_exceptions=True
        )
        assert any(isinstance(r, BusyError) and "queue" in r.message for r in results), results
        assert await _generate(client, [1], 2) == [2, 3]


async def test_stream_pipelined_prefill_counts_a_session_once_against_the_caller_quota(
    aiohttp_server,
):
    """Two questions from one caller, each prompt in 12 one-position chunks with 8 outstanding:
    16 frames in flight from a caller whose quota is 2 — but they are 2 sessions."""
    _, reference_hops = await _nodes(aiohttp_server, 2)
    async with CircuitClient(reference_hops, hidden_size=H) as client:
        expected = await _generate(client, list(range(1, 13)), 4)
    _, hops = await _nodes(aiohttp_server, 2, _SlowShard, max_inflight_per_peer=2)
    async with CircuitClient(hops, hidden_size=H, prefill_chunk=1, prefill_window=8) as client:
        results = await asyncio.gather(*(_generate(client, list(range(1, 13)), 4) for _ in "ab"))
    assert results == [expected, expected]
    with pytest.raises(ConfigError, match="prefill_window"):
        CircuitClient(hops, hidden_size=H, prefill_window=MAX_SESSION_FRAMES + 1)


async def test_stream_session_with_too_many_frames_queued_is_refused_by_name(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 1, _SlowShard, max_inflight_per_peer=64)
    head = FakeHead()
    async with CircuitClient(hops, hidden_size=H) as client:
        sid = await client.open("s" * 43)
        for position in range(MAX_SESSION_FRAMES + 4):  # no waiting for answers
            await client.send(sid, position, head.embed_np([position + 1]))
        with pytest.raises(BusyError, match="per-session limit 16"):
            for position in range(MAX_SESSION_FRAMES + 4):
                await client.receive(sid, position, 1)
        await client.close(sid)
        assert await _generate(client, [1], 2) == [2, 3]  # the node keeps serving


async def test_stream_feed_token_cannot_close_or_read_the_session(aiohttp_server):
    servers, hops = await _nodes(aiohttp_server, 2)
    async with CircuitClient(hops, hidden_size=H) as client, aiohttp.ClientSession() as http:
        secret = "s" * 43
        sid = await client.open(secret)
        feed = client.feeds(secret)[1]  # what hop 0 knows about hop 1
        async with http.ws_connect(f"{hops[1].url}/v1/stream") as ws:
            await ws.send_json({"op": "attach", "sid": 7, "feed": feed})
            assert json.loads((await ws.receive()).data) == {"op": "attached", "sid": 7}
            await ws.send_json({"op": "close", "sid": 7})
            refused = json.loads((await ws.receive()).data)
            assert refused["code"] == "unknown_stream"
            # positions fed through the feed flow on; the output goes to the client, not here
            await ws.send_bytes(pack_frame(FrameHeader(7, 0, 1, "float32", "raw"), bytes(4 * H)))
            with pytest.raises(asyncio.TimeoutError):
                await ws.receive(timeout=0.3)
        assert len(servers[1].app[STATE_KEY].store) == 1  # the session is still open
        await client.close(sid)


def _frame(start: int = 0, count: int = 1, dtype: int = 0, codec: int = 0, flags: int = 0) -> bytes:
    """A frame header for sid 1 with any field values (the body is added by the caller)."""
    return struct.pack(">BBIIIBBB", 1, 1, 1, start, count, dtype, codec, flags)


def _open(**over: object) -> str:
    body: dict[str, object] = {
        "op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None, "next": None,
    }  # fmt: skip
    return json.dumps({**body, **over})


# every malformed class, in control messages and in frames, gets a named refusal
MALFORMED: list[tuple[str | bytes, str]] = [
    ("not json", "bad_control"),
    (json.dumps({"op": "launch", "sid": 1}), "bad_control"),
    (json.dumps({"op": "close", "sid": -1}), "bad_control"),
    (json.dumps({"op": "close", "sid": 2**64}), "bad_control"),
    (json.dumps({"op": "close", "sid": 1.0}), "bad_control"),
    (json.dumps({"op": "close", "sid": True}), "bad_control"),
    ('{"op": "close", "sid": NaN}', "bad_control"),
    (json.dumps({"op": "close", "sid": 1, "extra": 1}), "bad_control"),
    (json.dumps({"op": "attach", "sid": 1, "feed": "x" * 30}), "bad_feed"),
    (json.dumps({"op": "attach", "sid": 1, "feed": "short"}), "bad_control"),
    ("[" * 100 + "]" * 100, "bad_control"),
    ('{"op": "close", "sid": ' + "[" * 900 + "]" * 900 + "}", "bad_control"),
    (_open(session="é" * 30), "bad_control"),
    (_open(session=None), "bad_control"),
    (_open(session="abcdefgh"), "bad_control"),
    (_open(session=["c" * 43]), "bad_control"),
    (_open(shard=2**70), "bad_control"),
    (_open(shard=[0]), "bad_control"),
    (_open(shard={"a": 1}), "bad_control"),
    (_open(feed="f" * 17000), "too_large"),
    (json.dumps({"op": "pay", "sid": 1, "credit": [1, "ab", []]}), "bad_control"),
    (json.dumps({"op": "pay", "sid": 1, "credit": "a credit"}), "bad_control"),
    (
        json.dumps({"op": "pay", "sid": 1, "credit": [1, "ab" * 81, [["A" * 40, "cd"]]]}),
        "bad_control",  # the retired RSA form: refused at the boundary, nothing looked up
    ),
    (_open(next={"url": "http://127.0.0.1:1", "shard": 1}), "bad_control"),
    (_frame(start=2**32 - 1) + bytes(4 * H), "bad_positions"),
    (_frame(count=0), "bad_positions"),
    (_frame(count=5000), "too_large"),
    (_frame(flags=0x80) + bytes(4 * H), "bad_header"),
    (_frame() + bytes(4 * H - 1), "bad_body"),
    (_frame() + bytes(4 * H + 1), "bad_body"),
    (_frame(dtype=1) + bytes(4 * H), "bad_body"),  # float16 rows are half as long
    (_frame(codec=2) + bytes(8), "bad_body"),
]


@pytest.mark.parametrize(
    ("message", "code"),
    [
        *MALFORMED,
        (json.dumps({"op": "launch", "sid": 1}), "bad_control"),
        (json.dumps({"op": "close", "sid": -1}), "bad_control"),
        (json.dumps({"op": "attach", "sid": 1, "feed": "x" * 30}), "bad_feed"),
        (json.dumps({"op": "attach", "sid": 1, "feed": "short"}), "bad_control"),
        ("[" * 100 + "]" * 100, "bad_control"),
        (
            json.dumps(
                {
                    "op": "open",
                    "sid": 1,
                    "session": "c" * 43,
                    "shard": 0,
                    "feed": None,
                    "next": {"url": "file:///etc/passwd", "shard": 1, "feed": "f" * 43},
                }
            ),
            "bad_route",
        ),
        (
            json.dumps(
                {
                    "op": "open",
                    "sid": 1,
                    "session": "c" * 43,
                    "shard": 3,
                    "feed": None,
                    "next": None,
                }
            ),
            "wrong_shard",
        ),
        (b"\x01\x01" + bytes(8) + (1).to_bytes(4, "big") + bytes(3 + 4 * H), "unknown_stream"),
        (b"\x01\x01" + bytes(4) + bytes(4) + (1).to_bytes(4, "big") + b"\x00\x00\x00", "bad_body"),
        (b"\x02\x01" + bytes(15), "bad_header"),
        (b"\x01\x01" + bytes(12) + b"\x09\x00\x00", "bad_dtype"),
        (b"\x01\x01" + bytes(12) + b"\x00\x09\x00", "bad_codec"),
        (b"\x01", "bad_header"),
    ],
)
async def test_stream_malformed_message_named_refusal_and_node_keeps_serving(
    aiohttp_server, monkeypatch, message, code
):
    monkeypatch.setattr(node.server.stream, "ATTACH_WAIT_S", 0.2)  # a bogus feed waits this long
    _, hops = await _nodes(aiohttp_server, 1)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        if isinstance(message, bytes):
            await ws.send_bytes(message)
        else:
            await ws.send_str(message)
        answer = json.loads((await ws.receive(timeout=5)).data)
        assert answer["op"] == "error" and answer["code"] == code, answer
    async with CircuitClient(hops, hidden_size=H) as client:
        assert await _generate(client, [1, 2], 2) == [3, 4]


async def test_stream_gap_in_positions_is_named_to_the_client(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 2)
    async with CircuitClient(hops, hidden_size=H) as client:
        sid = await client.open("g" * 43)
        await client.send(sid, 0, np.ones((1, 2, H), dtype=np.float32))
        await client.receive(sid, 1, 1)
        await client.send(sid, 5, np.ones((1, 1, H), dtype=np.float32))
        with pytest.raises(RemoteError) as refused:
            await client.receive(sid, 5, 1)
        assert refused.value.code == "bad_positions"
        await client.close(sid)


def test_stream_data_rq_body_checked_against_its_bounds_not_one_size():
    from protocol.errors import PlanetError
    from protocol.frames import rq
    from protocol.frames.codecs import decode_values, encode_body
    from protocol.frames.header import parse_frame

    x = np.random.default_rng(3).standard_normal((1, 3, H)).astype(np.float32)
    body = encode_body(x, "float32", "rq")
    header, view = parse_frame(pack_frame(FrameHeader(7, 0, 3, "float32", "rq"), body), H, 64)
    y = decode_values(header.dtype, header.codec, (1, 3, H), view)
    assert header.codec == "rq" and y.shape == x.shape
    low, _ = rq.body_bounds(3, H)
    with pytest.raises(PlanetError):
        parse_frame(pack_frame(FrameHeader(7, 0, 3, "float32", "rq"), body[: low - 1]), H, 64)


# ------------------------------------------------------------------------------ next hops
class Canary:
    """A listening socket that records every connection made to it (nothing may dial it)."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def _open(next_url: str, shard: int = 1) -> dict:
    nxt = {"url": next_url, "shard": shard, "feed": "f" * 43}
    return {"op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None, "next": nxt}


async def _ask_open(hop: Hop, body: dict) -> dict:
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hop.url}/v1/stream") as ws:
        await ws.send_json(body)
        return json.loads((await ws.receive(timeout=5)).data)


@pytest.mark.parametrize("policy", ["list", "none"])
async def test_stream_next_hop_not_allowed_refused_by_name_and_nothing_dialled(
    aiohttp_server, policy
):
    servers, hops = await _nodes(aiohttp_server, 2)
    state = servers[0].app[STATE_KEY]
    if policy == "none":
        state.next_hops = ForwardNone(0)
    canary = Canary()
    async with canary as url:
        # the canary by its own URL and by other spellings of the same host:port
        for spelling in (url, url.replace("127.0.0.1", "127.0.0.1.") + "/", url.upper()):
            answer = await _ask_open(hops[0], _open(spelling))
            assert answer["op"] == "error" and answer["code"] == "next_hop_not_allowed", answer
        await asyncio.sleep(0.2)  # a dial, had one started, would have reached the canary
        assert canary.connections == 0
        assert len(state.store) == 0  # no session was left open either
    if policy == "none":
        assert "forwards to no next hop" in answer["message"]
        with pytest.raises(RemoteError) as error:
            async with CircuitClient(hops, hidden_size=H) as client:
                await _generate(client, [1, 2], 2)
        assert error.value.code == "next_hop_not_allowed"
        async with CircuitClient(hops[:1], hidden_size=H) as client:  # still serves as last hop
            assert await _generate(client, [1, 2], 2) == [3, 4]
    else:  # the circuit's own next hop is still allowed and gives the same tokens
        async with CircuitClient(hops, hidden_size=H) as client:
            assert await _generate(client, [1, 2, 3], 3) == [6, 9, 12]  # + 1 + 2


async def test_stream_canary_sees_the_dial_when_any_hop_is_allowed(aiohttp_server):
    """The control for the test above: with `any` the same open does reach the canary."""
    servers, hops = await _nodes(aiohttp_server, 1)
    servers[0].app[STATE_KEY].next_hops = ForwardAny(0)
    canary = Canary()
    async with canary as url:
        answer = await _ask_open(hops[0], _open(url))
        assert answer["code"] == "downstream_unavailable", answer
        assert canary.connections >= 1


async def test_stream_next_hop_refused_on_a_wrong_shard_claim(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 3)
    answer = await _ask_open(hops[0], _open(hops[2].url, shard=2))  # skipping shard 1
    assert answer["code"] == "next_hop_not_allowed" and "comes 1" in answer["message"]


async def _attach(ws: aiohttp.ClientWebSocketResponse, sid: int, feed: str) -> None:
    await ws.send_str(json.dumps({"op": "attach", "sid": sid, "feed": feed}))


async def test_stream_attach_before_the_open_waits_for_it(aiohttp_server):
    """Opens go to every hop at once, so an upstream's attach can overtake the client's open."""
    _, hops = await _nodes(aiohttp_server, 2)
    feed = "f" * 43
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[1].url}/v1/stream") as up:
        await _attach(up, 7, feed)  # before the session exists
        async with http.ws_connect(f"{hops[1].url}/v1/stream") as client:
            open_body = {
                "op": "open", "sid": 1, "session": "c" * 43, "shard": 1, "feed": feed,
                "next": None,
            }  # fmt: skip
            await client.send_str(json.dumps(open_body))
            assert json.loads((await client.receive(timeout=5)).data)["op"] == "opened"
            assert json.loads((await up.receive(timeout=5)).data) == {"op": "attached", "sid": 7}


async def test_stream_waiting_attaches_are_bounded_per_link(aiohttp_server, monkeypatch):
    monkeypatch.setattr(node.server.stream, "MAX_ATTACH_WAITS", 3)
    _, hops = await _nodes(aiohttp_server, 1)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        for sid in range(1, 5):
            await _attach(ws, sid, f"{sid}" * 43)
        answer = json.loads((await ws.receive(timeout=4)).data)  # the 4th, at once
        assert answer["op"] == "error" and answer["code"] == "bad_feed", answer
        assert answer["sid"] == 4 and "3 attaches already wait" in answer["message"]
    async with CircuitClient(hops, hidden_size=H) as client:
        assert await _generate(client, [1, 2], 2) == [3, 4]


async def test_stream_open_fails_with_the_first_refusal_not_the_upstream_wait(
    aiohttp_server, monkeypatch
):
    """Hop 1 is full and refuses its open at once; hop 0 opened and waits (30 s here) for an
    attach that will never be answered. The client raises hop 1's refusal without waiting."""
    monkeypatch.setattr(node.server.stream, "ATTACH_WAIT_S", 30.0)
    _, hops = await _nodes(aiohttp_server, 2, max_sessions=1)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[1].url}/v1/stream") as ws:
        squat = {"op": "open", "sid": 1, "session": "q" * 43, "shard": 1, "feed": None}
        await ws.send_str(json.dumps({**squat, "next": None}))
        assert json.loads((await ws.receive(timeout=5)).data)["op"] == "opened"
        async with CircuitClient(hops, hidden_size=H) as client:
            async with asyncio.timeout(10):  # not hop 0's 30 s attach wait
                with pytest.raises(BusyError):
                    await client.open("s" * 43)


async def _next_control(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    message = await ws.receive(timeout=10)
    assert message.type == aiohttp.WSMsgType.TEXT, message.type
    return json.loads(message.data)


async def test_stream_frames_right_behind_the_opens_flow_through_a_late_hop(aiohttp_server):
    """A client sends the opens and the prompt without waiting for `opened` (the first token
    then costs the data path only): hop 0 computes the frame while its attach is on its way and
    forwards it behind the attach; hop 1, whose open from the client comes last, holds that
    frame until its open arrives. The output comes from the last hop, once, with every shard's
    offset; no hop refuses a frame or answers it as if it were last."""
    _, hops = await _nodes(aiohttp_server, 3)
    caps, feeds = ["a" * 43, "b" * 43, "c" * 43], [None, "e" * 43, "g" * 43]

    def nxt(index: int) -> NextHop | None:
        if index == 2:
            return None
        return NextHop(url=hops[index + 1].url, shard=index + 1, feed=feeds[index + 1], key=None)

    hidden = np.arange(3 * H, dtype=np.float32).reshape(1, 3, H)
    frame = pack_frame(
        FrameHeader(1, 0, 3, "float32", "raw", False), encode_body(hidden, "float32", "raw")
    )
    async with aiohttp.ClientSession() as http:
        links = [await http.ws_connect(f"{hop.url}/v1/stream") for hop in hops]
        await links[2].send_json(open_message(1, caps[2], 2, feeds[2], nxt(2)))
        await links[0].send_json(open_message(1, caps[0], 0, None, nxt(0)))
        await links[0].send_bytes(frame)
        await asyncio.sleep(0.3)  # hop 0's attach and its frame reach hop 1 before this open
        await links[1].send_json(open_message(1, caps[1], 1, feeds[1], nxt(1)))
        assert await _next_control(links[2]) == {"op": "opened", "sid": 1}
        message = await links[2].receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.BINARY
        header, body = parse_frame(message.data, H, 16)
        assert (header.sid, header.start, header.count) == (1, 0, 3)
        out = decode_values("float32", "raw", (1, 3, H), body)
        assert np.array_equal(out, hidden + 6)  # + 1 + 2 + 3
        for link in links[:2]:  # each earlier hop answered its open, nothing else
            assert await _next_control(link) == {"op": "opened", "sid": 1}
            with pytest.raises(asyncio.TimeoutError):
                await link.receive(timeout=0.3)
        for link in links:
            await link.close()


async def test_stream_a_refused_open_comes_out_of_the_generation_by_name(aiohttp_server):
    """The generation does not wait for `opened`: a hop that refuses its open (full) fails
    the generation with its refusal by name, and the client blames that hop."""
    from node.client.failover import NO_FAILOVER, FixedCircuit
    from node.client.failover import generate as generate_on

    _, hops = await _nodes(aiohttp_server, 2, max_sessions=1)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[1].url}/v1/stream") as ws:
        squat = {"op": "open", "sid": 1, "session": "q" * 43, "shard": 1, "feed": None}
        await ws.send_str(json.dumps({**squat, "next": None}))
        assert json.loads((await ws.receive(timeout=5)).data)["op"] == "opened"
        async with CircuitClient(hops, hidden_size=H) as client:
            gen = generate_on(
                FixedCircuit(client), FakeHead(), [1, 2], max_new_tokens=2, policy=NO_FAILOVER
            )
            async with asyncio.timeout(10):
                with pytest.raises(BusyError):
                    [t async for t in gen]
            assert client.suspects(1) == {1}


async def test_stream_frames_held_behind_an_open_keep_their_order(aiohttp_server):
    """Hop 0's open is still being handled (its next-hop check ends only once both prompt
    frames have been read off the link): the frames start in the order they came, so the second
    never reaches the session before the first (which was `bad_positions` on a devnet when a
    frame read in the same turn as the check's end overtook one already waiting)."""
    servers, hops = await _nodes(aiohttp_server, 2)
    state = servers[0].app[STATE_KEY]
    policy = state.next_hops
    original = policy.check
    frames = [
        pack_frame(
            FrameHeader(1, start, 2, "float32", "raw", False),
            encode_body(np.full((1, 2, H), start, np.float32), "float32", "raw"),
        )
        for start in (0, 2)
    ]

    async def read_both_first(nxt):
        while state.stream_bytes_in < sum(len(f) for f in frames):
            await asyncio.sleep(0)
        return await original(nxt)

    policy.check = read_both_first
    async with aiohttp.ClientSession() as http:
        links = [await http.ws_connect(f"{hop.url}/v1/stream") for hop in hops]
        feed = "e" * 43
        await links[1].send_json(open_message(1, "b" * 43, 1, feed, None))
        nxt = NextHop(url=hops[1].url, shard=1, feed=feed, key=None)
        await links[0].send_json(open_message(1, "a" * 43, 0, None, nxt))
        for frame in frames:
            await links[0].send_bytes(frame)
            await asyncio.sleep(0.05)  # the first waits for the open; the second comes as it ends
        assert await _next_control(links[1]) == {"op": "opened", "sid": 1}
        for start in (0, 2):
            message = await links[1].receive(timeout=10)
            assert message.type == aiohttp.WSMsgType.BINARY, message.data
            header, body = parse_frame(message.data, H, 16)
            assert (header.start, header.count) == (start, 2)
            assert np.array_equal(
                decode_values("float32", "raw", (1, 2, H), body)[0, :, 0], [start + 3] * 2
            )
        assert await _next_control(links[0]) == {"op": "opened", "sid": 1}
        for link in links:
            await link.close()


async def test_stream_frames_behind_a_bogus_attach_are_held_only_up_to_the_cap(
    aiohttp_server, monkeypatch
):
    """A stranger attaches with a feed no session expects and floods frames behind it: the node
    holds at most MAX_HELD_BYTES of them (5 frames here), refuses the rest at once as unknown,
    refuses the attach by name when its wait ends, then the held ones — and keeps serving."""
    monkeypatch.setattr(node.server.stream, "ATTACH_WAIT_S", 0.5)
    frame = pack_frame(
        FrameHeader(9, 0, 2, "float32", "raw", False),
        encode_body(np.zeros((1, 2, H), np.float32), "float32", "raw"),
    )
    monkeypatch.setattr(node.server.stream, "MAX_HELD_BYTES", 5 * len(frame))
    _, hops = await _nodes(aiohttp_server, 1)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        await _attach(ws, 9, "z" * 43)
        for _ in range(20):
            await ws.send_bytes(frame)
        answers = [await _next_control(ws) for _ in range(21)]
        codes = [(a["op"], a.get("code")) for a in answers]
        assert codes[:15] == [("error", "unknown_stream")] * 15  # not held: refused at once
        assert codes[15] == ("error", "bad_feed")  # the attach, when its wait ends
        assert codes[16:] == [("error", "unknown_stream")] * 5  # the held ones, after it
    async with CircuitClient(hops, hidden_size=H) as client:
        assert await _generate(client, [1, 2], 2) == [3, 4]


async def test_stream_a_session_closed_while_its_frame_awaits_payment_is_not_computed(
    aiohttp_server,
):
    """Issue 44: a paid frame waits for its credits (`payments.cover`) holding the session's
    lock; the client closes the session meanwhile (a client that failed over closes its old
    one). The frame then ends `session_expired` with its positions refunded, and no forward
    runs on the dropped cache (before: the forward got `None` for a cache and the node logged
    `forward failed: ValueError: too many values to unpack` / `ProtocolError`, compute_failed)."""
    servers, hops = await _nodes(aiohttp_server, 1)
    state = servers[0].app[STATE_KEY]
    gate = asyncio.Event()
    waiting = asyncio.Event()
    refunded: list[int] = []

    class Payments:
        async def cover(self, account: Any, count: int) -> None:
            waiting.set()
            await gate.wait()

        def refund(self, account: Any, count: int) -> None:
            refunded.append(count)

    state.payments = Payments()
    caches: list[Any] = []
    forward = state.backend.forward

    def recording(hidden: Any, positions: Any, cache: Any) -> Any:
        caches.append(cache)
        return forward(hidden, positions, cache)

    state.backend.forward = recording
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        body = {"op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None}
        await ws.send_json({**body, "next": None})
        assert await _next_control(ws) == {"op": "opened", "sid": 1}
        await ws.send_bytes(pack_frame(FrameHeader(1, 0, 2, "float32", "raw"), bytes(8 * H)))
        await asyncio.wait_for(waiting.wait(), 10)
        await ws.send_json({"op": "close", "sid": 1})
        await asyncio.sleep(0.2)  # the close is handled while the frame waits
        gate.set()
        answers = [await _next_control(ws)]
        if answers[0].get("op") == "closed":
            answers.append(await _next_control(ws))
    assert answers[-1].get("code") == "session_expired", answers
    assert refunded == [2] and caches == []
