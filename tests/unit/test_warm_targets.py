"""Which next hops a node dials ahead (node/server/warm_targets.py): under a `--next-hops` list,
only the listed nodes whose /info says they serve the next shard of this model, plaintext links
only; a node that did not answer is asked again (and makes the round incomplete); under the
committee policy, the next shard's registered nodes under their keys, a node behind NAT with its
other registered addresses."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node.server.link_pool import WarmTarget
from node.server.next_hops import ForwardCommittee, ForwardList
from node.server.warm_targets import ListTargets, served_shard, warm_targets

pytestmark = pytest.mark.unit

HASH = "ab" * 32


async def _info_server(aiohttp_server: Any, body: Any) -> str:
    app = web.Application()

    async def info(_request: web.Request) -> web.Response:
        return web.json_response(body)

    app.router.add_get("/info", info)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


def test_served_shard_reads_only_a_well_formed_answer_of_this_model() -> None:
    assert served_shard({"model_hash": HASH, "shard": 1}, HASH) == 1
    assert served_shard({"model_hash": "cd" * 32, "shard": 1}, HASH) is None
    for shard in (True, -1, "1", 1.0, None):
        assert served_shard({"model_hash": HASH, "shard": shard}, HASH) is None
    assert served_shard([HASH, 1], HASH) is None


async def test_list_targets_are_the_listed_nodes_of_the_next_shard(aiohttp_server) -> None:
    next_one = await _info_server(aiohttp_server, {"model_hash": HASH, "shard": 1})
    after = await _info_server(aiohttp_server, {"model_hash": HASH, "shard": 2})
    other = await _info_server(aiohttp_server, {"model_hash": "cd" * 32, "shard": 1})
    dead = "http://127.0.0.1:9"
    remote = "https://10.0.0.7:18100"  # https: a list names no key to pin, never ahead
    policy = ForwardList(0, frozenset({next_one, after, other, dead, remote}))
    async with aiohttp.ClientSession() as http:
        targets = warm_targets(policy, http, HASH, plaintext_ok=False)
        assert isinstance(targets, ListTargets) and remote not in targets.urls
        assert await targets() == [(next_one, None)]
        assert targets.incomplete  # the dead node is asked again next round
        probed = dict(targets._shards)
        assert await targets() == [(next_one, None)]
        assert targets._shards[next_one] == probed[next_one]  # known ones are not asked again


async def test_committee_targets_are_the_next_shards_registered_keys() -> None:
    class Source:
        async def abci_query(self, path: str) -> Any:
            def node(url: str, key: str, shard: int) -> dict[str, Any]:
                return {"endpoint": url, "key": key, "shards": [shard], "routable": True}

            return {
                "nodes": [
                    node("https://1.1.1.1:18100", "11" * 32, 1),
                    node("https://1.0.0.1:18100", "22" * 32, 1),
                    node("https://9.9.9.9:18100", "33" * 32, 2),
                    node("https://10.0.0.7:18100", "44" * 32, 1),  # not public: never dialled
                ]
            }

    policy = ForwardCommittee(0, Source(), HASH)
    async with aiohttp.ClientSession() as http:
        targets = warm_targets(policy, http, HASH, plaintext_ok=False)
        assert await targets() == [
            WarmTarget("https://1.0.0.1:18100", "22" * 32),
            WarmTarget("https://1.1.1.1:18100", "11" * 32),
        ]


async def test_committee_target_behind_nat_carries_its_other_registered_addresses() -> None:
    """A node behind NAT (endpoint: its port at its first relay) is a warm target with its
    ports at its other relays, in its registration's order, as far as the policy dials them
    (not its endpoint twice, not a private address under public-only)."""
    endpoint, second, third = (
        "https://1.1.1.1:44001",
        "https://8.8.8.8:44002",
        "https://10.0.0.9:44003",  # not public: the policy never dials it
    )
    rendezvous = [
        {"relay": f"{i:064x}", "endpoint": url} for i, url in enumerate((endpoint, second, third))
    ]

    class Source:
        async def abci_query(self, path: str) -> Any:
            return {
                "nodes": [
                    {
                        "endpoint": endpoint,
                        "key": "55" * 32,
                        "shards": [1],
                        "routable": True,
                        "rendezvous": rendezvous,
                    },
                    {  # a plaintext endpoint: no other address is pinned, none is tried
                        "endpoint": "http://9.9.9.9:18100",
                        "key": "66" * 32,
                        "shards": [1],
                        "routable": True,
                        "rendezvous": [{"relay": "77" * 32, "endpoint": second}],
                    },
                ]
            }

    policy = ForwardCommittee(0, Source(), HASH)
    async with aiohttp.ClientSession() as http:
        targets = warm_targets(policy, http, HASH, plaintext_ok=False)
        assert await targets() == [
            WarmTarget("http://9.9.9.9:18100", "66" * 32),
            WarmTarget(endpoint, "55" * 32, (second,)),
        ]
