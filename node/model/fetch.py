"""Fetch a shard file from the nodes that already serve it, chunk by chunk, checking each.

The manifest's chunk list (`ShardEntry.chunks`, committed by the registered model hash) says
what every `chunk_size` piece of the file must hash to. `fetch_shard` downloads the missing
chunks from several peers at once (`GET {peer}/v1/shards/{k}/chunks/{i}`, node/server/shards.py),
`WORKERS_PER_PEER` requests per peer, and checks each chunk as it arrives:

- a chunk that does not match the list bans its peer for the rest of the fetch (and in the
  `.bans.json` file beside the download, so a resumed fetch keeps the ban); the chunk goes
  back to the queue for the other peers;
- 429 / 503 `busy` waits `Retry-After` (at most `MAX_WAIT_S`) and tries again; other failures
  (refused connection, timeout, 404, 5xx) count against the peer, which is dropped after
  `MAX_PEER_FAILURES` in a row;
- once no peer is left, the remaining chunks come from the model's origin (`origin`: the
  directory or base URL of the prepared model, asked with `Range:` requests), checked the same
  way; an origin chunk that does not match is an `IntegrityError`.

Resumable: chunks are written in place into `<file>.part` (preallocated to the file's size);
a new fetch re-hashes that file and keeps every chunk that already matches. When every chunk
is there the whole-file hash is checked and `.part` is renamed to the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from node.model.manifest import ShardEntry, verify_file
from protocol.canonical import sha256_hex
from protocol.errors import ConfigError, IntegrityError, UnavailableError

WORKERS_PER_PEER = 2
MAX_PEER_FAILURES = 3
MAX_PEER_WAITS = 30  # `busy` answers in a row before a peer is dropped
MAX_WAIT_S = 5.0
CHUNK_TIMEOUT_S = 30.0
ORIGIN_WORKERS = 2


class NoSourceError(UnavailableError):
    code = "no_source"


@dataclass
class Progress:
    """What `fetch_shard` reports to its `on_progress` callback after each chunk."""

    total: int
    done: int = 0
    reused: int = 0
    bytes: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    banned: dict[str, str] = field(default_factory=dict)  # peer -> why
    dropped: dict[str, str] = field(default_factory=dict)  # peer -> last failure
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "chunks": self.total,
            "reused": self.reused,
            "fetched": self.done - self.reused,
            "bytes": self.bytes,
            "by_source": dict(sorted(self.by_source.items())),
            "banned": dict(sorted(self.banned.items())),
            "dropped": dict(sorted(self.dropped.items())),
            "seconds": round(self.seconds, 3),
        }


class _BadChunk(Exception):
    """A peer answered a chunk whose bytes do not match the list."""


class _Retry(Exception):
    def __init__(self, wait_s: float) -> None:
        super().__init__(wait_s)
        self.wait_s = wait_s


def part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def bans_path(target: Path) -> Path:
    return target.with_name(target.name + ".bans.json")


def matching_chunks(path: Path, entry: ShardEntry) -> set[int]:
    """Indices of the chunks of `path` (a partial download) that already match the list."""
    done: set[int] = set()
    if not path.exists():
        return done
    with path.open("rb") as handle:
        for index, expected in enumerate(entry.chunks):
            offset, length = entry.chunk_span(index)
            handle.seek(offset)
            piece = handle.read(length)
            if len(piece) == length and sha256_hex(piece) == expected:
                done.add(index)
    return done


def _load_bans(target: Path) -> dict[str, str]:
    try:
        loaded = json.loads(bans_path(target).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): str(v) for k, v in loaded.items()}


@dataclass
class _Fetch:
    entry: ShardEntry
    target: Path
    http: aiohttp.ClientSession
    progress: Progress
    on_progress: Callable[[Progress], None]
    started: float
    queue: list[int] = field(default_factory=list)
    fd: int = -1
    # aiohttp's `ssl=` for a peer URL: nodes serve TLS bound to their node key (node/links.py)
    peer_ssl: Callable[[str], Any] = lambda _peer: True

    def write(self, index: int, data: bytes, source: str) -> None:
        offset, _ = self.entry.chunk_span(index)
        os.pwrite(self.fd, data, offset)
        self.progress.done += 1
        self.progress.bytes += len(data)
        self.progress.by_source[source] = self.progress.by_source.get(source, 0) + 1
        self.progress.seconds = time.monotonic() - self.started
        self.on_progress(self.progress)

    def check(self, index: int, data: bytes) -> None:
        _, length = self.entry.chunk_span(index)
        if len(data) != length or sha256_hex(data) != self.entry.chunks[index]:
            raise _BadChunk(f"chunk {index} does not match the manifest's chunk list")

    # -- peers -----------------------------------------------------------------------------
    async def from_peer(self, peer: str, index: int) -> bytes:
        url = f"{peer.rstrip('/')}/v1/shards/{self.entry.shard_id}/chunks/{index}"
        timeout = aiohttp.ClientTimeout(total=CHUNK_TIMEOUT_S)
        async with self.http.get(url, timeout=timeout, ssl=self.peer_ssl(peer)) as response:
            if response.status in (429, 503):
                retry = response.headers.get("Retry-After", "1")
                wait = float(retry) if retry.isdigit() else 1.0
                raise _Retry(min(max(wait, 0.1), MAX_WAIT_S))
            if response.status != 200:
                raise UnavailableError(f"HTTP {response.status}")
            data = await _read_at_most(response.content, self.entry.chunk_size + 1)
        self.check(index, data)
        return data

    def drop(self, peer: str, why: str) -> None:
        self.progress.dropped[peer] = why[:200]
        self.on_progress(self.progress)

    async def peer_worker(self, peer: str, failures: dict[str, int], waits: dict[str, int]) -> None:
        while self.queue and peer not in self.progress.banned and peer not in self.progress.dropped:
            index = self.queue.pop(0)
            try:
                data = await self.from_peer(peer, index)
            except _BadChunk as error:
                self.queue.append(index)
                self.ban(peer, str(error))
                return
            except _Retry as retry:
                self.queue.append(index)
                waits[peer] = waits.get(peer, 0) + 1
                if waits[peer] >= MAX_PEER_WAITS:
                    self.drop(peer, f"busy {MAX_PEER_WAITS} times in a row")
                    return
                await asyncio.sleep(retry.wait_s)
                continue
            except (aiohttp.ClientError, TimeoutError, UnavailableError, OSError) as error:
                self.queue.append(index)
                failures[peer] = failures.get(peer, 0) + 1
                if failures[peer] >= MAX_PEER_FAILURES:
                    self.drop(peer, f"{type(error).__name__}: {error}")
                    return
                await asyncio.sleep(0.2 * failures[peer])
                continue
            failures[peer] = waits[peer] = 0
            self.write(index, data, peer)

    def ban(self, peer: str, why: str) -> None:
        self.progress.banned[peer] = why
        bans_path(self.target).write_text(json.dumps(self.progress.banned, sort_keys=True))
        self.on_progress(self.progress)

    async def from_peers(self, peers: list[str]) -> None:
        failures: dict[str, int] = {}
        waits: dict[str, int] = {}
        while self.queue:
            usable = [
                p for p in peers if p not in self.progress.banned and p not in self.progress.dropped
            ]
            if not usable:
                return
            await asyncio.gather(
                *(
                    self.peer_worker(p, failures, waits)
                    for p in usable
                    for _ in range(WORKERS_PER_PEER)
                )
            )

    # -- origin ----------------------------------------------------------------------------
    async def from_origin_chunk(self, origin: str, index: int) -> bytes:
        offset, length = self.entry.chunk_span(index)
        if not origin.startswith(("http://", "https://")):
            return await asyncio.to_thread(
                _read_span, Path(origin) / self.entry.file, offset, length
            )
        url = f"{origin.rstrip('/')}/{self.entry.file}"
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        timeout = aiohttp.ClientTimeout(total=CHUNK_TIMEOUT_S * 4)
        async with self.http.get(url, headers=headers, timeout=timeout) as response:
            if response.status == 206:
                return await _read_at_most(response.content, length + 1)
            if response.status == 200:  # no Range support: skip to the chunk
                if offset:
                    await response.content.readexactly(offset)
                return await _read_at_most(response.content, length)
            raise UnavailableError(f"the origin answered HTTP {response.status} for {url}")

    async def from_origin(self, origin: str) -> None:
        async def worker() -> None:
            while self.queue:
                index = self.queue.pop(0)
                try:
                    data = await self.from_origin_chunk(origin, index)
                    self.check(index, data)
                except _BadChunk as error:
                    raise IntegrityError(
                        f"the model's origin {origin}: {error}",
                        hint="the origin holds other files than the registered model",
                    ) from None
                except (aiohttp.ClientError, TimeoutError, OSError) as error:
                    raise NoSourceError(
                        f"the model's origin {origin} failed: {error}",
                        hint="check the origin, or name peers that serve the shard",
                    ) from None
                self.write(index, data, "origin")

        await asyncio.gather(*(worker() for _ in range(ORIGIN_WORKERS)))


async def _read_at_most(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """The body's bytes until its end or `limit` bytes, whichever comes first (`read(n)` alone
    returns what has arrived so far)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        piece = await stream.read(min(limit - size, 1 << 20))
        if not piece:
            break
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _read_span(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)


async def fetch_shard(
    entry: ShardEntry,
    target: Path,
    peers: list[str],
    *,
    origin: str | None = None,
    http: aiohttp.ClientSession | None = None,
    on_progress: Callable[[Progress], None] = lambda _p: None,
    peer_ssl: Callable[[str], Any] = lambda _peer: True,
) -> Progress:
    """Make `target` the shard file `entry` describes; see the module docstring. `peer_ssl`
    gives aiohttp's `ssl=` for each peer URL (the caller pins each node's TLS key)."""
    if not entry.chunks:
        raise ConfigError(
            f"shard {entry.shard_id}'s manifest has no chunk list (prepared before chunk lists)",
            hint="fetch the model from its origin (planet model prepare), or ask its publisher "
            "for a manifest with chunk lists",
        )
    part = part_path(target)
    progress = Progress(total=len(entry.chunks), banned=_load_bans(target))
    started = time.monotonic()
    with part.open("ab"):
        pass
    if part.stat().st_size != entry.size:
        os.truncate(part, entry.size)
    done = await asyncio.to_thread(matching_chunks, part, entry)
    progress.done = progress.reused = len(done)
    own = http is None
    session = http or aiohttp.ClientSession(skip_auto_headers=("User-Agent",))
    fd = os.open(part, os.O_WRONLY)
    try:
        fetch = _Fetch(
            entry, target, session, progress, on_progress, started, fd=fd, peer_ssl=peer_ssl
        )
        fetch.queue = [i for i in range(len(entry.chunks)) if i not in done]
        on_progress(progress)
        await fetch.from_peers(list(dict.fromkeys(peers)))
        if fetch.queue:
            if origin is None:
                raise NoSourceError(
                    f"{len(fetch.queue)} of {len(entry.chunks)} chunks of shard "
                    f"{entry.shard_id} are missing and no peer is left "
                    f"(banned {len(progress.banned)}, dropped {len(progress.dropped)})",
                    hint="run it again to resume, name more peers, or give the model's origin",
                )
            await fetch.from_origin(origin)
        os.fsync(fd)
    finally:
        os.close(fd)
        if own:
            await session.close()
    verify_file(part, entry.hash)
    os.replace(part, target)
    with contextlib.suppress(FileNotFoundError):
        bans_path(target).unlink()
    progress.seconds = time.monotonic() - started
    return progress
