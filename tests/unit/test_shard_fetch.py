"""Shard chunk lists, nodes serving their shard by chunks, and fetching a shard from peers
(node/model/manifest.py, node/server/shards.py, node/model/fetch.py). The peers here are
in-process aiohttp apps; tests/integration/test_shard_fetch_nodes.py uses real nodes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from node.model import fetch as fetch_module
from node.model.fetch import NoSourceError, bans_path, fetch_shard, part_path
from node.model.manifest import Manifest, ShardEntry, chunk_hashes
from node.server.app import error_middleware
from node.server.config import ServerConfig
from node.server.shards import install_chunks
from protocol.canonical import hash_file
from protocol.errors import ConfigError, IntegrityError

CHUNK = 1024
ASKED = web.AppKey("asked", list[int])
SIZE = 5 * CHUNK + 300  # six chunks, the last one short


def _flip(data: bytes, at: int) -> bytes:
    """`data` with the byte at `at` inverted: surely changed (writing a fixed byte over random
    data leaves it unchanged once in 256 runs)."""
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.fixture
def shard_file(tmp_path: Path) -> tuple[ShardEntry, bytes]:
    data = os.urandom(SIZE)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    entry = ShardEntry(
        shard_id=0,
        layers=(0, 2),
        hash=hash_file(source),
        size=SIZE,
        quant="none",
        file="shard_0.safetensors",
        chunk_size=CHUNK,
        chunks=chunk_hashes(source, CHUNK),
    )
    return entry, data


def peer_app(entry: ShardEntry, data: bytes, *, corrupt: set[int] | None = None) -> web.Application:
    """A fake peer: serves `data` by chunks, flipping a byte of the chunks in `corrupt`, and
    counts the requests it got in app[ASKED]."""
    app = web.Application()
    app[ASKED] = []

    async def chunk(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        app[ASKED].append(index)
        offset, length = entry.chunk_span(index)
        piece = bytearray(data[offset : offset + length])
        if corrupt is not None and index in corrupt:
            piece[0] ^= 0xFF
        return web.Response(body=bytes(piece))

    app.router.add_get("/v1/shards/{shard}/chunks/{index}", chunk)
    return app


async def start(aiohttp_server: Any, app: web.Application) -> str:
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def test_three_peers_share_the_download_and_the_file_matches(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    apps = [peer_app(entry, data) for _ in range(3)]
    peers = [await start(aiohttp_server, app) for app in apps]
    target = tmp_path / "out" / entry.file
    target.parent.mkdir()
    seen: list[int] = []
    report = await fetch_shard(entry, target, peers, on_progress=lambda p: seen.append(p.done))
    assert target.read_bytes() == data
    assert not part_path(target).exists()
    assert report.done == 6 and report.reused == 0 and not report.banned
    assert sum(report.by_source.values()) == 6
    assert len([p for p in peers if report.by_source.get(p)]) >= 2  # in parallel
    assert seen[-1] == 6 and seen == sorted(seen)
    assert sorted(i for app in apps for i in app[ASKED]) == list(range(6))


async def test_a_chunk_that_arrives_in_pieces_is_read_whole(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    app = web.Application()

    async def trickle(request: web.Request) -> web.StreamResponse:
        offset, length = entry.chunk_span(int(request.match_info["index"]))
        answer = web.StreamResponse()
        await answer.prepare(request)
        for start in range(offset, offset + length, 256):
            await answer.write(data[start : min(start + 256, offset + length)])
            await asyncio.sleep(0.005)
        await answer.write_eof()
        return answer

    app.router.add_get("/v1/shards/{shard}/chunks/{index}", trickle)
    peer = await start(aiohttp_server, app)
    target = tmp_path / entry.file
    report = await fetch_shard(entry, target, [peer])
    assert target.read_bytes() == data and not report.banned


async def test_a_peer_serving_a_bad_chunk_is_banned_and_the_fetch_completes(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    bad_app = peer_app(entry, data, corrupt=set(range(6)))
    bad = await start(aiohttp_server, bad_app)
    good = await start(aiohttp_server, peer_app(entry, data))
    target = tmp_path / entry.file
    report = await fetch_shard(entry, target, [bad, good])
    assert target.read_bytes() == data
    assert list(report.banned) == [bad]
    assert "chunk" in report.banned[bad]
    assert bad not in report.by_source and report.by_source[good] == 6
    # banned at its first bad chunk: no worker asked it again
    assert len(bad_app[ASKED]) <= fetch_module.WORKERS_PER_PEER


async def test_resume_keeps_the_chunks_already_there_and_the_bans(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    target = tmp_path / entry.file
    part = part_path(target)
    part.write_bytes(data[: 3 * CHUNK] + b"\0" * (SIZE - 3 * CHUNK))  # chunks 0-2 done
    banned = "http://127.0.0.1:9"
    bans_path(target).write_text(json.dumps({banned: "chunk 1 does not match"}))
    app = peer_app(entry, data)
    peer = await start(aiohttp_server, app)
    report = await fetch_shard(entry, target, [banned, peer])
    assert target.read_bytes() == data
    assert report.reused == 3 and report.by_source == {peer: 3}
    assert sorted(app[ASKED]) == [3, 4, 5]
    assert banned in report.banned
    assert not bans_path(target).exists()


async def test_no_peer_left_keeps_the_partial_file_and_says_how_to_go_on(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    bad = await start(aiohttp_server, peer_app(entry, data, corrupt={4}))
    target = tmp_path / entry.file
    with pytest.raises(NoSourceError) as raised:
        await fetch_shard(entry, target, [bad, "http://127.0.0.1:9"])
    assert "missing" in raised.value.message and raised.value.hint
    assert not target.exists() and part_path(target).exists()
    assert bad in json.loads(bans_path(target).read_text())
    # the rest comes from the model's origin, the chunks already fetched are kept
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / entry.file).write_bytes(data)
    report = await fetch_shard(entry, target, [bad], origin=str(origin))
    assert target.read_bytes() == data
    assert report.reused >= 1 and report.by_source.get("origin", 0) >= 1


async def test_origin_over_http_with_ranges_and_a_bad_origin_is_an_integrity_error(
    aiohttp_server: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    served = tmp_path / "served"
    served.mkdir()
    (served / entry.file).write_bytes(data)
    app = web.Application()
    app.router.add_static("/model", served)  # aiohttp answers Range requests with 206
    base = await start(aiohttp_server, app)
    target = tmp_path / entry.file
    report = await fetch_shard(entry, target, [], origin=f"{base}/model")
    assert target.read_bytes() == data and report.by_source == {"origin": 6}
    (served / entry.file).write_bytes(_flip(data, 100))
    target.unlink()
    with pytest.raises(IntegrityError, match="origin"):
        await fetch_shard(entry, target, [], origin=f"{base}/model")


async def test_a_manifest_without_chunk_lists_cannot_be_fetched_from_peers(
    shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, _ = shard_file
    old = ShardEntry(**{**entry.__dict__, "chunk_size": 0, "chunks": ()})
    with pytest.raises(ConfigError, match="no chunk list"):
        await fetch_shard(old, tmp_path / "x", ["http://127.0.0.1:9"])


# -- the node side: GET /v1/shards/{k}/chunks/{i} ---------------------------------------------


def _model_dir(tmp_path: Path, data: bytes, entry: ShardEntry) -> Path:
    """A one-shard manifest whose client/config/tokenizer hashes are placeholders (the chunk
    server reads only the shard entry)."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / entry.file).write_bytes(data)
    fake = "sha256:" + "0" * 64
    manifest = Manifest.build(
        model_id="test",
        total_layers=2,
        hidden_size=8,
        dtype="float32",
        tokenizer_hash=fake,
        config_hash=fake,
        client_hash=fake,
        shards=(entry,),
    )
    (directory / "manifest.json").write_text(json.dumps(manifest.to_json()))
    return directory / "manifest.json"


async def _chunk_client(aiohttp_client: Any, manifest: Path, **limits: Any) -> Any:
    config = ServerConfig(manifest_path=manifest, shard_id=0, **limits)
    app = web.Application(middlewares=[error_middleware])
    install_chunks(app, config)
    return await aiohttp_client(app)


async def test_node_serves_its_chunks_checked_and_refuses_others(
    aiohttp_client: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    manifest = _model_dir(tmp_path, data, entry)
    client = await _chunk_client(aiohttp_client, manifest)
    answer = await client.get("/v1/shards/0/chunks/5")
    assert answer.status == 200
    assert await answer.read() == data[5 * CHUNK :]
    assert answer.headers["X-Planet-Chunk-Sha256"] == entry.chunks[5]
    described = await (await client.get("/v1/shards/0")).json()
    assert described["chunks"] == 6 and described["hash"] == entry.hash
    assert (await client.get("/v1/shards/1/chunks/0")).status == 404
    assert (await client.get("/v1/shards/0/chunks/6")).status == 404
    assert (await client.get("/v1/shards/0/chunks/-1")).status == 400
    # the file changed on disk: the node refuses rather than spreading a bad chunk
    path = manifest.parent / entry.file
    path.write_bytes(_flip(data, 10))
    refused = await client.get("/v1/shards/0/chunks/0")
    assert refused.status == 409
    assert (await refused.json())["code"] == "integrity"


async def test_node_rate_limits_one_caller(
    aiohttp_client: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    entry, data = shard_file
    manifest = _model_dir(tmp_path, data, entry)
    # 1 KiB/s: the burst (4 chunks) passes, then 429 with Retry-After
    client = await _chunk_client(aiohttp_client, manifest, chunk_bytes_per_s_per_peer=CHUNK)
    statuses = [(await client.get(f"/v1/shards/0/chunks/{i}")).status for i in range(5)]
    assert statuses[:4] == [200] * 4
    limited = await client.get("/v1/shards/0/chunks/4")
    assert limited.status == 429 and int(limited.headers["Retry-After"]) >= 1


async def test_hostile_chunk_routes_get_named_refusals_and_the_node_keeps_serving(
    aiohttp_client: Any, shard_file: tuple[ShardEntry, bytes], tmp_path: Path
) -> None:
    """Whatever a stranger puts in `/v1/shards/{shard}/chunks/{index}` and `/v1/shards/{shard}`
    (signs, spaces, non-ASCII digits, huge numbers, escapes, dots) gets a JSON refusal with a
    named code — 400 malformed, 404 not served — never a 500 or a chunk it did not ask for."""
    import random
    import urllib.parse

    entry, data = shard_file
    manifest = _model_dir(tmp_path, data, entry)
    client = await _chunk_client(aiohttp_client, manifest)
    rng = random.Random(2611)
    pieces = ["0", "5", "6", "-1", "+1", " 1", "1 ", "0x1", "1e3", "1.0", "٣", "５", "²", "",
              "9" * 9, "9" * 10, "0" * 12 + "1", "%00", "\x00", "..", "../0", "1/2", "\u202e1",
              "NaN", "inf", "true", "🙂", "a" * 300, "18446744073709551616"]  # fmt: skip
    answered: dict[int, int] = {}
    for case in range(300):
        shard, index = rng.choice(pieces), rng.choice(pieces)
        if rng.random() < 0.5:
            shard = shard or "0"
        path = "/v1/shards/" + urllib.parse.quote(shard, safe="")
        if case % 3:
            path += "/chunks/" + urllib.parse.quote(index, safe="")
        answer = await client.get(path)
        answered[answer.status] = answered.get(answer.status, 0) + 1
        assert answer.status in (200, 400, 404, 405), (path, answer.status)
        if answer.status == 200:
            body = await answer.read()
            if "/chunks/" in path:  # only a well-formed in-range index of shard 0
                number = int(index)
                assert shard.isascii() and shard.isdigit() and int(shard) == 0
                assert index.isascii() and index.isdigit() and number < len(entry.chunks)
                offset, length = entry.chunk_span(number)
                assert body == data[offset : offset + length]
            continue
        if answer.content_type == "application/json":
            assert isinstance((await answer.json())["code"], str), path
    assert answered.get(400, 0) and answered.get(404, 0), answered
    good = await client.get("/v1/shards/0/chunks/1")
    assert good.status == 200 and await good.read() == data[CHUNK : 2 * CHUNK]
