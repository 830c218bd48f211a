"""The circuit client against in-process fake nodes (real WebSockets on loopback, fake shards),
the circuit check over /info, sampling determinism and the nodes file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from node.client.circuit import CircuitClient
from node.client.info import check_circuit, node_infos
from node.client.nodesfile import NodeRef, NodesFile
from node.client.sampling import SamplingConfig, sample
from node.client.types import Hop, Timings
from node.server.app import STATE_KEY
from node.server.config import ServerConfig
from protocol.errors import BusyError, ConfigError, RemoteError, UnavailableError, UsageError
from tests.doubles.fake_shard import FakeShard
from tests.unit.fake_head import FakeHead, H
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit


async def _nodes(aiohttp_server, count: int, **config: object):
    return await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=Path("x"), shard_id=shard, **config),  # type: ignore[arg-type]
                FakeShard(shard_id=shard, hidden_size=H, layers=(shard * 2, shard * 2 + 2)),
            )
            for shard in range(count)
        ],
    )


async def _collect(client: CircuitClient, prompt: list[int], n: int, **kw) -> list[int]:
    return [t async for t in client.generate(FakeHead(), prompt, max_new_tokens=n, **kw)]


async def _closed_everywhere(servers) -> bool:
    for _ in range(50):  # close messages are fire-and-forget: give them a moment
        if all(len(s.app[STATE_KEY].store) == 0 for s in servers):
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.parametrize("codec", ["raw", "int8"])
async def test_circuit_three_fake_nodes_greedy_chain_of_shard_offsets(aiohttp_server, codec):
    servers, hops = await _nodes(aiohttp_server, 3)
    timings = Timings()
    async with CircuitClient(hops, hidden_size=H, codec=codec) as client:
        tokens = await _collect(client, [1, 2, 3], 5, timings=timings)
    # each pass adds 1 + 2 + 3 = 6 to the last token's id
    assert tokens == [9, 15, 21, 27, 33]
    assert timings.new_tokens == 5 and timings.decode_steps == 4
    assert timings.prompt_tokens == 3 and timings.wire_bytes_sent > 0
    assert await _closed_everywhere(servers)  # the session was closed on every node


async def test_circuit_stops_on_eos_without_yielding_it(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 3)
    async with CircuitClient(hops, hidden_size=H) as client:
        tokens = await _collect(client, [31], 10)
    assert tokens == [37, 43]  # next would be 49 = EOS


async def test_circuit_long_prompt_prefilled_in_chunks(aiohttp_server):
    servers, hops = await _nodes(aiohttp_server, 2)
    async with CircuitClient(hops, hidden_size=H, prefill_chunk=4) as client:
        tokens = await _collect(client, list(range(10)), 2)
    assert tokens == [12, 15]
    assert servers[0].app[STATE_KEY].backend.calls == 3 + 1  # 3 prefill chunks + 1 decode


async def test_check_circuit_accepts_matching_nodes(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 2)
    async with aiohttp.ClientSession() as http:
        infos = await check_circuit(http, hops, "sha256:" + "0" * 64, total_layers=4)
        assert [i["shard"] for i in infos] == [0, 1]
        assert [i["sessions"] for i in await node_infos(http, hops)] == [0, 0]


async def test_check_circuit_wrong_model_or_gap_raises_config_error(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 2)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ConfigError, match="manifest says"):
            await check_circuit(http, hops, "sha256:" + "1" * 64, total_layers=4)
        with pytest.raises(ConfigError, match="model has 6"):
            await check_circuit(http, hops, "sha256:" + "0" * 64, total_layers=6)
        with pytest.raises(ConfigError):
            await check_circuit(http, list(reversed(hops)), "sha256:" + "0" * 64, total_layers=4)


async def test_check_circuit_node_down_raises_unavailable_naming_node():
    hop = Hop(url="http://127.0.0.1:1", shard=0)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(UnavailableError, match=r"127\.0\.0\.1:1 \(shard 0\)"):
            await check_circuit(http, [hop], "sha256:" + "0" * 64, total_layers=2)


async def test_circuit_node_down_raises_unavailable_naming_node():
    hop = Hop(url="http://127.0.0.1:1", shard=0)
    with pytest.raises(UnavailableError, match=r"127\.0\.0\.1:1 \(shard 0\) is not reachable"):
        async with CircuitClient([hop], hidden_size=H) as client:
            await _collect(client, [1], 2)


async def test_circuit_busy_node_raises_busy_error(aiohttp_server):
    servers, hops = await _nodes(aiohttp_server, 2, max_sessions=1)
    # occupy node 1's only session slot
    servers[1].app[STATE_KEY].store.open("other-session", cache=None)
    async with CircuitClient(hops, hidden_size=H) as client:
        with pytest.raises(BusyError, match="shard 1"):
            await _collect(client, [1], 2)
    assert await _closed_everywhere(servers[:1])  # cleaned up on the other node too


async def test_circuit_swapped_hops_wrong_shard_remote_error(aiohttp_server):
    _, hops = await _nodes(aiohttp_server, 2)
    swapped = [Hop(url=hops[1].url, shard=0), Hop(url=hops[0].url, shard=1)]
    async with CircuitClient(swapped, hidden_size=H) as client:
        with pytest.raises(RemoteError) as caught:
            await _collect(client, [1], 2)
    assert caught.value.code == "wrong_shard"


def test_sample_greedy_is_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert sample(logits, SamplingConfig(), np.random.default_rng(0)) == 1


def test_sample_same_seed_same_tokens_different_seed_differs():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    config = SamplingConfig(temperature=1.0, top_p=0.95, seed=7)

    def draw(cfg: SamplingConfig) -> list[int]:
        rng = cfg.rng()
        return [sample(logits, cfg, rng) for _ in range(50)]

    assert draw(config) == draw(config)
    assert draw(config) != draw(SamplingConfig(temperature=1.0, top_p=0.95, seed=8))


def test_sample_small_top_p_keeps_only_the_top_token():
    logits = np.array([0.0, 5.0, 4.0, 1.0], dtype=np.float32)
    config = SamplingConfig(temperature=1.0, top_p=0.01, seed=3)
    rng = config.rng()
    assert {sample(logits, config, rng) for _ in range(20)} == {1}


def test_sample_top_p_never_picks_outside_nucleus():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float64)).astype(np.float32)
    config = SamplingConfig(temperature=1.0, top_p=0.8, seed=0)
    rng = config.rng()
    assert {sample(logits, config, rng) for _ in range(300)} == {0, 1}


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_sampling_config_out_of_range_is_usage_error(bad):
    with pytest.raises(UsageError):
        SamplingConfig(**bad).validate()


def test_nodes_file_roundtrip_and_missing_file_hint(tmp_path):
    path = tmp_path / "nodes.json"
    nodes = NodesFile(
        manifest=tmp_path / "m.json", nodes=(NodeRef("http://127.0.0.1:18100", 0, (0, 15)),)
    )
    nodes.save(path)
    assert NodesFile.load(path) == nodes
    with pytest.raises(UsageError) as caught:
        NodesFile.load(tmp_path / "missing.json")
    assert "planet local up" in (caught.value.hint or "")


def test_nodes_file_malformed_is_config_error(tmp_path):
    path = tmp_path / "nodes.json"
    path.write_text('{"manifest": "m", "nodes": [{"url": 1}]}')
    with pytest.raises(ConfigError):
        NodesFile.load(path)
