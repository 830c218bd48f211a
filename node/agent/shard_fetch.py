"""A move's fetch of the target shard's file (issue 44): the join path's fetch
(node/model/fetch.py `fetch_shard`), fed from the committee's list of the nodes serving it.

    summary = await fetch_for_move(link, manifest, manifest_file, shard, own_key, origin)

Sources, in order: every node the committee lists SERVING the shard (routable or not: a node
whose stake is not agreed yet still answers `GET /v1/shards/{shard}/chunks/{i}`), this node
excepted, each dialled with TLS pinned to its listed key; then the model's origin when
`planet join --origin` named one. Each chunk is checked against the manifest's chunk list and
the whole file against its hash; the download resumes from `<file>.part`; each serving node
bounds what one caller takes (node/server/shards.py). Whatever goes wrong is one `FetchFailed`
line: no source at all, every source failed, the committee did not answer, the disk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from node.agent.mover import FetchFailed
from node.links import NodeKeyPin, probe_context
from node.model.fetch import Progress, fetch_shard
from node.model.manifest import Manifest, ShardEntry
from protocol.errors import PlanetError


class ServingList(Protocol):
    async def nodes(self, **filters: Any) -> list[dict[str, Any]]: ...


Fetcher = Callable[..., Awaitable[Progress]]


def peer_ssl(keys: Mapping[str, str]) -> Callable[[str], Any]:
    """aiohttp's `ssl=` per peer URL. Nodes serve TLS bound to their node key (node/links.py):
    a peer whose key the committee lists is pinned to it; an https peer without a known key
    is dialled without authentication — every chunk is checked against the manifest's hash, so
    an impostor can waste a fetch's time (and is banned), never change the file."""
    unpinned = probe_context()
    pins = {url.rstrip("/"): NodeKeyPin(key) for url, key in keys.items()}

    def ssl_for(peer: str) -> Any:
        if not peer.startswith("https://"):
            return True
        return pins.get(peer.rstrip("/"), unpinned)

    return ssl_for


async def serving_peers(link: ServingList, model: str, shard: int, own_key: str) -> dict[str, str]:
    """{endpoint: node key} of the nodes the committee lists SERVING `shard`, but this one."""
    nodes = await link.nodes(model=model, shard=shard, status="serving")
    return {
        node["endpoint"].rstrip("/"): node["key"]
        for node in nodes
        if isinstance(node.get("endpoint"), str)
        and node["endpoint"].startswith(("http://", "https://"))
        and isinstance(node.get("key"), str)
        and node["key"] != own_key
    }


async def fetch_for_move(
    link: ServingList,
    manifest: Manifest,
    manifest_file: Path,
    shard: int,
    own_key: str,
    origin: str | None,
    *,
    fetch: Fetcher = fetch_shard,
) -> str:
    """Shard `shard`'s file beside `manifest_file`; returns a one-line summary of where it came
    from, or raises FetchFailed with the reason."""
    try:
        entry: ShardEntry = manifest.shard(shard)
        peers = await serving_peers(link, manifest.model_hash, shard, own_key)
    except PlanetError as error:
        raise FetchFailed(f"the nodes serving it could not be listed: {error.message}") from None
    if not peers and origin is None:
        raise FetchFailed(
            f"no node serves shard {shard} and no origin is known (`planet join --origin`): "
            "its file has no source"
        )
    target = manifest_file.parent / entry.file
    try:
        report = await fetch(entry, target, list(peers), origin=origin, peer_ssl=peer_ssl(peers))
    except PlanetError as error:
        raise FetchFailed(error.message) from None
    except OSError as error:
        raise FetchFailed(f"{target}: {error}") from None
    sources = ", ".join(f"{n} from {s}" for s, n in sorted(report.by_source.items()))
    return (
        f"{report.total} chunks ({report.reused} already there; {sources or 'none fetched'}) "
        f"in {report.seconds:.1f} s"
    )
