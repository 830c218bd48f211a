"""One scalar of a GGUF file's metadata, read from its header's key/value section only.

`gguf.GGUFReader` maps the whole file and builds a view of every tensor and every token of the
vocabulary before it answers (seconds of CPU for the default 98 MB model, far more on a loaded
box); asking `planet model prepare` whether `--parts` fits the model's layers needs one integer
that sits a few hundred bytes into the file. `metadata_scalar` reads the header's key/value pairs
in order, skipping values by their declared sizes, and stops at the key it wants.

The layout (GGUF version 2 and 3, little-endian): magic `GGUF`, version u32, tensor count u64,
key/value count u64, then per pair a string key (u64 length + UTF-8), a value type u32 and the
value; a string is a u64 length and its bytes, an array an element type u32, a u64 count and the
elements. The file is untrusted: every length is bounded by what is left of the file, and any
other shape is refused with `GgufHeaderError`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from protocol.errors import ConfigError

MAGIC = b"GGUF"
VERSIONS = frozenset({2, 3})
MAX_KEY_BYTES = 65_535  # the GGUF spec's bound on a key's length
MAX_ARRAY_DEPTH = 4  # arrays of arrays: none in practice; bounded so a hostile file cannot recurse

# value type → struct format of a fixed-size scalar (GGUF's `gguf_type`)
_SCALARS: dict[int, str] = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<?",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_STRING, _ARRAY = 8, 9

Scalar = int | float | bool | str


class GgufHeaderError(ConfigError):
    """A file whose GGUF header cannot be read as one."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: not a readable GGUF header ({reason})")
        self.path = path
        self.reason = reason


class _Header:
    """Sequential reads from the start of a GGUF file, each bounded by the file's size."""

    def __init__(self, handle: BinaryIO, path: Path, size: int) -> None:
        self.handle = handle
        self.path = path
        self.size = size

    def fail(self, reason: str) -> GgufHeaderError:
        return GgufHeaderError(self.path, reason)

    def left(self) -> int:
        return self.size - self.handle.tell()

    def take(self, count: int) -> bytes:
        if count > self.left():
            raise self.fail("it ends inside its metadata")
        return self.handle.read(count)

    def skip(self, count: int) -> None:
        if count > self.left():
            raise self.fail("it ends inside its metadata")
        self.handle.seek(count, 1)

    def unpack(self, fmt: str) -> Scalar:
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return value

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> str:
        raw = self.take(self.u64())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.fail("a string that is not UTF-8") from error

    def value(self, kind: int) -> Scalar:
        if kind == _STRING:
            return self.string()
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise self.fail(f"value type {kind} is not a scalar")
        return self.unpack(fmt)

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if kind == _STRING:
            self.skip(self.u64())
        elif kind == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail("arrays nested too deep")
            element, count = self.u32(), self.u64()
            if element in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[element]))
            elif count > self.left() // 8:  # every string or array element takes ≥ 8 bytes
                raise self.fail("an array longer than the file")
            else:
                for _ in range(count):
                    self.skip_value(element, depth + 1)
        elif kind in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[kind]))
        else:
            raise self.fail(f"unknown value type {kind}")


def metadata_scalar(path: Path, key: str) -> Scalar | None:
    """The value of `key` in the GGUF file's metadata when it is a scalar or a string; None
    when the file has no such key, or an array under it. `GgufHeaderError` for a file that is
    not a GGUF of version 2 or 3, or whose header is cut short or malformed."""
    with open(path, "rb") as handle:
        header = _Header(handle, path, path.stat().st_size)
        if handle.read(len(MAGIC)) != MAGIC:
            raise header.fail("no GGUF magic")
        version = header.u32()
        if version not in VERSIONS:
            raise header.fail(f"version {version} (2 or 3 is read)")
        header.u64()  # tensor count: the tensors are not read
        wanted = key.encode("utf-8")
        for _ in range(header.u64()):
            length = header.u64()
            if length > MAX_KEY_BYTES:
                raise header.fail(f"a key of {length} bytes")
            name = header.take(length)
            kind = header.u32()
            if name == wanted:
                return None if kind == _ARRAY else header.value(kind)
            header.skip_value(kind)
    return None
