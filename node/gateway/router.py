"""Circuits from the committee chain's routable nodes.

The committee answers `/nodes?model=<model_hash>&role=compute`; only entries with `routable`
true (SERVING, agreed stake >= minimum, reputation >= 0.4, computed by the app) are used, grouped
by shard. A circuit takes one node per shard, chosen at random (system randomness) among the
eligible ones, so no node holds a fixed position for a user; the gateway keeps it for one
session (one question: the nodes hold its KV cache).

Entries are untrusted: an endpoint must be a plain `http(s)://host:port` URL, a node key 64 hex;
anything else is skipped. Before a node is used the first time (and again after `VERIFY_TTL_S`)
its `/info` must name this model's hash, the shard and the shard's layers from the manifest.
Nodes that failed a question sit out `COOLDOWN_S` locally (they stay on chain until the
committee marks them DOWN).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from node.gateway.errors import NoCircuit
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

VERIFY_TTL_S = 60.0
COOLDOWN_S = 30.0
_KEY = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class RoutableNode:
    key: str  # ed25519 node key, 64 hex
    endpoint: str  # base URL
    shard: int


@dataclass(frozen=True, slots=True)
class Circuit:
    nodes: tuple[RoutableNode, ...]  # one per shard, in shard order

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(n.key for n in self.nodes)


class NodeSource(Protocol):
    async def compute_nodes(self) -> list[dict[str, Any]]: ...


class CommitteeNodes:
    """`/nodes?model=...&role=compute` from one validator's RPC."""

    def __init__(self, rpc: Any, model_hash: str) -> None:
        self.rpc = rpc
        self.model_hash = model_hash

    async def compute_nodes(self) -> list[dict[str, Any]]:
        answer = await self.rpc.abci_query(f"/nodes?model={self.model_hash}&role=compute")
        nodes = answer.get("nodes") if isinstance(answer, dict) else None
        return nodes if isinstance(nodes, list) else []


def clean_endpoint(value: Any) -> str | None:
    """`http(s)://host:port` with nothing else, or None."""
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def routable_by_shard(entries: Iterable[Any], shard_count: int) -> dict[int, list[RoutableNode]]:
    """Routable, well-formed entries grouped by shard (only shards 0..shard_count-1)."""
    out: dict[int, list[RoutableNode]] = {s: [] for s in range(shard_count)}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("routable") is not True:
            continue
        key, endpoint = entry.get("key"), clean_endpoint(entry.get("endpoint"))
        shards = entry.get("shards")
        if not isinstance(key, str) or not _KEY.match(key) or endpoint is None:
            continue
        if not isinstance(shards, list) or len(shards) != 1:
            continue
        shard = shards[0]
        if isinstance(shard, int) and not isinstance(shard, bool) and 0 <= shard < shard_count:
            out[shard].append(RoutableNode(key, endpoint, shard))
    return out


class Router:
    def __init__(
        self,
        source: NodeSource,
        *,
        model_hash: str,
        shard_layers: Sequence[tuple[int, int]],
        http: aiohttp.ClientSession,
        refresh_s: float = 2.0,
    ) -> None:
        self.source = source
        self.model_hash = model_hash
        self.shard_layers = tuple(shard_layers)
        self.http = http
        self.refresh_s = refresh_s
        self._cache: tuple[float, dict[int, list[RoutableNode]]] | None = None
        self._lock = asyncio.Lock()
        self._verified: dict[RoutableNode, float] = {}
        self._cooldown: dict[str, float] = {}
        self._random = secrets.SystemRandom()

    @property
    def shard_count(self) -> int:
        return len(self.shard_layers)

    async def routable(self) -> dict[int, list[RoutableNode]]:
        async with self._lock:
            now = time.monotonic()
            if self._cache is None or now - self._cache[0] > self.refresh_s:
                entries = await self.source.compute_nodes()
                self._cache = (time.monotonic(), routable_by_shard(entries, self.shard_count))
            return self._cache[1]

    def mark_failed(self, node: RoutableNode) -> None:
        log.warning("node failed; cooling down node=%s endpoint=%s", node.key[:16], node.endpoint)
        self._cooldown[node.key] = time.monotonic() + COOLDOWN_S
        self._verified.pop(node, None)

    def _cooling(self, node: RoutableNode) -> bool:
        until = self._cooldown.get(node.key)
        return until is not None and until > time.monotonic()

    async def _verify(self, node: RoutableNode) -> bool:
        checked = self._verified.get(node)
        if checked is not None and time.monotonic() - checked < VERIFY_TTL_S:
            return True
        try:
            async with asyncio.timeout(5):
                async with self.http.get(f"{node.endpoint}/info") as answer:
                    info = await answer.json(content_type=None) if answer.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.warning("node unreachable endpoint=%s error=%s", node.endpoint, error)
            self.mark_failed(node)
            return False
        expected = list(self.shard_layers[node.shard])
        if (
            not isinstance(info, dict)
            or info.get("model_hash") != self.model_hash
            or info.get("shard") != node.shard
            or info.get("layers") != expected
        ):
            log.warning("node serves something else endpoint=%s", node.endpoint)
            self.mark_failed(node)
            return False
        self._verified[node] = time.monotonic()
        return True

    async def circuit(self) -> Circuit:
        """One random eligible, verified node per shard; NoCircuit names the first empty shard."""
        routable = await self.routable()
        chosen: list[RoutableNode] = []
        for shard in range(self.shard_count):
            candidates = [n for n in routable.get(shard, []) if not self._cooling(n)]
            self._random.shuffle(candidates)
            for node in candidates:
                if await self._verify(node):
                    chosen.append(node)
                    break
            else:
                raise NoCircuit(
                    "no_routable_node",
                    f"no routable compute node serves shard {shard} of {self.shard_count} "
                    "right now; try again later",
                )
        return Circuit(tuple(chosen))

    async def probe(self, circuit: Circuit) -> None:
        """After a failed question: put every node of `circuit` that does not answer /health
        in cooldown."""

        async def one(node: RoutableNode) -> None:
            try:
                async with asyncio.timeout(2):
                    async with self.http.get(f"{node.endpoint}/health") as answer:
                        if answer.status == 200:
                            return
            except (aiohttp.ClientError, TimeoutError):
                pass
            self.mark_failed(node)

        await asyncio.gather(*(one(n) for n in circuit.nodes))


async def pool_view(rpc: Any, model_hash: str, shard_count: int) -> dict[str, Any]:
    """The committee's /pool_health for this model (routable per shard, status)."""
    try:
        answer = await rpc.abci_query(f"/pool_health?model={model_hash}&shards={shard_count}")
    except PlanetError as error:
        raise NoCircuit(
            "committee_unavailable", f"the committee chain is unreachable: {error}"
        ) from None
    return answer if isinstance(answer, dict) else {}
