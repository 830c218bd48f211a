"""Node server handlers via aiohttp's test client, with a deterministic fake shard."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from node.server.app import create_app
from node.server.config import ServerConfig
from protocol.errors import ConfigError
from protocol.frames import decode_frame, make_frame
from tests.doubles.fake_shard import FakeShard

pytestmark = pytest.mark.unit

H = 8
SID = "session-0001-capability-a"


def _config(**over: object) -> ServerConfig:
    base = {"manifest_path": Path("unused.json"), "shard_id": 1}
    base.update(over)
    return ServerConfig(**base)  # type: ignore[arg-type]


def _frame(start: int, count: int, *, shard: int = 1, session: str = SID, **kw: object) -> bytes:
    x = np.arange(count * H, dtype=np.float32).reshape(1, count, H) + start
    return make_frame(x, session=session, step=start, start=start, shard=shard, **kw)  # type: ignore[arg-type]


@pytest.fixture
def shard() -> FakeShard:
    return FakeShard(shard_id=1, hidden_size=H, layers=(10, 20))


@pytest.fixture
async def client(aiohttp_client, shard):
    return await aiohttp_client(create_app(_config(), shard))


async def _post(client, data: bytes):
    return await client.post("/v1/forward", data=data)


async def _error(answer) -> str:
    body = await answer.json()
    assert set(body) >= {"code", "message"} and body["message"]
    return body["code"]


async def test_health_loaded_shard_answers_ok(client):
    answer = await client.get("/health")
    assert answer.status == 200 and (await answer.json())["status"] == "ok"


async def test_info_reports_model_layers_and_sessions(client):
    await _post(client, _frame(0, 3))
    info = await (await client.get("/info")).json()
    assert info["shard"] == 1 and info["layers"] == [10, 20] and info["hidden_size"] == H
    assert info["model"] == "fake" and info["quant"] == "none" and info["device"] == "cpu"
    assert info["sessions"] == 1 and info["cache_bytes"] == 3 * 1024
    assert info["load"]["forwards"] == 1 and info["load"]["in_flight"] == 0


async def test_forward_open_then_continue_returns_layer_output(client, shard):
    answer = await _post(client, _frame(0, 3))
    assert answer.status == 200
    header, out = decode_frame(await answer.read())
    x = np.arange(3 * H, dtype=np.float32).reshape(1, 3, H)
    np.testing.assert_array_equal(out, x + 2)  # fake shard adds shard_id + 1
    assert (header.session, header.start, header.count, header.shard) == (SID, 0, 3, 1)
    answer = await _post(client, _frame(3, 1))
    assert answer.status == 200
    header, _ = decode_frame(await answer.read())
    assert header.start == 3 and shard.calls == 2


async def test_forward_int8_codec_answers_in_same_codec(client):
    answer = await _post(client, _frame(0, 2, codec="int8", dtype="float16"))
    header, out = decode_frame(await answer.read())
    assert header.codec == "int8" and header.dtype == "float16" and out.shape == (1, 2, H)


async def test_forward_last_only_returns_last_position(client):
    answer = await _post(client, _frame(0, 4, last_only=True))
    header, out = decode_frame(await answer.read())
    assert (header.start, header.count, out.shape) == (3, 1, (1, 1, H))
    assert out[0, 0, 0] == 3 * H + 2


async def test_forward_wrong_shard_refused_409(client):
    answer = await _post(client, _frame(0, 1, shard=0))
    assert answer.status == 409 and await _error(answer) == "wrong_shard"


async def test_forward_unknown_session_refused_404(client):
    answer = await _post(client, _frame(5, 1))
    assert answer.status == 404 and await _error(answer) == "unknown_session"


async def test_forward_gap_in_positions_refused_and_session_still_usable(client):
    await _post(client, _frame(0, 2))
    answer = await _post(client, _frame(3, 1))
    assert answer.status == 400 and await _error(answer) == "bad_positions"
    answer = await _post(client, _frame(0, 1))  # re-opening at 0 an open session is a gap too
    assert answer.status == 400 and await _error(answer) == "bad_positions"
    assert (await _post(client, _frame(2, 1))).status == 200


async def test_delete_session_then_continue_is_session_expired_410(client):
    await _post(client, _frame(0, 2))
    answer = await client.delete(f"/v1/sessions/{SID}")
    assert (await answer.json())["closed"] is True
    answer = await client.delete(f"/v1/sessions/{SID}")
    assert answer.status == 200 and (await answer.json())["closed"] is False
    answer = await _post(client, _frame(2, 1))
    assert answer.status == 410 and await _error(answer) == "session_expired"
    assert (await (await client.get("/info")).json())["sessions"] == 0


async def test_idle_session_evicted_then_session_expired(aiohttp_client, shard):
    client = await aiohttp_client(
        create_app(_config(idle_timeout_s=0.05, evict_interval_s=0.02), shard)
    )
    await _post(client, _frame(0, 2))
    await asyncio.sleep(0.3)
    assert (await (await client.get("/info")).json())["sessions"] == 0
    answer = await _post(client, _frame(2, 1))
    assert answer.status == 410 and await _error(answer) == "session_expired"


async def test_forward_max_sessions_reached_busy_503(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_sessions=1), shard))
    assert (await _post(client, _frame(0, 1))).status == 200
    answer = await _post(client, _frame(0, 1, session="session-0002-capability-b"))
    assert answer.status == 503 and await _error(answer) == "busy"
    assert (await _post(client, _frame(1, 1))).status == 200  # the open session goes on
    await client.delete(f"/v1/sessions/{SID}")
    assert (await _post(client, _frame(0, 1, session="session-0002-capability-b"))).status == 200


async def test_forward_cache_cap_reached_busy_503(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_cache_bytes=4096), shard))
    assert (await _post(client, _frame(0, 3))).status == 200  # 3 KiB held
    answer = await _post(client, _frame(3, 2))  # +2 KiB > 4 KiB
    assert answer.status == 503 and await _error(answer) == "busy"
    assert (await _post(client, _frame(3, 1))).status == 200  # exactly at the cap


async def test_forward_garbage_refused_and_node_keeps_serving(client):
    for garbage in (b"", b"hello", b"PLAF" + bytes(20)):
        answer = await _post(client, garbage)
        assert answer.status == 400
        assert await _error(answer) in {"bad_magic", "bad_header", "bad_version"}
    assert (await _post(client, _frame(0, 1))).status == 200


async def test_forward_non_finite_refused_and_no_session_left(client, shard):
    x = np.zeros((1, 2, H), dtype=np.float32)
    x[0, 1, 1] = np.nan
    data = make_frame(x, session=SID, step=0, start=0, shard=1)
    answer = await _post(client, data)
    assert answer.status == 400 and await _error(answer) == "non_finite"
    assert (await (await client.get("/info")).json())["sessions"] == 0 and shard.calls == 0


async def test_forward_hidden_size_mismatch_is_bad_shape(client):
    x = np.zeros((1, 1, H * 2), dtype=np.float32)
    answer = await _post(client, make_frame(x, session=SID, step=0, start=0, shard=1))
    assert answer.status == 400 and await _error(answer) == "bad_shape"


async def test_forward_request_over_size_cap_is_too_large_413(aiohttp_client, shard):
    client = await aiohttp_client(create_app(_config(max_request_bytes=2048), shard))
    answer = await _post(client, _frame(0, 100))
    assert answer.status == 413 and await _error(answer) == "too_large"
    assert (await _post(client, _frame(0, 1))).status == 200


async def test_forward_shard_failure_500_and_session_dropped(aiohttp_client):
    failing = FakeShard(shard_id=1, hidden_size=H, fail_with=RuntimeError("boom"))
    client = await aiohttp_client(create_app(_config(), failing))
    answer = await _post(client, _frame(0, 1))
    assert answer.status == 500 and await _error(answer) == "compute_failed"
    assert (await (await client.get("/info")).json())["sessions"] == 0


async def test_unknown_route_is_json_404(client):
    answer = await client.get("/nope")
    assert answer.status == 404 and await _error(answer) == "not_found"


async def test_delete_malformed_session_id_is_400(client):
    answer = await client.delete("/v1/sessions/x")
    assert answer.status == 400 and await _error(answer) == "bad_session_id"
    answer = await client.delete("/v1/sessions/long-enough%20but%20spaced")
    assert answer.status == 400 and await _error(answer) == "bad_session_id"


def test_server_config_invalid_values_raise_config_error():
    with pytest.raises(ConfigError, match="idle timeout"):
        _config(idle_timeout_s=0).validate()
    with pytest.raises(ConfigError, match="max sessions"):
        _config(max_sessions=0).validate()
