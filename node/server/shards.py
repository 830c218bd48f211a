"""`GET /v1/shards/{shard}/chunks/{index}`: a node serves its own shard file, chunk by chunk, to
nodes that join the same shard (node/model/fetch.py downloads from several at once).

Only the shard this node serves, only chunks the manifest's chunk list names
(`ShardEntry.chunks`, committed by the registered model hash), and each chunk is checked
against that list before it is sent: a node whose file changed on disk refuses (500
`integrity`) rather than spreading a bad chunk. Answers are `application/octet-stream` with
`X-Planet-Chunk-Sha256` (the listed hash) and `Cache-Control: no-store`.

Bounded per caller (the peer address, node/server/peers.py): a token bucket of
`chunk_bytes_per_s_per_peer` bytes a second (burst: 4 chunks), at most
`max_chunk_requests_per_peer` requests at once per caller and `max_chunk_requests` in all.
Over a limit: 429 `busy` with `Retry-After` (seconds), or 503 `busy` when the node is full.
`GET /v1/shards/{shard}` describes what is served: model hash, shard, size, file hash,
chunk size and count.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from node.model.manifest import Manifest, ShardEntry
from node.server.config import ServerConfig
from node.server.peers import peer_key
from node.server.sessions import PeerQuotaError
from protocol.canonical import sha256_hex
from protocol.errors import BusyError, IntegrityError, PlanetError

BURST_CHUNKS = 4


class NoChunksError(PlanetError):
    code = "not_found"
    http_status = 404


class BadChunkRequestError(PlanetError):
    code = "bad_request"
    http_status = 400


class ChunkRateError(PeerQuotaError):
    """A caller fetches faster than its share; `retry_after_s` says when it may go on."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, hint=f"retry in {retry_after_s} s, or fetch from other peers")
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class ChunkServer:
    """The shard file and the limits; one per node app (`install_chunks`)."""

    config: ServerConfig
    clock: Callable[[], float] = time.monotonic
    _entry: tuple[str, ShardEntry, Path] | None = None  # (model hash, entry, file), loaded once
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _active: dict[str, int] = field(default_factory=dict)

    def served(self) -> tuple[str, ShardEntry, Path]:
        if self._entry is None:
            try:
                manifest = Manifest.load(self.config.manifest_path)
                entry = manifest.shard(self.config.shard_id)
            except PlanetError:
                raise NoChunksError("this node has no manifest to serve chunks from") from None
            if not entry.chunks:
                raise NoChunksError(
                    "this shard's manifest has no chunk list (prepared before chunk lists); "
                    "fetch it from the model's origin"
                )
            path = self.config.manifest_path.parent / entry.file
            self._entry = (manifest.model_hash, entry, path)
        return self._entry

    def _take(self, peer: str, amount: int) -> None:
        """Spend `amount` bytes of `peer`'s bucket, or raise ChunkRateError."""
        rate = self.config.chunk_bytes_per_s_per_peer
        entry = self.served()[1]
        burst = max(rate, BURST_CHUNKS * entry.chunk_size)
        now = self.clock()
        bucket = self._buckets.setdefault(peer, _Bucket(float(burst), now))
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < amount:
            wait = math.ceil((amount - bucket.tokens) / rate)
            raise ChunkRateError(
                f"this address fetches shard chunks faster than {rate} bytes/s", max(wait, 1)
            )
        bucket.tokens -= amount
        if len(self._buckets) > 4096:  # forget callers whose buckets are full again
            full = [p for p, b in self._buckets.items() if (now - b.at) * rate >= burst]
            for stale in full:
                del self._buckets[stale]

    def _enter(self, peer: str) -> None:
        if sum(self._active.values()) >= self.config.max_chunk_requests:
            raise BusyError("the node is serving as many chunk requests as it allows")
        if self._active.get(peer, 0) >= self.config.max_chunk_requests_per_peer:
            raise PeerQuotaError(
                f"this address has {self.config.max_chunk_requests_per_peer} chunk requests "
                "running here"
            )
        self._active[peer] = self._active.get(peer, 0) + 1

    def _leave(self, peer: str) -> None:
        left = self._active.get(peer, 1) - 1
        if left > 0:
            self._active[peer] = left
        else:
            self._active.pop(peer, None)

    async def chunk(self, request: web.Request) -> web.Response:
        shard = _number(request.match_info["shard"], "shard")
        index = _number(request.match_info["index"], "chunk index")
        model_hash, entry, path = self.served()
        if shard != entry.shard_id:
            raise NoChunksError(f"this node serves shard {entry.shard_id}, not {shard}")
        if index >= len(entry.chunks):
            raise NoChunksError(f"shard {shard} has {len(entry.chunks)} chunks")
        peer = peer_key(request.remote)
        offset, length = entry.chunk_span(index)
        self._enter(peer)
        try:
            self._take(peer, length)
            data = await asyncio.to_thread(_read, path, offset, length)
        except ChunkRateError as error:
            return web.json_response(
                error.to_json(), status=429, headers={"Retry-After": str(error.retry_after_s)}
            )
        finally:
            self._leave(peer)
        if sha256_hex(data) != entry.chunks[index]:
            raise IntegrityError(
                f"chunk {index} of this node's shard file does not match the manifest",
                hint="the operator should fetch the shard again",
            )
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={
                "X-Planet-Chunk-Sha256": entry.chunks[index],
                "X-Planet-Model-Hash": model_hash,
                "Cache-Control": "no-store",
            },
        )

    async def describe(self, request: web.Request) -> web.Response:
        shard = _number(request.match_info["shard"], "shard")
        model_hash, entry, _ = self.served()
        if shard != entry.shard_id:
            raise NoChunksError(f"this node serves shard {entry.shard_id}, not {shard}")
        return web.json_response(
            {
                "model_hash": model_hash,
                "shard": entry.shard_id,
                "size": entry.size,
                "hash": entry.hash,
                "chunk_size": entry.chunk_size,
                "chunks": len(entry.chunks),
            }
        )


def _number(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise BadChunkRequestError(f"{what} must be a decimal number, got {text[:20]!r}")
    return int(text)


def _read(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)


CHUNKS_KEY = web.AppKey("chunks", ChunkServer)


def install_chunks(app: web.Application, config: ServerConfig) -> ChunkServer:
    """Add the chunk routes to a node app."""
    server = ChunkServer(config)
    app[CHUNKS_KEY] = server
    app.router.add_get("/v1/shards/{shard}/chunks/{index}", server.chunk)
    app.router.add_get("/v1/shards/{shard}", server.describe)
    return server
