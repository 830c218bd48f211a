"""A move fetches its target shard's file (node/agent/shard_fetch.py through
node/agent/node_host.py `ProcessHost.fetch`): from a node's real chunk routes
(node/server/shards.py, in-process), the nodes listed by a fake committee; from the origin when
no node serves it; one `FetchFailed` line when the file has no source."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from node.agent.mover import FetchFailed
from node.agent.node_host import NodeLaunch, ProcessHost
from node.model.fetch import part_path
from node.model.manifest import Manifest, ShardEntry, chunk_hashes
from node.server.app import error_middleware
from node.server.config import ServerConfig
from node.server.shards import install_chunks
from protocol.canonical import hash_file

pytestmark = pytest.mark.unit

CHUNK = 1024
ME, PEER = "aa" * 32, "bb" * 32


def model_dir(directory: Path, data: bytes | None) -> tuple[Path, Manifest]:
    """A one-shard model in `directory` (its file there when `data` is given)."""
    directory.mkdir(parents=True)
    source = directory.parent / f"{directory.name}.src"
    source.write_bytes(data or SOURCE)
    entry = ShardEntry(shard_id=0, layers=(0, 2), hash=hash_file(source),
                       size=source.stat().st_size, quant="none", file="shard_0.safetensors",
                       chunk_size=CHUNK, chunks=chunk_hashes(source, CHUNK))  # fmt: skip
    if data is not None:
        (directory / entry.file).write_bytes(data)
    fake = "sha256:" + "0" * 64
    manifest = Manifest.build(model_id="test", total_layers=2, hidden_size=8, dtype="float32",
                              tokenizer_hash=fake, config_hash=fake, client_hash=fake,
                              shards=(entry,))  # fmt: skip
    (directory / "manifest.json").write_text(json.dumps(manifest.to_json()))
    return directory / "manifest.json", manifest


SOURCE = os.urandom(5 * CHUNK + 300)


class Committee:
    """`nodes(model=, shard=, status=)` as the committee answers it: the listed entries."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.asked: list[dict[str, Any]] = []

    async def nodes(self, **filters: Any) -> list[dict[str, Any]]:
        self.asked.append(filters)
        return self.entries


def mover_host(tmp_path: Path, committee: Committee, origin: str | None = None) -> ProcessHost:
    manifest_file, _ = model_dir(tmp_path / "mine", None)  # the mover lacks the file
    launch = NodeLaunch(manifest_file, "127.0.0.1", (), tmp_path / "key", origin)
    return ProcessHost(tmp_path / "run", launch, ME, "pw", committee)


async def test_a_move_fetches_the_shard_from_a_node_serving_its_chunks(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    served, manifest = model_dir(tmp_path / "peer", SOURCE)
    app = web.Application(middlewares=[error_middleware])
    install_chunks(app, ServerConfig(manifest_path=served, shard_id=0))  # a real node's routes
    peer = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    committee = Committee([{"key": PEER, "endpoint": peer}, {"key": ME, "endpoint": "http://x"}])
    host = mover_host(tmp_path, committee)
    assert not host.available(0)
    # an interrupted earlier fetch left two good chunks: they are kept (resumable)
    target = tmp_path / "mine" / "shard_0.safetensors"
    part_path(target).write_bytes(SOURCE[: 2 * CHUNK])
    summary = await host.fetch(0)
    assert target.read_bytes() == SOURCE and host.available(0)
    assert summary.startswith("6 chunks (2 already there; 4 from " + peer)
    assert committee.asked == [{"model": manifest.model_hash, "shard": 0, "status": "serving"}]


async def test_with_no_node_serving_it_the_origin_is_the_source(tmp_path: Path) -> None:
    origin, _ = model_dir(tmp_path / "origin", SOURCE)
    host = mover_host(tmp_path, Committee([]), origin=str(origin.parent))
    assert host.has_origin()
    assert (await host.fetch(0)).startswith("6 chunks (0 already there; 6 from origin)")
    assert (tmp_path / "mine" / "shard_0.safetensors").read_bytes() == SOURCE


async def test_no_source_is_one_line_and_the_node_itself_does_not_count(tmp_path: Path) -> None:
    host = mover_host(tmp_path, Committee([{"key": ME, "endpoint": "https://127.0.0.1:1"}]))
    assert not host.has_origin()
    with pytest.raises(FetchFailed) as failed:
        await host.fetch(0)
    assert failed.value.why == (
        "no node serves shard 0 and no origin is known (`planet join --origin`): its file has "
        "no source"
    )
    assert not host.available(0)


async def test_every_source_failing_is_one_line_and_the_part_file_stays(tmp_path: Path) -> None:
    host = mover_host(tmp_path, Committee([{"key": PEER, "endpoint": "http://127.0.0.1:9"}]))
    with pytest.raises(FetchFailed) as failed:
        await host.fetch(0)
    assert "chunks of shard 0 are missing and no peer is left" in failed.value.why
    assert part_path(tmp_path / "mine" / "shard_0.safetensors").exists()  # resumed next time
