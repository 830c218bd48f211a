"""The ring (docs/overlay.md, *The ring*): the first node runs the decode loop, the last hop's
outputs come back up the circuit's own links, and the client checks every token. Real tiny
models on in-process nodes over loopback: the ring's tokens are the client-driven loop's
(greedy fp32 and seeded sampling), for circuits of 1, 2 and 3 nodes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.client.circuit import CircuitClient
from node.client.ring import generate_ring
from node.client.sampling import SamplingConfig
from node.client.types import Timings
from node.model.head import ClientHead
from node.model.manifest import CLIENT_FILE
from protocol.errors import RemoteError
from protocol.open_features import OLD_NODE, OpenFeatures
from tests.unit.ring_nodes import (
    greedy_tokens,
    hops_of,
    learn_features,
    start_nodes,
    tiny_ring_model,
)

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12
H = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[int, Path]]:
    return tiny_ring_model(tmp_path_factory.mktemp("tiny-ring"), H)


def _expected(model: Any, ids: list[int]) -> list[int]:
    return greedy_tokens(model, ids, STEPS)


async def _both(
    client: CircuitClient, head: Any, ids: list[int], sampling: SamplingConfig | None = None
) -> tuple[list[int], list[int], Timings]:
    direct = [
        t
        async for t in client.generate(
            head, ids, max_new_tokens=STEPS, stop_on_eos=False, sampling=sampling
        )
    ]
    timings = Timings()
    ring = [
        t
        async for t in generate_ring(
            client,
            head,
            ids,
            max_new_tokens=STEPS,
            stop_on_eos=False,
            sampling=sampling,
            timings=timings,
        )
    ]
    return direct, ring, timings


@pytest.mark.parametrize("parts", [1, 2, 3])
async def test_ring_greedy_fp32_tokens_equal_the_client_loop_and_the_model(
    aiohttp_server, tiny, parts
):
    model, manifests = tiny
    manifest = manifests[parts]
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = list(range(parts))
    servers = await start_nodes(aiohttp_server, manifest, shards)
    async with CircuitClient(
        hops_of(servers, shards), hidden_size=H, dtype="float32", prefill_chunk=5
    ) as client:
        await learn_features(client)
        assert client.ring_ready()
        direct, ring, timings = await _both(client, head, ids)
    assert direct == ring == _expected(model, ids)
    assert timings.new_tokens == STEPS and timings.decode_steps == STEPS - 1


async def test_ring_seeded_sampling_tokens_equal_the_client_loop(aiohttp_server, tiny):
    _, manifests = tiny
    manifest = manifests[2]
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, manifest, [0, 1])
    sampling = SamplingConfig(temperature=1.3, top_p=0.9, seed=11)
    async with CircuitClient(hops_of(servers, [0, 1]), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        direct, ring, _ = await _both(client, head, ids, sampling)
    assert direct == ring
    assert len(set(ring)) > 1  # really sampled


async def test_ring_stops_at_a_stop_id_without_yielding_it(aiohttp_server, tiny):
    """The loop stops after a stop id (the head's end-of-sequence ids): the tokens before it,
    as the client loop yields them. The tiny model's greedy answer is made to stop by naming
    its 4th token an end-of-sequence id on the client's head."""
    model, manifests = tiny
    manifest = manifests[2]
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    expected = _expected(model, ids)
    head.eos_token_ids = frozenset({expected[3]})
    servers = await start_nodes(aiohttp_server, manifest, [0, 1])
    async with CircuitClient(hops_of(servers, [0, 1]), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        ring = [t async for t in generate_ring(client, head, ids, max_new_tokens=STEPS)]
        direct = [t async for t in client.generate(head, ids, max_new_tokens=STEPS)]
    assert ring == direct == expected[: expected.index(expected[3])]


async def test_ring_node_without_client_head_refuses_by_name_and_does_not_advertise(
    aiohttp_server, tiny, tmp_path
):
    _, manifests = tiny
    bare = tmp_path / "bare"
    shutil.copytree(manifests[2].parent, bare)
    (bare / CLIENT_FILE).unlink()
    head = ClientHead.load(manifests[2], device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, bare / manifests[2].name, [0, 1])
    async with CircuitClient(hops_of(servers, [0, 1]), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        assert not client.ring_ready()
        assert client.open_features[client.hops[0].url] == OpenFeatures(
            next_alternates=True, ring_back=True, ring_vouch=True
        )
        with pytest.raises(RemoteError) as refused:
            async for _ in generate_ring(client, head, ids, max_new_tokens=STEPS, timeout_s=10):
                pass
        assert refused.value.code == "ring_unavailable"
        # the circuit still answers client-driven
        assert len([t async for t in client.generate(head, ids, max_new_tokens=3)]) <= 3


def test_ring_not_ready_for_nodes_of_before():
    """Nodes whose /info lists no ring features (or was not read) get no ring open."""
    from node.client.types import Hop

    client = CircuitClient(
        [Hop("http://127.0.0.1:1", 0), Hop("http://127.0.0.1:2", 1)], hidden_size=H
    )
    assert not client.ring_ready()
    client.open_features = {h.url: OLD_NODE for h in client.hops}
    assert not client.ring_ready()
    client.open_features = {h.url: OpenFeatures(ring=True, ring_back=True) for h in client.hops}
    assert client.ring_ready()


async def test_ring_with_failover_hop_gone_mid_ring_replica_continues_same_greedy_tokens(
    aiohttp_server, tiny
):
    """`generate(ring=True)`: the leased circuit's first node runs the loop; its last hop is
    closed mid-answer, the failover replays the history into a replacement's ring at the same
    positions, and the greedy tokens are the model's."""
    from node.client.failover import FailoverPolicy, generate
    from node.client.replicas import ReplicaCircuits
    from node.model.manifest import Manifest
    from node.server.app import STATE_KEY

    model, manifests = tiny
    manifest = manifests[2]
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers = await start_nodes(aiohttp_server, manifest, shards)
    hops = hops_of(servers, shards)
    loaded = Manifest.load(manifest)
    expected = {s.shard_id: (loaded.model_hash, s.layers) for s in loaded.shards}
    timings = Timings()
    tokens: list[int] = []
    async with aiohttp.ClientSession() as http:
        source = ReplicaCircuits(http, hops, expected=expected, hidden_size=H, prefill_chunk=5)
        async for token in generate(
            source,
            head,
            ids,
            max_new_tokens=STEPS,
            stop_on_eos=False,
            timings=timings,
            policy=FailoverPolicy(backoff_s=0.01),
            ring=True,
        ):
            tokens.append(token)
            if len(tokens) == 5:
                await servers[hops.index(source.current[1])].close()
    assert tokens == _expected(model, ids)
    (failover,) = timings.failovers
    assert failover.hops == (1,) and failover.replayed == len(ids) + 5
    assert servers[0].app[STATE_KEY].ring_heads.sessions == 2  # the first ring and the replay's
    assert timings.new_tokens == STEPS
