"""node/model/gguf_header.py: one metadata scalar from a GGUF header, without reading the rest
of the file; a file that is not a GGUF, or whose header is cut short or malformed, is refused
by name."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from node.model.gguf_header import GgufHeaderError, metadata_scalar


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pair(key: str, kind: int, value: bytes) -> bytes:
    return _string(key) + struct.pack("<I", kind) + value


def _gguf(*pairs: bytes, version: int = 3, tail: bytes = b"\0" * 64) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(pairs)) + b"".join(pairs) + tail


PAIRS = (
    _pair("general.architecture", 8, _string("llama")),
    # arrays before the wanted key are skipped by their declared sizes
    _pair("general.languages", 9, struct.pack("<IQ", 8, 2) + _string("en") + _string("fr")),
    _pair("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3)),
    _pair("general.flag", 7, b"\x01"),
    _pair("llama.rope.freq_base", 6, struct.pack("<f", 100000.0)),
    _pair("llama.block_count", 4, struct.pack("<I", 30)),
    _pair("general.big", 10, struct.pack("<Q", 2**40)),
)


def test_metadata_scalar_reads_each_kind_past_strings_and_arrays(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(_gguf(*PAIRS))
    assert metadata_scalar(path, "llama.block_count") == 30
    assert metadata_scalar(path, "general.architecture") == "llama"
    assert metadata_scalar(path, "llama.rope.freq_base") == 100000.0
    assert metadata_scalar(path, "general.flag") is True
    assert metadata_scalar(path, "general.big") == 2**40
    assert metadata_scalar(path, "general.languages") is None  # an array: no scalar
    assert metadata_scalar(path, "llama.context_length") is None  # not there


def test_metadata_scalar_stops_at_its_key_without_reading_what_follows(tmp_path: Path) -> None:
    """What follows the wanted pair (the tokenizer's arrays, the tensors) is never read: a
    file cut right after it still answers."""
    path = tmp_path / "m.gguf"
    whole = _gguf(*PAIRS, tail=b"")
    path.write_bytes(whole[: whole.index(b"llama.block_count") + len("llama.block_count") + 8])
    assert metadata_scalar(path, "llama.block_count") == 30


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "no GGUF magic"),
        (b"GGML" + bytes(60), "no GGUF magic"),
        (_gguf(*PAIRS, version=1), "version 1"),
        (_gguf(*PAIRS, tail=b"")[:30], "it ends inside its metadata"),
        # a key that claims more bytes than the file has
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**16 - 1), "it ends inside its metadata"),
        (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40), "a key of"),
        (_gguf(_pair("x", 13, b"")), "unknown value type 13"),
        # an array of strings longer than the file could hold
        (_gguf(_pair("x", 9, struct.pack("<IQ", 8, 2**62))), "an array longer than the file"),
        (_gguf(_pair("x", 9, struct.pack("<IQ", 4, 2**62))), "it ends inside its metadata"),
        (_gguf(_pair("x", 9, struct.pack("<IQ", 9, 1) * 8)), "arrays nested too deep"),
        (_gguf(_pair("llama.block_count", 8, _string("x")[:8] + b"\xff")), "not UTF-8"),
    ],
)
def test_metadata_scalar_refuses_a_malformed_header_by_name(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GgufHeaderError, match=reason):
        metadata_scalar(path, "llama.block_count")
