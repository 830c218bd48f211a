"""Prefix-aware routing (protocol/prefix_routes.py): nodes advertise the route keys of the prompt
blocks their prefix cache holds, a gateway's router sends a question sharing a system prompt to
the replica that holds it while the load allows, and hostile summaries are refused by name.
In-process nodes (fake shards with KV blocks) on loopback, the real Router and cost book."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.client.circuit import CircuitClient
from node.client.costs import CostBook
from node.client.types import Hop
from node.gateway.router import RoutableNode, Router
from node.server.app import STATE_KEY
from node.server.config import ServerConfig
from node.server.next_hops import ForwardAny
from protocol.prefix_routes import (
    MAX_ADVERTISED,
    BadPrefixSummaryError,
    matched_blocks,
    parse_prefix_routes,
    route_keys,
)
from tests.unit.fake_head import FakeHead, H
from tests.unit.stream_circuit import serve_circuit
from tests.unit.test_prefix_cache import KVFake

pytestmark = pytest.mark.unit

SALT = "ab" * 16
GOOD = {"salt": SALT, "block_positions": 16, "keys": ["0123456789abcdef"]}


def test_route_keys_name_the_prompt_prefix_per_node_and_upstream() -> None:
    prompt = list(range(100, 150))  # 3 full blocks
    keys = route_keys(SALT, [], prompt)
    assert len(keys) == 3 and all(len(k) == 16 for k in keys)
    assert route_keys(SALT, [], prompt[:40] + [7] * 10)[:2] == keys[:2]  # same first 2 blocks
    assert route_keys(SALT, [], prompt[:40] + [7] * 10)[2] != keys[2]
    assert route_keys("cd" * 16, [], prompt) != keys  # another node's salt
    assert route_keys(SALT, ["http://a:1"], prompt) != keys  # behind another upstream hop
    held = parse_prefix_routes({**GOOD, "keys": keys[:2]})
    assert matched_blocks(held, keys) == 2 and matched_blocks(None, keys) == 0
    assert matched_blocks(held, route_keys(SALT, [], [1] * 48)) == 0


@pytest.mark.parametrize(
    ("summary", "match"),
    [
        ("keys", "must be null or"),
        ({**GOOD, "extra": 1}, "must be null or"),
        ({**GOOD, "salt": "AB" * 16}, "salt"),
        ({**GOOD, "salt": 5}, "salt"),
        ({**GOOD, "block_positions": 32}, "block_positions"),
        ({**GOOD, "block_positions": True}, "block_positions"),
        ({**GOOD, "keys": "0123456789abcdef"}, "keys"),
        ({**GOOD, "keys": [f"{i:016x}" for i in range(MAX_ADVERTISED + 1)]}, "at most"),
        ({**GOOD, "keys": ["0123456789abcdeg"]}, "hex"),
        ({**GOOD, "keys": ["0123456789abcdef" * 1000]}, "hex"),
        ({**GOOD, "keys": [7]}, "hex"),
        ({**GOOD, "keys": ["0123456789abcdef"] * 2}, "twice"),
    ],
)
def test_hostile_summaries_are_refused_by_name(summary: Any, match: str) -> None:
    with pytest.raises(BadPrefixSummaryError, match=match) as refused:
        parse_prefix_routes(summary)
    assert refused.value.code == "bad_prefix_summary"
    book = CostBook()  # the cost book keeps the node's load, counts the refusal, holds nothing
    book.observe_info("http://n:1", {"sessions": 3, "prefix_routes": summary}, 0.01)
    stats = book.get("http://n:1")
    assert stats.prefix_routes is None and stats.prefix_refused == 1 and stats.sessions == 3


def test_the_cost_book_prefers_the_holder_only_among_the_near_cheapest() -> None:
    book = CostBook()
    urls = ["http://a:1", "http://b:1", "http://c:1"]
    for url in urls:
        book.observe_info(url, {"max_sessions": 10, "sessions": 0}, 0.01)
    held = {"http://b:1": 3}
    prefer = lambda url: held.get(url, 0)  # noqa: E731
    assert {book.choose(urls, str, prefer) for _ in range(30)} == {"http://b:1"}
    assert len({book.choose(urls, str) for _ in range(60)}) > 1  # without a prompt: spread
    book.observe_info("http://b:1", {"max_sessions": 10, "sessions": 10}, 0.01)  # full
    assert "http://b:1" not in {book.choose(urls, str, prefer) for _ in range(30)}


async def test_a_question_sharing_a_system_prompt_is_routed_to_the_replica_holding_it(
    aiohttp_server,
):
    config = {"manifest_path": Path("x"), "prefix_advertise_min_sessions": 1}
    nodes = [
        (
            ServerConfig(shard_id=s, **config),
            KVFake(shard_id=s, hidden_size=H, layers=(2 * s, 2 * s + 2)),
        )
        for s in (0, 0, 1)
    ]
    servers, hops = await serve_circuit(aiohttp_server, nodes)
    for server, (node_config, _) in zip(servers, nodes, strict=True):
        server.app[STATE_KEY].next_hops = ForwardAny(node_config.shard_id)
    a, b, c = (Hop(url=hop.url, shard=shard) for hop, shard in zip(hops, (0, 0, 1), strict=True))
    router = Router(
        _Source([(a.url, 0), (b.url, 0), (c.url, 1)]),
        model_hash="sha256:" + "0" * 64,
        shard_layers=[(0, 2), (2, 4)],
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
        public_only=False,
    )

    async def verified(node: RoutableNode) -> bool:
        return True

    router._verify = verified  # type: ignore[method-assign]

    async def observe() -> None:
        async with aiohttp.ClientSession() as http:
            for hop in (a, b, c):
                async with http.get(f"{hop.url}/info") as answer:
                    router.costs.observe_info(hop.url, await answer.json(), 0.001)

    system = list(range(1, 41))  # 2 full blocks of 16 shared by every question
    question = [*system, 45, 46, 47]
    await observe()
    assert router.costs.get(a.url).prefix_routes.keys == frozenset()  # nothing held yet
    async with CircuitClient([b, c], hidden_size=H) as client:  # an earlier question via b
        for hop in (b, c):
            client.route_salts[hop.url] = router.costs.get(hop.url).prefix_routes.salt
        gen = client.generate(FakeHead(), [*system, 42, 43], max_new_tokens=2, stop_on_eos=False)
        assert len([t async for t in gen]) == 2
    await observe()
    assert len(router.costs.get(b.url).prefix_routes.keys) == 2
    assert len(router.costs.get(c.url).prefix_routes.keys) == 2  # keyed behind b
    chosen = {(await router.circuit(question)).nodes[0].endpoint for _ in range(20)}
    assert chosen == {b.url}
    assert len({(await router.circuit()).nodes[0].endpoint for _ in range(40)}) == 2
    # b full: the load decides first, the question goes to a
    router.costs.observe_info(b.url, {"max_sessions": 1, "sessions": 1}, 0.001)
    assert {(await router.circuit(question)).nodes[0].endpoint for _ in range(10)} == {a.url}


async def test_isolated_sessions_are_never_advertised_and_bad_route_keys_are_refused(
    aiohttp_server,
):
    config = ServerConfig(manifest_path=Path("x"), shard_id=0, prefix_advertise_min_sessions=1)
    servers, hops = await serve_circuit(aiohttp_server, [(config, KVFake(hidden_size=H))])
    prefix = servers[0].app[STATE_KEY].prefix
    prompt = list(range(1, 35))
    async with CircuitClient(hops, hidden_size=H, prefix_isolation="u" * 43) as client:
        client.route_salts[hops[0].url] = prefix.route_salt
        gen = client.generate(FakeHead(), prompt, max_new_tokens=1, stop_on_eos=False)
        assert len([t async for t in gen]) == 1
    assert len(prefix) == 2 and prefix.routes()["keys"] == []
    # the node drops route keys an isolated open carries, whatever its client sends
    assert prefix.chain("u" * 43, ["0123456789abcdef"]).routes == ()
    async with CircuitClient(hops, hidden_size=H) as client:
        client.route_salts[hops[0].url] = prefix.route_salt
        gen = client.generate(FakeHead(), prompt, max_new_tokens=1, stop_on_eos=False)
        assert len([t async for t in gen]) == 1
    assert prefix.routes()["keys"] == route_keys(prefix.route_salt, [], prompt)
    # one session reached them: with the default (2 sessions) nothing is advertised
    prefix.advertise_min_sessions = 2
    assert prefix.routes()["keys"] == []
    open_body = {
        "op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None, "next": None,
    }  # fmt: skip
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[0].url}/v1/stream") as ws:
        for bad in (["xyz"], ["0123456789abcdef"] * 65, "0123456789abcdef", [None]):
            await ws.send_str(json.dumps({**open_body, "route": bad}))
            answer = json.loads((await ws.receive(timeout=5)).data)
            assert answer["op"] == "error" and answer["code"] == "bad_control", answer


class _Source:
    def __init__(self, nodes: list[tuple[str, int]]) -> None:
        self.entries = [
            {"key": f"{i + 1:02x}" * 32, "endpoint": url, "shards": [shard], "routable": True}
            for i, (url, shard) in enumerate(nodes)
        ]

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


async def test_planet_asks_replicas_prefer_the_holder_too(aiohttp_server):
    from node.client.failover import generate
    from node.client.replicas import ReplicaCircuits

    config = {"manifest_path": Path("x"), "prefix_advertise_min_sessions": 1}
    nodes = [(ServerConfig(shard_id=0, **config), KVFake(hidden_size=H)) for _ in range(2)]
    _, served = await serve_circuit(aiohttp_server, nodes)
    a, b = (Hop(url=hop.url, shard=0) for hop in served)
    expected = {0: ("sha256:" + "0" * 64, (0, 2))}
    prompt = list(range(1, 40))
    async with aiohttp.ClientSession() as http:
        first = ReplicaCircuits(http, [b], expected=expected, hidden_size=H, prompt=prompt)
        tokens = [t async for t in generate(first, FakeHead(), prompt, max_new_tokens=1)]
        assert len(tokens) == 1
        source = ReplicaCircuits(http, [a, b], expected=expected, hidden_size=H, prompt=prompt)
        for _ in range(6):
            source.costs.get(a.url).updated_s = source.costs.get(b.url).updated_s = -1e9
            async with source.lease(frozenset()) as client:
                assert client.hops[0].url == b.url
