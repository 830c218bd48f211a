"""Node server handlers via aiohttp's test client, with a deterministic fake shard: /health,
/info and one session driven frame by frame over the node's link (`GET /v1/stream`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from node.server.app import create_app
from node.server.config import ServerConfig
from protocol.errors import ConfigError
from protocol.frames.header import FrameHeader, pack_frame
from protocol.numerics import NUMERICS
from tests.doubles.fake_shard import FakeShard
from tests.unit.stream_link import Link, Refused

pytestmark = pytest.mark.unit

H = 8
SID = "session-0001-capability-a"
OTHER = "session-0002-capability-b"


def _config(**over: object) -> ServerConfig:
    base = {"manifest_path": Path("unused.json"), "shard_id": 1}
    base.update(over)
    return ServerConfig(**base)  # type: ignore[arg-type]


def _rows(start: int, count: int) -> np.ndarray:
    return np.arange(count * H, dtype=np.float32).reshape(1, count, H) + start


@pytest.fixture
def shard() -> FakeShard:
    return FakeShard(shard_id=1, hidden_size=H, layers=(10, 20))


@pytest.fixture
async def client(aiohttp_client, shard):
    return await aiohttp_client(create_app(_config(), shard))


async def _link(client) -> Link:
    return Link(await client.ws_connect("/v1/stream"), H)


async def _opened(client, capability: str = SID, sid: int = 1) -> Link:
    link = await _link(client)
    assert await link.open(sid, capability, 1) == {"op": "opened", "sid": sid}
    return link


async def _info(client) -> dict:
    return await (await client.get("/info")).json()


async def _error(answer) -> str:
    body = await answer.json()
    assert set(body) >= {"code", "message"} and body["message"]
    return body["code"]


async def _refused(awaitable) -> str:
    with pytest.raises(Refused) as refused:
        await awaitable
    return refused.value.code


async def test_health_loaded_shard_answers_ok(client):
    answer = await client.get("/health")
    assert answer.status == 200 and (await answer.json())["status"] == "ok"


async def test_info_reports_model_layers_and_sessions(client):
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 3))
    info = await _info(client)
    assert info["shard"] == 1 and info["layers"] == [10, 20] and info["hidden_size"] == H
    assert info["model"] == "fake" and info["quant"] == "none" and info["device"] == "cpu"
    assert info["sessions"] == 1 and info["cache_bytes"] == 3 * 1024
    assert info["load"]["forwards"] == 1 and info["load"]["in_flight"] == 0
    assert info["protocol_version"] == 1
    assert info["numerics"] == NUMERICS  # what verifiers compare bitwise against


async def test_frame_open_then_continue_returns_layer_output(client, shard):
    link = await _opened(client)
    header, out = await link.forward(1, 0, _rows(0, 3))
    np.testing.assert_array_equal(out, _rows(0, 3) + 2)  # fake shard adds shard_id + 1
    assert (header.sid, header.start, header.count) == (1, 0, 3)
    header, _ = await link.forward(1, 3, _rows(3, 1))
    assert header.start == 3 and shard.calls == 2


async def test_frame_int8_codec_answers_in_same_codec(client):
    link = await _opened(client)
    header, out = await link.forward(1, 0, _rows(0, 2), codec="int8", dtype="float16")
    assert header.codec == "int8" and header.dtype == "float16" and out.shape == (1, 2, H)


async def test_frame_last_only_returns_last_position(client):
    link = await _opened(client)
    header, out = await link.forward(1, 0, _rows(0, 4), last_only=True)
    assert (header.start, header.count, out.shape) == (3, 1, (1, 1, H))
    assert out[0, 0, 0] == 3 * H + 2


async def test_open_for_another_shard_refused_wrong_shard(client):
    link = await _link(client)
    assert await _refused(link.open(1, SID, 0)) == "wrong_shard"


async def test_frame_for_a_sid_never_opened_is_unknown_stream(client):
    link = await _link(client)
    assert await _refused(link.forward(5, 0, _rows(0, 1))) == "unknown_stream"


async def test_gap_in_positions_refused_and_session_still_usable(client):
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 2))
    assert await _refused(link.forward(1, 3, _rows(3, 1))) == "bad_positions"
    assert await _refused(link.forward(1, 0, _rows(0, 1))) == "bad_positions"  # a rewind too
    header, _ = await link.forward(1, 2, _rows(2, 1))
    assert header.start == 2


async def test_close_then_continue_is_unknown_stream_and_frees_the_session(client):
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 2))
    assert await link.close(1) == {"op": "closed", "sid": 1}
    assert await _refused(link.close(1)) == "unknown_stream"
    assert await _refused(link.forward(1, 2, _rows(2, 1))) == "unknown_stream"
    assert (await _info(client))["sessions"] == 0


async def test_idle_session_evicted_then_session_expired(aiohttp_client, shard):
    client = await aiohttp_client(
        create_app(_config(idle_timeout_s=0.05, evict_interval_s=0.02), shard)
    )
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 2))
    deadline = asyncio.get_running_loop().time() + 5
    while (await _info(client))["sessions"] != 0:  # the evictor's pass (every 0.02 s)
        assert asyncio.get_running_loop().time() < deadline, "the idle session was never evicted"
        await asyncio.sleep(0.02)
    assert await _refused(link.forward(1, 2, _rows(2, 1))) == "session_expired"


async def test_max_sessions_reached_busy_then_a_closed_slot_is_free(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_sessions=1), shard))
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 1))
    assert await _refused(link.open(2, OTHER, 1)) == "busy"
    await link.forward(1, 1, _rows(1, 1))  # the open session goes on
    await link.close(1)
    assert (await link.open(2, OTHER, 1))["op"] == "opened"


async def test_cache_cap_reached_busy(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_cache_bytes=4096), shard))
    link = await _opened(client)
    await link.forward(1, 0, _rows(0, 3))  # 3 KiB held
    assert await _refused(link.forward(1, 3, _rows(3, 2))) == "busy"  # +2 KiB > 4 KiB
    header, _ = await link.forward(1, 3, _rows(3, 1))  # exactly at the cap
    assert header.start == 3


async def test_garbage_frames_refused_and_node_keeps_serving(client):
    link = await _opened(client)
    for garbage in (b"", b"hello", b"\x01\x01" + bytes(20)):
        await link.ws.send_bytes(garbage)
        code = await _refused(link.control())
        assert code in {"bad_header", "bad_positions", "bad_body"}, code
    header, _ = await link.forward(1, 0, _rows(0, 1))
    assert header.count == 1


async def test_non_finite_refused_before_the_cache_moves(client, shard):
    link = await _opened(client)
    x = np.zeros((1, 2, H), dtype=np.float32)
    x[0, 1, 1] = np.nan
    await link.ws.send_bytes(pack_frame(FrameHeader(1, 0, 2, "float32", "raw"), x.tobytes()))
    assert await _refused(link.control()) == "non_finite"
    info = await _info(client)
    assert info["cache_bytes"] == 0 and shard.calls == 0
    header, _ = await link.forward(1, 0, _rows(0, 1))  # position 0 is still the next one
    assert header.start == 0


async def test_hidden_size_mismatch_is_bad_body(client):
    link = await _opened(client)
    wide = np.zeros((1, 1, H * 2), dtype=np.float32)
    await link.ws.send_bytes(pack_frame(FrameHeader(1, 0, 1, "float32", "raw"), wide.tobytes()))
    assert await _refused(link.control()) == "bad_body"


async def test_message_over_size_cap_closes_the_link_and_its_sessions(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_request_bytes=2048), shard))
    link = await _opened(client)
    await link.send(1, 0, _rows(0, 100))
    message = await link.message()
    assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert link.ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    for _ in range(50):
        if (await _info(client))["sessions"] == 0:
            break
        await asyncio.sleep(0.02)
    assert (await _info(client))["sessions"] == 0
    link = await _opened(client)  # a new link serves
    header, _ = await link.forward(1, 0, _rows(0, 1))
    assert header.count == 1


async def test_shard_failure_compute_failed_and_session_dropped(aiohttp_client):
    failing = FakeShard(shard_id=1, hidden_size=H, fail_with=RuntimeError("boom"))
    client = await aiohttp_client(create_app(_config(), failing))
    link = await _opened(client)
    assert await _refused(link.forward(1, 0, _rows(0, 1))) == "compute_failed"
    assert (await _info(client))["sessions"] == 0


async def test_unknown_route_is_json_404(client):
    answer = await client.get("/nope")
    assert answer.status == 404 and await _error(answer) == "not_found"


async def test_retired_star_routes_are_gone(client):
    answer = await client.post("/v1/forward", data=b"PLAF")
    assert answer.status in (404, 405)
    assert await _error(answer) in {"not_found", "method_not_allowed"}
    answer = await client.delete(f"/v1/sessions/{SID}")
    assert answer.status == 404 and await _error(answer) == "not_found"


@pytest.mark.parametrize("capability", ["x", "long-enough but spaced!!", "é" * 30, None, 7])
async def test_open_with_a_malformed_capability_is_bad_control(client, capability):
    link = await _link(client)
    assert await _refused(link.open(1, capability, 1)) == "bad_control"  # type: ignore[arg-type]


def test_server_config_invalid_values_raise_config_error():
    with pytest.raises(ConfigError, match="idle timeout"):
        _config(idle_timeout_s=0).validate()
    with pytest.raises(ConfigError, match="max sessions"):
        _config(max_sessions=0).validate()
