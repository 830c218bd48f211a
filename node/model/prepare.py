"""`prepare`: split a model into K contiguous layer shards, quantize them, write a manifest.

Output directory (see docs/compute.md):

    manifest.json  client.safetensors  config.json  tokenizer/  shard-<k>.safetensors

Everything is written into a staging directory next to the target and renamed into place at the
end, so an interrupted run never leaves a half-written model that looks complete. A target that
already holds a valid output for the same model, split and quant (every hash re-derived) is
reused as is.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from node.model.family import load_config
from node.model.files import save_safetensors
from node.model.head import client_tensors
from node.model.manifest import (
    CHUNK_SIZE,
    CLIENT_FILE,
    CONFIG_FILE,
    MANIFEST_NAME,
    TOKENIZER_DIR,
    Manifest,
    ShardEntry,
    chunk_hashes,
    config_hash,
    tokenizer_hash,
    verify_directory,
)
from node.model.quant import check_quant, quantized_tensors
from node.model.shard import ACTIVATION_DTYPE, ShardModel
from node.model.shard_config import ShardConfig
from node.model.source import (
    DEFAULT_MODEL,
    ModelSource,
    Progress,
    default_layer_count,
    default_out_dir,
    replace_dir,
    resolve_source,
    staging_dir,
    stderr_progress,
)
from protocol.canonical import hash_file
from protocol.errors import PlanetError, UsageError

log = logging.getLogger(__name__)

# Files a Hugging Face tokenizer may consist of; those present are copied into tokenizer/.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def split_layers(
    total: int, parts: int, split: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """K contiguous ranges [start, end) covering [0, total): even (the first `total % parts`
    shards one layer longer), or the explicit sizes in `split`."""
    if parts < 1:
        raise UsageError(f"--parts must be at least 1, got {parts}")
    if split is not None:
        sizes = list(split)
        if len(sizes) != parts:
            raise UsageError(f"--split has {len(sizes)} sizes but --parts is {parts}")
        if any(size < 1 for size in sizes):
            raise UsageError(f"--split sizes must be positive, got {','.join(map(str, sizes))}")
        if sum(sizes) != total:
            raise UsageError(
                f"--split sums to {sum(sizes)} but the model has {total} layers",
                hint=f"make the sizes add up to {total}",
            )
    else:
        if parts > total:
            raise UsageError(
                f"--parts {parts} is more than the model's {total} layers",
                hint=f"use at most {total} parts",
            )
        base, extra = divmod(total, parts)
        sizes = [base + (1 if k < extra else 0) for k in range(parts)]
    ranges: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


def prepare(
    model: str | Path = DEFAULT_MODEL,
    parts: int = 3,
    quant: str = "none",
    out: str | Path | None = None,
    split: Sequence[int] | None = None,
    progress: Progress = stderr_progress,
    *,
    force: bool = False,
) -> Path:
    """Prepare `model` ("default" or a local HF directory) as `parts` shards; returns the
    manifest's path. Reuses a valid existing output unless `force`."""
    check_quant(quant)
    if parts < 1:
        raise UsageError(f"--parts must be at least 1, got {parts}")
    if str(model) == DEFAULT_MODEL and (layers := default_layer_count()) is not None:
        split_layers(layers, parts, split)  # a bad --parts/--split: refused before converting
    source = resolve_source(model, progress)
    ranges = split_layers(_layer_count(source.directory), parts, split)
    target = (
        Path(out).expanduser()
        if out is not None
        else default_out_dir(source.model_id, parts, quant, split)
    )
    if not force and (existing := _reusable(target, source.model_id, ranges, quant)):
        progress(f"reusing {existing} (hashes verified)")
        return existing
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST_NAME).is_file():
        raise UsageError(
            f"--out {target} is a non-empty directory without a manifest",
            hint="choose an empty or new directory",
        )
    config = load_config(source.directory)
    started = time.monotonic()
    with staging_dir(target) as staging:
        _write(staging, source, config, ranges, quant, progress)
        replace_dir(staging, target)
    progress(f"prepared {len(ranges)} shard(s) in {time.monotonic() - started:.1f} s -> {target}")
    return target / MANIFEST_NAME


def _layer_count(directory: Path) -> int:
    """The model's decoder layer count, read from config.json as the fast shard path reads it
    (`ShardConfig`), without transformers' `AutoConfig`: its config classes import transformers'
    activations and `torch._dynamo` (~2.3 CPU-s), which a reused output never needs. A config
    `ShardConfig` does not model goes through `load_config`."""
    parsed = ShardConfig.load(directory)
    if parsed is None:
        return int(load_config(directory).num_hidden_layers)
    return parsed.num_hidden_layers


def _reusable(
    target: Path, model_id: str, ranges: list[tuple[int, int]], quant: str
) -> Path | None:
    path = target / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = Manifest.load(path)
        same = (
            manifest.model_id == model_id
            and [s.layers for s in manifest.shards] == ranges
            and all(s.quant == quant for s in manifest.shards)
        )
        if not same:
            return None
        verify_directory(manifest, target)
    except PlanetError as error:
        log.warning("not reusing %s: %s", target, error.message)
        return None
    return path


def _load_full_state(source: ModelSource) -> tuple[dict[str, torch.Tensor], bool]:
    """The full model's fp32 state dict (keys normalised by transformers) and whether the
    LM head is tied to the embeddings."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source.directory), dtype=torch.float32)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {key: value.detach() for key, value in model.state_dict().items()}
    return state, tied


def _write(
    staging: Path,
    source: ModelSource,
    config: Any,
    ranges: list[tuple[int, int]],
    quant: str,
    progress: Progress,
) -> None:
    progress(f"loading {source.model_id} from {source.directory} ...")
    state, tied = _load_full_state(source)
    shutil.copyfile(source.directory / CONFIG_FILE, staging / CONFIG_FILE)
    _copy_tokenizer(source.directory, staging / TOKENIZER_DIR)
    save_safetensors(client_tensors(state, tied), staging / CLIENT_FILE, {"format": "pt"})
    shards: list[ShardEntry] = []
    for shard_id, layers in enumerate(ranges):
        progress(f"shard {shard_id}: layers [{layers[0]}, {layers[1]}) quant={quant} ...")
        shard = ShardModel.from_state_dict(config, layers, state, device="cpu", quant=quant)
        tensors, metadata = quantized_tensors(shard.module, quant)
        name = f"shard-{shard_id}.safetensors"
        save_safetensors(tensors, staging / name, {"format": "pt", **metadata})
        path = staging / name
        shards.append(
            ShardEntry(
                shard_id=shard_id,
                layers=layers,
                hash=hash_file(path),
                size=path.stat().st_size,
                quant=quant,
                file=name,
                chunk_size=CHUNK_SIZE,
                chunks=chunk_hashes(path, CHUNK_SIZE),
            )
        )
        del shard, tensors
    manifest = Manifest.build(
        model_id=source.model_id,
        total_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        dtype=_dtype_name(ACTIVATION_DTYPE),
        tokenizer_hash=tokenizer_hash(staging / TOKENIZER_DIR),
        config_hash=config_hash(staging / CONFIG_FILE),
        client_hash=hash_file(staging / CLIENT_FILE),
        shards=tuple(shards),
    )
    manifest.save(staging / MANIFEST_NAME)


def _copy_tokenizer(source: Path, target: Path) -> None:
    """Copy the tokenizer's own files verbatim (no re-serialisation, so nothing drifts)."""
    target.mkdir()
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if (
        "tokenizer.json" not in copied
        and "tokenizer.model" not in copied
        and ("vocab.json" not in copied)
    ):
        raise UsageError(
            f"{source} has no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)"
        )
    for name in copied:
        shutil.copyfile(source / name, target / name)


def _dtype_name(dtype: torch.dtype) -> str:
    return re.sub(r"^torch\.", "", str(dtype))


def parse_split(text: str | None) -> list[int] | None:
    """`"10,12,8"` -> [10, 12, 8]; None stays None."""
    if text is None or text == "":
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError as error:
        raise UsageError(f"--split must be comma-separated integers, got {text!r}") from error
