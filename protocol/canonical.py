"""Canonical bytes and hashes.

Anything that is hashed or signed is first turned into canonical bytes here, so any
implementation can re-derive the same digest:

- JSON: UTF-8, keys sorted, no insignificant whitespace, no floats (integers, strings, bools,
  null, lists, objects only), non-ASCII kept as UTF-8 (not escaped).
- Hashes are SHA-256 written as lowercase hex prefixed with "sha256:".

Untrusted JSON is read only through `parse_json`: a size limit before parsing, a nesting-depth
limit checked on the raw bytes before the recursive parser runs (deep nesting would otherwise
raise RecursionError), integers bounded in digits, and no floats, NaN/Infinity, duplicate keys,
invalid UTF-8 or lone surrogates. Every failure is one typed `JsonInputError`.
"""

from __future__ import annotations

import hashlib
import json
import re
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


class JsonInputError(ProtocolError):
    """Untrusted bytes are not JSON within our limits; the message says which rule failed."""

    code = "bad_json"


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes, limit: int | None = None) -> int:
    """Deepest nesting of `[`/`{` in `raw`, ignoring brackets inside strings (linear, no
    recursion); stops counting once `limit` is exceeded. For malformed JSON the value is an
    upper bound that the parser then refutes."""
    if limit is not None and len(raw.translate(None, _NOT_BRACKET)) <= limit:
        return limit  # at most `limit` brackets at all: an upper bound, nothing to walk
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = deepest = 0
    for byte in brackets:
        depth += _DEPTH_STEP[byte]
        if depth > deepest:
            deepest = depth
            if limit is not None and deepest > limit:
                break
    return deepest


def _no_float(text: str) -> Any:
    raise JsonInputError(f"floats are not allowed (found {text[:40]})")


def _no_constant(text: str) -> Any:
    raise JsonInputError(f"{text} is not allowed")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise JsonInputError("duplicate object key")
    return out


def _check_strings(value: Any) -> None:
    """Lone surrogates (from \\ud800 escapes) cannot be encoded as UTF-8: refuse them."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    raise JsonInputError("string with a lone surrogate") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_json(raw: bytes, *, max_bytes: int, max_depth: int, max_int_digits: int = 80) -> Any:
    """Parse untrusted JSON bytes strictly (see the module docstring); raises JsonInputError."""
    if not isinstance(raw, bytes | bytearray):
        raise JsonInputError("expected bytes")
    if len(raw) > max_bytes:
        raise JsonInputError(f"{len(raw)} bytes, over the {max_bytes}-byte limit")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise JsonInputError("not UTF-8") from None
    if json_depth(bytes(raw), max_depth) > max_depth:
        raise JsonInputError(f"nested more than {max_depth} deep")

    def bounded_int(digits: str) -> int:
        if len(digits.lstrip("-")) > max_int_digits:
            raise JsonInputError(f"integer of {len(digits)} digits, over {max_int_digits}")
        return int(digits)

    try:
        value = json.loads(
            text,
            parse_float=_no_float,
            parse_int=bounded_int,
            parse_constant=_no_constant,
            object_pairs_hook=_object,
        )
    except json.JSONDecodeError as error:
        raise JsonInputError(f"invalid JSON ({error.msg} at {error.pos})") from None
    except RecursionError:  # unreachable after the depth check; kept as a named rejection
        raise JsonInputError("nested too deep") from None
    _check_strings(value)
    return value


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
