"""Byte-reproducible safetensors files.

A shard's hash is the hash of its file's bytes, so preparing the same model twice (on any
machine) must write the same bytes. safetensors lays the tensor data out deterministically
(by dtype alignment, then name) but serialises its JSON header from a hash map, so the header's
key order, and with it the file hash, changes from run to run. `save_safetensors` rewrites the
header with sorted keys (same length, same offsets: only the order of its members changes).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

_LENGTH_BYTES = 8


def canonical_safetensors_bytes(data: bytes) -> bytes:
    """`data` (a safetensors file) with its header's JSON keys sorted, padded as before."""
    length = int.from_bytes(data[:_LENGTH_BYTES], "little")
    header = json.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + length])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    if len(text) > length:  # cannot happen for a reordering of compact JSON; keep it loud
        raise ValueError(f"canonical safetensors header is longer ({len(text)} > {length})")
    text += b" " * (length - len(text))
    return data[:_LENGTH_BYTES] + text + data[_LENGTH_BYTES + length :]


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save` with a canonical header, written to `path`."""
    from safetensors.torch import save

    path.write_bytes(canonical_safetensors_bytes(save(tensors, metadata=metadata)))
