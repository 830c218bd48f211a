"""In-process tiny-model nodes for the ring's tests (tests/unit/test_ring*.py): real node apps
(`create_app` around `ModelShardBackend`) on loopback, each allowed to forward to the others,
and the client's view of their /info `open_features`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import torch

from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList
from protocol.open_features import open_features_of
from tests.doubles.tiny_model import make_tiny_model


def tiny_ring_model(root: Path, hidden: int) -> tuple[Any, dict[int, Path]]:
    """A tiny 6-layer model (untied head) and its shard sets of 1, 2 and 3 parts."""
    from node.model.prepare import prepare

    model = make_tiny_model(root / "src", layers=6, hidden=hidden, tied=False)
    manifests = {
        parts: Path(prepare(root / "src", parts=parts, out=root / f"p{parts}", progress=print))
        for parts in (1, 2, 3)
    }
    return model, manifests


def greedy_tokens(model: Any, ids: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens of transformers' `generate` after `ids` (EOS ignored)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False
        )
    return out[0, len(ids) :].tolist()


async def start_nodes(
    aiohttp_server: Any,
    manifest: Path,
    shards: list[int],
    *,
    backend: Any = None,
    config: dict[str, Any] | None = None,
) -> list[Any]:
    """One in-process node per entry of `shards` (`backend(manifest, shard)` builds each
    backend: a real shard unless given); each may forward to any of them."""
    servers = []
    for shard in shards:
        inner = (backend or ModelShardBackend)(manifest, shard)
        app = create_app(
            ServerConfig(manifest_path=manifest, shard_id=shard, **(config or {})), inner
        )
        servers.append(await aiohttp_server(app))
    urls = frozenset(url_of(s) for s in servers)
    for shard, server in zip(shards, servers, strict=True):
        server.app[STATE_KEY].next_hops = ForwardList(shard, urls)
    return servers


def url_of(server: Any) -> str:
    return str(server.make_url("")).rstrip("/")


def hops_of(servers: list[Any], shards: list[int]) -> list[Hop]:
    return [Hop(url=url_of(s), shard=shard) for s, shard in zip(servers, shards, strict=True)]


async def learn_features(client: CircuitClient) -> None:
    """Fill `client.open_features` from every hop's /info, as the router does."""
    async with aiohttp.ClientSession() as http:
        for hop in client.hops:
            async with http.get(f"{hop.url}/info") as answer:
                client.open_features[hop.url] = open_features_of(await answer.json())
