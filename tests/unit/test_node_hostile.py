"""Compute nodes among strangers: one test per class of issue #13 part 3.

- a capability one hop holds is useless against any other hop's session;
- one caller cannot take every session slot, another caller still gets one;
- each malformed frame class gets a named 4xx, never a 500, and never desyncs a session;
- the client bounds what it reads and names a malformed answer (ProtocolError);
- `planet ask` with a bad nodes file prints error:/hint:, exits != 0, no traceback.

Real HTTP on loopback with fake shards (no model); callers are told apart by their source
address (127.0.0.1 vs 127.0.0.2, both loopback).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from node.client.pipeline import Hop, PipelineClient, new_session_id
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from protocol.errors import ProtocolError
from protocol.frames import MAGIC, make_frame, parse_frame
from tests.doubles.fake_shard import FakeShard

pytestmark = pytest.mark.unit

H = 8
CAP = "hostile-test-capability-0001"


def _app(shard: int = 0, **config: object) -> web.Application:
    backend = FakeShard(shard_id=shard, hidden_size=H, layers=(shard * 2, shard * 2 + 2))
    return create_app(ServerConfig(manifest_path=Path("x"), shard_id=shard, **config), backend)  # type: ignore[arg-type]


def _hidden(count: int, value: float = 1.0) -> np.ndarray:
    return np.full((1, count, H), value, dtype=np.float32)


def _frame(start: int, count: int, *, session: str = CAP, shard: int = 0, **kw: object) -> bytes:
    return make_frame(_hidden(count), session=session, step=start, start=start, shard=shard, **kw)  # type: ignore[arg-type]


def _session_for(address: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))


# ------------------------------------------------------------------------- cross-hop hijack
async def test_capability_seen_by_one_hop_cannot_continue_read_or_close_another_hops_session(
    aiohttp_server,
):
    seen: list[list[str]] = [[], []]
    servers = []
    for shard in range(2):
        app = _app(shard)

        @web.middleware
        async def record(request, handler, _seen=seen[shard]):
            if request.path == "/v1/forward":
                _seen.append(parse_frame(await request.read()).header.session)
            return await handler(request)

        app.middlewares.insert(0, record)
        servers.append(await aiohttp_server(app))
    hops = [Hop(url=str(s.make_url("")).rstrip("/"), shard=i) for i, s in enumerate(servers)]
    secret = new_session_id()
    async with PipelineClient(hops) as client:
        await client.run_layers(secret, 0, 0, _hidden(3))
        stolen = seen[0][0]  # all that node 0 ever learns about this session
        victim = hops[1].url
        async with aiohttp.ClientSession() as http:
            # append to / read through node 1's session with node 0's capability
            answer = await http.post(
                f"{victim}/v1/forward", data=_frame(3, 1, session=stolen, shard=1)
            )
            assert answer.status == 404 and (await answer.json())["code"] == "unknown_session"
            # close node 1's session with node 0's capability
            answer = await http.delete(f"{victim}/v1/sessions/{stolen}")
            assert answer.status == 200 and (await answer.json())["closed"] is False
        assert len(servers[1].app[STATE_KEY].store) == 1
        assert stolen != seen[1][0]
        assert secret not in (seen[0][0], seen[1][0])  # the secret itself never leaves
        # the owner goes on undisturbed on both hops
        out = await client.run_layers(secret, 1, 3, _hidden(1))
        assert out.shape == (1, 1, H) and float(out[0, 0, 0]) == 1.0 + 1 + 2
        await client.close_session(secret)
    assert all(len(s.app[STATE_KEY].store) == 0 for s in servers)


async def test_session_tag_logged_by_a_node_cannot_act_on_the_session(aiohttp_server):
    from protocol.frames import session_tag

    server = await aiohttp_server(_app())
    async with aiohttp.ClientSession() as http:
        url = str(server.make_url("/v1/forward"))
        assert (await http.post(url, data=_frame(0, 2))).status == 200
        tag = next(iter(server.app[STATE_KEY].store._sessions))
        assert tag == session_tag(CAP) and CAP not in tag
        answer = await http.post(url, data=_frame(2, 1, session=tag[:64]))
        assert answer.status == 404


# ------------------------------------------------------------------------- slot exhaustion
async def test_one_caller_filling_slots_is_refused_while_another_caller_gets_a_session(
    aiohttp_server,
):
    server = await aiohttp_server(_app())  # default limits
    url = str(server.make_url("/v1/forward"))
    max_sessions = ServerConfig(manifest_path=Path("x"), shard_id=0).max_sessions
    async with _session_for("127.0.0.1") as attacker:
        statuses = []
        for i in range(max_sessions):
            answer = await attacker.post(url, data=_frame(0, 1, session=f"{CAP}-attacker{i:04d}"))
            statuses.append(answer.status)
            if answer.status != 200:
                body = await answer.json()
                assert body["code"] == "busy" and "quota" in body["message"]
                break
        assert statuses[-1] == 429, "one caller took every slot"
    async with _session_for("127.0.0.2") as honest:
        answer = await honest.post(url, data=_frame(0, 1, session=f"{CAP}-honest"))
        assert answer.status == 200


async def test_slots_held_by_idle_refreshes_are_reclaimed_for_a_newcomer(aiohttp_server):
    server = await aiohttp_server(_app(max_sessions=2, reclaim_idle_s=0.0))
    url = str(server.make_url("/v1/forward"))
    async with _session_for("127.0.0.1") as attacker:
        for i in range(2):
            assert (
                await attacker.post(url, data=_frame(0, 1, session=f"{CAP}-a{i}"))
            ).status == 200
    async with _session_for("127.0.0.2") as honest:
        answer = await honest.post(url, data=_frame(0, 1, session=f"{CAP}-honest"))
        assert answer.status == 200
        # the newcomer does not reclaim from itself: a second one waits
        answer = await honest.post(url, data=_frame(0, 1, session=f"{CAP}-honest2"))
        assert answer.status == 503 and (await answer.json())["code"] == "busy"


async def test_one_caller_cannot_queue_unbounded_frames(aiohttp_server):
    import asyncio

    server = await aiohttp_server(_app(max_inflight_per_peer=2, max_sessions_per_peer=64))
    url = str(server.make_url("/v1/forward"))
    async with _session_for("127.0.0.1") as attacker:
        answers = await asyncio.gather(
            *(attacker.post(url, data=_frame(0, 64, session=f"{CAP}-q{i:03d}")) for i in range(12))
        )
        codes = {a.status for a in answers}
    assert 429 in codes and 200 in codes


# ------------------------------------------------------------------------- malformed frames
def _raw(header: object, body: bytes = b"", *, raw_header: bytes | None = None) -> bytes:
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack(">4sHI", MAGIC, 1, len(head)) + head + body


def _header(**over: object) -> dict:
    base = {
        "session": CAP,
        "step": 0,
        "positions": {"start": 0, "count": 1},
        "dtype": "float32",
        "shape": [1, 1, H],
        "codec": "raw",
        "shard": 0,
    }
    base.update(over)
    return base


MALFORMED = {
    "dtype_list": (_raw(_header(dtype=["float32"]), bytes(32)), "bad_dtype"),
    "dtype_object": (_raw(_header(dtype={"a": 1}), bytes(32)), "bad_dtype"),
    "codec_object": (_raw(_header(codec={"raw": 1}), bytes(32)), "bad_codec"),
    "deep_nesting": (_raw(None, raw_header=b"[" * 2000 + b"]" * 2000), "bad_header"),
    "deep_in_field": (
        _raw(None, raw_header=b'{"step":' + b"[" * 900 + b"]" * 900 + b"}"),
        "bad_header",
    ),
    "nan_constant": (_raw(None, raw_header=b'{"step": NaN}'), "bad_header"),
    "huge_step": (_raw(_header(step=10**300), bytes(32)), "bad_header"),
    "huge_shard": (_raw(_header(shard=2**70), bytes(32)), "bad_header"),
    "huge_hidden": (_raw(_header(shape=[1, 1, 2**62]), bytes(32)), "bad_shape"),
    "huge_start": (
        _raw(_header(positions={"start": 2**64, "count": 1}), bytes(32)),
        "bad_positions",
    ),
    "float_count": (
        _raw(_header(positions={"start": 0, "count": 1.0}), bytes(32)),
        "bad_positions",
    ),
    "non_ascii_session": (_raw(_header(session="é" * 30), bytes(32)), "bad_session_id"),
    "short_session": (_raw(_header(session="abcdefgh"), bytes(32)), "bad_session_id"),
    "null_session": (_raw(_header(session=None), bytes(32)), "bad_session_id"),
    "non_utf8_header": (_raw(None, raw_header=b'{"s\xff": 1}'), "bad_header"),
    "utf16_header": (_raw(None, raw_header=json.dumps(_header()).encode("utf-16")), "bad_header"),
    "truncated_body": (_raw(_header(), bytes(31)), "bad_body"),
    "oversize_body": (_raw(_header(), bytes(33)), "bad_body"),
    "header_longer_than_frame": (struct.pack(">4sHI", MAGIC, 1, 4000) + b"{}", "bad_header"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
async def test_malformed_frame_class_gets_named_4xx_and_node_keeps_serving(aiohttp_client, name):
    client = await aiohttp_client(_app())
    data, code = MALFORMED[name]
    answer = await client.post("/v1/forward", data=data)
    body = await answer.json()
    assert 400 <= answer.status < 500 and body["code"] == code, body
    assert (await client.post("/v1/forward", data=_frame(0, 1))).status == 200


async def test_answer_rejected_after_compute_closes_session_instead_of_desyncing(aiohttp_client):
    client = await aiohttp_client(_app())
    assert (await client.post("/v1/forward", data=_frame(0, 1, dtype="float16"))).status == 200
    overflow = make_frame(
        np.full((1, 1, H), 65504.0, dtype=np.float32),
        session=CAP,
        step=1,
        start=1,
        shard=0,
        dtype="float16",
    )  # the fake shard adds 1: the answer overflows float16 after the cache advanced
    answer = await client.post("/v1/forward", data=overflow)
    assert answer.status == 400 and (await answer.json())["code"] == "non_finite"
    answer = await client.post("/v1/forward", data=_frame(2, 1, dtype="float16"))
    assert answer.status == 410 and (await answer.json())["code"] == "session_expired"


class _SlowShard(FakeShard):
    """Records who was computed (the first value of the frame) and takes 50 ms per frame."""

    def __init__(self) -> None:
        super().__init__(shard_id=0, hidden_size=H, layers=(0, 2))
        self.order: list[float] = []

    def forward(self, hidden, positions, cache):
        import time

        self.order.append(float(hidden[0, 0, 0]))
        time.sleep(0.05)
        return super().forward(hidden, positions, cache)


async def test_flooding_caller_does_not_starve_another_callers_frame(aiohttp_server):
    import asyncio

    shard = _SlowShard()
    app = create_app(ServerConfig(manifest_path=Path("x"), shard_id=0), shard)
    server = await aiohttp_server(app)
    url = str(server.make_url("/v1/forward"))

    def frame(value: float, session: str, rows: int = 1) -> bytes:
        x = np.full((1, rows, H), value, dtype=np.float32)
        return make_frame(x, session=session, step=0, start=0, shard=0)

    async with _session_for("127.0.0.1") as attacker, _session_for("127.0.0.2") as honest:
        # prefill chunks (8 positions): each runs alone, none is batched with another
        flood = [
            asyncio.ensure_future(attacker.post(url, data=frame(1.0, f"{CAP}-flood{i}", 8)))
            for i in range(6)
        ]
        while not shard.order:  # the flood is queued and computing
            await asyncio.sleep(0.01)
        answer = await honest.post(url, data=frame(7.0, f"{CAP}-honest"))
        assert answer.status == 200
        assert all(a.status == 200 for a in await asyncio.gather(*flood))
    # served right after the frame computing when it arrived, not behind the whole flood
    assert shard.order.index(7.0) <= 2, shard.order


async def test_body_trickled_slower_than_read_timeout_gets_named_408(aiohttp_server):
    import asyncio

    server = await aiohttp_server(_app(request_read_timeout_s=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/forward HTTP/1.1\r\nHost: n\r\nContent-Length: 1000\r\n\r\nPLAF")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 10)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    body = json.loads(await reader.readexactly(length))
    writer.close()
    assert b" 408 " in status and body["code"] == "slow_request"
    assert len(server.app[STATE_KEY].peer_in_flight) == 0  # the slot is given back


# ------------------------------------------------------------------------- client bounds
def _hostile_node(respond) -> web.Application:
    app = web.Application()

    async def forward(request: web.Request) -> web.StreamResponse:
        frame = parse_frame(await request.read())
        return respond(frame)

    app.router.add_post("/v1/forward", forward)
    return app


async def _client_error(aiohttp_server, respond) -> ProtocolError:
    server = await aiohttp_server(_hostile_node(respond))
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=0)
    async with PipelineClient([hop]) as client:
        with pytest.raises(ProtocolError) as caught:
            await client.run_layers(new_session_id(), 0, 0, _hidden(2))
    return caught.value


def _answer(frame, rows: int, **headers: str) -> web.Response:
    h = frame.header
    body = make_frame(_hidden(rows), session=h.session, step=h.step, start=h.start, shard=0)
    return web.Response(body=body, content_type="application/x-planet-frame", headers=headers)


async def test_client_oversize_answer_is_named_error_not_read_whole(aiohttp_server):
    error = await _client_error(aiohttp_server, lambda f: _answer(f, 5000))
    assert error.code == "answer_too_large"


async def test_client_malformed_compute_header_is_named_error(aiohttp_server):
    error = await _client_error(
        aiohttp_server, lambda f: _answer(f, 1, **{"X-Planet-Compute-Ms": "fast"})
    )
    assert error.code == "bad_answer"


async def test_client_answer_for_other_session_is_named_error(aiohttp_server):
    def respond(frame):
        body = make_frame(_hidden(1), session=CAP, step=0, start=1, shard=0)
        return web.Response(body=body, content_type="application/x-planet-frame")

    error = await _client_error(aiohttp_server, respond)
    assert error.code == "bad_answer" and "session" in error.message


async def test_client_garbage_answer_is_named_error(aiohttp_server):
    error = await _client_error(
        aiohttp_server,
        lambda f: web.Response(
            body=b"PLAF" + bytes(200), content_type="application/x-planet-frame"
        ),
    )
    assert error.code == "bad_answer"


async def test_client_info_not_an_object_is_named_error(aiohttp_server):
    app = web.Application()

    async def info(request):
        return web.json_response([1, 2, 3])

    app.router.add_get("/info", info)
    server = await aiohttp_server(app)
    hop = Hop(url=str(server.make_url("")).rstrip("/"), shard=0)
    async with PipelineClient([hop]) as client:
        with pytest.raises(ProtocolError) as caught:
            await client.check_circuit("sha256:" + "0" * 64, 2)
    assert caught.value.code == "bad_answer"


# ------------------------------------------------------------------------- CLI
def test_ask_nodes_directory_prints_error_and_hint_without_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "node.cli.main", "ask", "hello", "--nodes", str(tmp_path)],
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
    from node.cli.main import main

    path = tmp_path / "nodes.json"
    path.write_bytes(GARBLED[name])
    status = main(["ask", "hello", "--nodes", str(path)])
    err = capsys.readouterr().err
    assert status != 0 and err.startswith("error:") and "\nhint:" in err


def test_ask_nodes_file_naming_a_directory_as_manifest_is_error(tmp_path, capsys):
    from node.cli.main import main

    path = tmp_path / "nodes.json"
    nodes = [{"url": "http://127.0.0.1:1", "shard": 0, "layers": [0, 2]}]
    path.write_text(json.dumps({"manifest": str(tmp_path), "nodes": nodes}))
    assert main(["ask", "hello", "--nodes", str(path)]) != 0
    assert capsys.readouterr().err.startswith("error:")
