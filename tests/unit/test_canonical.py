"""Canonical JSON and hashing: the bytes every signer and verifier must agree on."""

from __future__ import annotations

import hashlib

import pytest

from protocol.canonical import canonical_json, hash_chunks, hash_file, hash_json, sha256_hex
from protocol.errors import ProtocolError

pytestmark = pytest.mark.unit


def test_canonical_json_key_order_does_not_matter() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})


def test_canonical_json_is_compact_sorted_utf8() -> None:
    assert canonical_json({"z": "é", "a": {"y": None, "x": True}}) == (
        '{"a":{"x":true,"y":null},"z":"é"}'.encode()
    )


@pytest.mark.parametrize("value", [1.5, {"a": 0.0}, [1, [2.5]], {"deep": {"er": [0.1]}}])
def test_canonical_json_float_anywhere_is_rejected(value: object) -> None:
    with pytest.raises(ProtocolError, match="floats"):
        canonical_json(value)


def test_canonical_json_non_string_key_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="keys must be strings"):
        canonical_json({1: "a"})


def test_hash_json_matches_sha256_of_canonical_bytes() -> None:
    value = {"model": "m", "layers": [0, 10]}
    expected = "sha256:" + hashlib.sha256(b'{"layers":[0,10],"model":"m"}').hexdigest()
    assert hash_json(value) == expected


def test_hash_file_equals_hash_of_bytes_and_of_chunks(tmp_path) -> None:
    data = bytes(range(256)) * 9000  # > 1 MiB: crosses a read-chunk boundary
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert hash_file(path) == sha256_hex(data) == hash_chunks([data[:5], data[5:]])
