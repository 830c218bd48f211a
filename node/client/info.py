"""GET /info of a circuit's nodes, and the check that they form the circuit a manifest expects.

`planet ask` checks the circuit before it opens any session: every node serves this model
(manifest hash), the shard the nodes file names, and the shards' layers run 0..total without a gap.
Answers are read through node/client/answers.py (bounded, JSON objects only).

A `NodeReader` reads them another way: `planet ask --relays` reads every /info and health over
the user's relay paths (node/gateway/node_info.py `OverlayHopReader`), so that no request of
the client reaches a node from the user's address (issue 43); None reads them directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp

from node.client.answers import (
    MAX_JSON_ANSWER_BYTES,
    BadAnswerError,
    parse_error_body,
    parse_json_object,
    read_bounded,
)
from node.client.types import Hop
from node.dial import first_reachable
from node.links import link_ssl, refusal
from protocol.errors import BusyError, ConfigError, RemoteError, UnavailableError
from protocol.links import NodeKeyMismatchError

INFO_FALLBACK_S = 30.0  # a node behind NAT: its addresses at its relays, all tried within this


class NodeReader(Protocol):
    """How a client reads a node's GET /info and asks whether it is healthy, other than
    directly (`node_info`, `node.client.failover.unhealthy_hops`)."""

    timeout_s: float  # how long one /info read may take

    async def info(self, hop: Hop) -> dict[str, Any]:
        """The node's /info as a JSON object; a PlanetError naming the node when unreadable."""
        ...

    async def healthy(self, hop: Hop, timeout_s: float) -> bool:
        """Whether the node answers within `timeout_s` (or the reader's own longer bound)."""
        ...


async def node_info(
    http: aiohttp.ClientSession, hop: Hop, *, plaintext_links: bool = False
) -> dict[str, Any]:
    """One node's GET /info as a JSON object (pinned to `hop.key` over https). A node behind
    NAT with `alternates` is asked at each of its relays' addresses in turn while the one
    before is not reachable (`UnavailableError`) or is not the node (`node_key_mismatch`: that
    relay gave the port to another), within INFO_FALLBACK_S."""
    if not hop.alternates:
        return await _node_info_at(http, hop, hop.url, plaintext_links)
    try:
        _, info = await first_reachable(
            hop.addresses,
            lambda url: _node_info_at(http, hop, url, plaintext_links),
            total_s=INFO_FALLBACK_S,
            what=f"node {hop.url} (shard {hop.shard}) /info",
            errors=(UnavailableError, NodeKeyMismatchError, TimeoutError),
        )
    except TimeoutError:  # every address took the connection and never answered in its share
        raise UnavailableError(
            f"node {hop.url} (shard {hop.shard}) is not reachable: no /info answer at any of "
            f"its {len(hop.addresses)} addresses within {INFO_FALLBACK_S:g} s",
            hint="check `planet local status`, or start nodes with `planet local up`",
        ) from None
    return info


async def _node_info_at(
    http: aiohttp.ClientSession, hop: Hop, url: str, plaintext_links: bool
) -> dict[str, Any]:
    pin = link_ssl(url, hop.key, plaintext_ok=plaintext_links)
    try:
        async with http.get(f"{url}/info", ssl=pin) as answer:
            if answer.status != 200:
                try:
                    body = await read_bounded(answer, MAX_JSON_ANSWER_BYTES, hop.url)
                except BadAnswerError:
                    body = b""
                code, message = parse_error_body(body)
                if code == "busy":
                    raise BusyError(
                        f"node {hop.url} (shard {hop.shard}) is busy: {message}",
                        hint="retry in a moment, or add nodes for this shard",
                    )
                raise RemoteError(
                    f"node {hop.url} (shard {hop.shard})",
                    code,
                    message or f"HTTP {answer.status}",
                    http_status=answer.status,
                )
            body = await read_bounded(answer, MAX_JSON_ANSWER_BYTES, hop.url)
            return parse_json_object(body, hop.url)
    except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as error:
        raise BadAnswerError(hop.url, f"malformed HTTP answer: {error}"[:200]) from None
    except (aiohttp.ClientConnectionError, TimeoutError) as error:
        named = refusal(error, url)
        if named is not None:
            raise named from None
        raise UnavailableError(
            f"node {url} (shard {hop.shard}) is not reachable: {type(error).__name__}",
            hint="check `planet local status`, or start nodes with `planet local up`",
        ) from None


async def node_infos(
    http: aiohttp.ClientSession,
    hops: Sequence[Hop],
    *,
    plaintext_links: bool = False,
    reader: NodeReader | None = None,
) -> list[dict[str, Any]]:
    """GET /info from every node of the circuit (concurrently), in circuit order; through
    `reader` when given."""
    if reader is not None:
        return list(await asyncio.gather(*(reader.info(hop) for hop in hops)))
    return list(
        await asyncio.gather(
            *(node_info(http, hop, plaintext_links=plaintext_links) for hop in hops)
        )
    )


async def check_circuit(
    http: aiohttp.ClientSession,
    hops: Sequence[Hop],
    model_hash: str,
    total_layers: int,
    *,
    plaintext_links: bool = False,
    reader: NodeReader | None = None,
) -> list[dict[str, Any]]:
    """Every node serves the expected shard of this model; the layers run 0..total, no gap."""
    infos = await node_infos(http, hops, plaintext_links=plaintext_links, reader=reader)
    expected_start = 0
    for hop, info in zip(hops, infos, strict=True):
        if info.get("model_hash") != model_hash:
            raise ConfigError(
                f"node {hop.url} serves model {str(info.get('model_hash'))[:80]}, "
                f"the manifest says {model_hash}",
                hint="the nodes file and the running nodes disagree; run `planet local up`",
            )
        if info.get("shard") != hop.shard:
            raise ConfigError(
                f"node {hop.url} serves shard {str(info.get('shard'))[:20]}, expected {hop.shard}"
            )
        if info.get("shards", [hop.shard]) != list(hop.span.shards):
            raise ConfigError(
                f"node {hop.url} serves shards {str(info.get('shards'))[:40]}, "
                f"expected {list(hop.span.shards)}",
                hint="list a span node once, with its first shard and `last`",
            )
        layers = info.get("layers")
        if (
            not isinstance(layers, list)
            or len(layers) != 2
            or not all(type(v) is int for v in layers)
        ):
            raise BadAnswerError(hop.url, f"/info layers is not [start, end]: {layers!r:.60}")
        if layers[0] != expected_start:
            raise ConfigError(
                f"node {hop.url} starts at layer {layers[0]}, expected {expected_start}"
            )
        expected_start = layers[1]
    if expected_start != total_layers:
        raise ConfigError(f"circuit covers layers 0-{expected_start}, model has {total_layers}")
    return infos
