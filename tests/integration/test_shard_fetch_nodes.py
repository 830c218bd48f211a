"""`planet model fetch` from real node processes (node/model/fetch.py against
node/server/shards.py): SmolLM2 int8 in 2 shards with chunk lists (1 MiB chunks), three nodes
serving shard 0 — two honest, one corrupting every chunk it sends (tests/doubles/bad_chunk_node.py).
A new home with only the manifest fetches shard 0 from all three: the corrupting peer is banned,
the file is whole, the honest peers shared the download (one of them over TLS bound to its node
key, an https `--peer` with no key known: every chunk is checked against the manifest instead),
progress was on screen."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.gateway_net import ephemeral_port, http_json, prepared_manifest
from harness.replica_net import chunked_model
from node.keys import PASSWORD_ENV, create_node_key
from node.model.manifest import Manifest
from node.procs import run_captured
from node.server.launcher import NODE_MARKER, start_node, stop_pid, wait_healthy
from protocol.canonical import hash_file

pytestmark = [pytest.mark.integration]

BAD_MODULE = "tests.doubles.bad_chunk_node"


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str], str]]:
    """(chunked manifest, honest peer URLs, corrupting peer URL)."""
    root = tmp_path_factory.mktemp("fetch")
    manifest = chunked_model(prepared_manifest(parts=2, quant="int8"), root / "model")
    processes = []
    key = root / "node_key.json"
    create_node_key(key, "fetch-test")
    try:
        for index, module in enumerate((NODE_MARKER, NODE_MARKER, BAD_MODULE)):
            # the second honest node serves TLS bound to its node key, as every network node
            tls = {"node_key": key, "extra_env": {PASSWORD_ENV: "fetch-test"}} if index == 1 else {}
            processes.append(
                start_node(
                    manifest=manifest,
                    shard=0,
                    port=ephemeral_port(),
                    run_dir=root / f"node-{index}",
                    extra_args=("--threads", "1"),
                    module=module,
                    **tls,  # type: ignore[arg-type]
                )
            )
        wait_healthy(processes, timeout_s=240)
        urls = [p.url for p in processes]
        yield manifest, urls[:2], urls[2]
    finally:
        for process in processes:
            stop_pid(process.pid, grace_s=3, module=process.module)


def test_fetch_from_three_nodes_bans_the_corrupting_one_and_completes(
    serving: tuple[Path, list[str], str], tmp_path: Path
) -> None:
    manifest_path, honest, bad = serving
    entry = Manifest.load(manifest_path).shard(0)
    assert http_json(f"{honest[0]}/v1/shards/0")["chunks"] == len(entry.chunks) > 8
    home = tmp_path / "joining"
    manifest = home / "manifest.json"
    home.mkdir()
    manifest.write_bytes(manifest_path.read_bytes())
    peers = [arg for url in (bad, *honest) for arg in ("--peer", url)]
    command = [sys.executable, "-m", "planet", "model", "fetch", "--model", str(home)]
    command += ["--shard", "0", "--json", *peers]
    done = run_captured(command, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert hash_file(home / entry.file) == entry.hash
    assert list(report["banned"]) == [bad]
    assert bad not in report["by_source"]
    assert all(report["by_source"].get(url, 0) > 0 for url in honest)  # in parallel
    assert sum(report["by_source"].values()) == len(entry.chunks)
    assert f"{len(entry.chunks)}/{len(entry.chunks)} chunks" in done.stderr  # progress
    assert f"banned {bad}" in done.stderr
    # run again: the file is there and whole, nothing is fetched
    again = run_captured(command, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout)["already_there"] is True
