"""In-process nodes chained for the stream tests: start one aiohttp server per shard and let
each forward only to this circuit's nodes (the next-hop policy `planet local up` gives). With
`keys` (one nacl SigningKey per node) every node serves TLS bound to its key (node/links.py)
and the hops carry the keys to pin."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from node.client.types import Hop
from node.links import server_context
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList


async def serve_circuit(
    aiohttp_server: Any,
    nodes: Sequence[tuple[ServerConfig, Any]],
    keys: Sequence[Any] | None = None,
) -> tuple[list[Any], list[Hop]]:
    """(config, backend) per shard in order → the running servers and the circuit's hops."""
    servers = []
    for index, (config, backend) in enumerate(nodes):
        ssl = None if keys is None else server_context(keys[index])
        servers.append(await aiohttp_server(create_app(config, backend), ssl=ssl))
    hops = [
        Hop(
            url=str(s.make_url("")).rstrip("/"),
            shard=i,
            key=None if keys is None else keys[i].verify_key.encode().hex(),
        )
        for i, s in enumerate(servers)
    ]
    circuit = frozenset(h.url for h in hops)
    for shard, server in enumerate(servers):  # each node may dial this circuit's nodes only
        server.app[STATE_KEY].next_hops = ForwardList(shard, circuit)
    return servers, hops
