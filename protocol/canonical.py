"""Canonical bytes and hashes.

Anything that is hashed or signed is first turned into canonical bytes here, so any
implementation can re-derive the same digest:

- JSON: UTF-8, keys sorted, no insignificant whitespace, no floats (integers, strings, bools,
  null, lists, objects only), non-ASCII kept as UTF-8 (not escaped).
- Hashes are SHA-256 written as lowercase hex prefixed with "sha256:".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from protocol.errors import ProtocolError

HASH_PREFIX = "sha256:"
_CHUNK = 1 << 20
# One encoder: json.dumps with non-default options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _reject_floats(value: Any, path: str = "$") -> None:
    if isinstance(value, float):
        raise ProtocolError(f"canonical JSON forbids floats (found {value!r} at {path})")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(
                    f"canonical JSON keys must be strings (found {key!r} at {path})"
                )
            _reject_floats(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _reject_floats(item, f"{path}[{index}]")


def canonical_json(value: Any) -> bytes:
    """Canonical UTF-8 JSON bytes of `value` (sorted keys, compact, no floats)."""
    _reject_floats(value)
    return _ENCODER.encode(value).encode()


def canonical_text(value: Any) -> str:
    """The canonical JSON text of a value whose types are already known (built or validated by
    our own code, with no floats): the hot-path form of `canonical_json`, without its walk."""
    return _ENCODER.encode(value)


def sha256_hex(data: bytes) -> str:
    """`sha256:<hex>` of raw bytes."""
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


def hash_json(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON of `value`."""
    return sha256_hex(canonical_json(value))


def hash_chunks(chunks: Iterable[bytes]) -> str:
    """`sha256:<hex>` of the concatenation of `chunks` (streamed)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return HASH_PREFIX + digest.hexdigest()


def hash_file(path: str | Path) -> str:
    """`sha256:<hex>` of a file's bytes, read in 1 MiB chunks."""

    def chunks() -> Iterable[bytes]:
        with open(path, "rb") as handle:
            while block := handle.read(_CHUNK):
                yield block

    return hash_chunks(chunks())
