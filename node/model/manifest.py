"""The model manifest (UNFED seed): what a prepared model directory holds and how to check it.

A manifest names the model, its layer count, the client file (embeddings, final norm, LM head)
and one entry per shard (layer range, file, quant, size, hash). Every hash is re-derivable:

- shard / client hash: `sha256:` of the file's bytes (`protocol.canonical.hash_file`).
- shard chunk list (`chunk_size`, `chunks`): the shard file cut into `chunk_size`-byte pieces
  (the last one shorter), `sha256:` of each, in order (`chunk_hashes`). Nodes serve their shard
  by chunks and a joining node fetches it from several of them, checking each chunk as it
  arrives (node/model/fetch.py); the list is inside the manifest, so `model_hash` — registered
  on chain — commits to it. Manifests prepared before chunk lists existed have neither field
  (and keep their model hash); they can only be fetched from the model's origin.
- config hash: `hash_json` of `config.json` parsed, after `hashable_json` (floats -> strings).
- tokenizer hash: `hash_json` of `{file name: content}` over every file in `tokenizer/`, where a
  `.json` file's content is its parsed JSON (after `hashable_json`) and any other file's content
  is its UTF-8 text.
- model hash: `hash_json` of the manifest's own JSON without the `model_hash` key.

Canonical JSON forbids floats, and model configs carry some (`rms_norm_eps`, `rope_theta`):
`hashable_json` writes each float as the string of Python's shortest round-trip `repr`
(`1e-05`, `100000.0`), so the digest never depends on how a file was indented or ordered.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from protocol.canonical import HASH_PREFIX, hash_file, hash_json, sha256_hex
from protocol.errors import ConfigError, IntegrityError

MANIFEST_NAME = "manifest.json"
CLIENT_FILE = "client.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
QUANTS: tuple[str, ...] = ("none", "int8", "int4")
CHUNK_SIZE = 1 << 20  # bytes per shard chunk in new manifests (1 MiB)
MAX_CHUNK_SIZE = 64 << 20
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ShardIntegrityError(IntegrityError):
    """A file's bytes do not hash to what the manifest says; names both hashes."""

    def __init__(self, path: Path, expected: str, actual: str) -> None:
        super().__init__(
            f"{path}: hash {actual} does not match the manifest's {expected}",
            hint="the file is corrupt or was replaced; run `planet model prepare` again "
            "or fetch the shard from another peer",
        )
        self.path = path
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class ShardEntry:
    """One shard: decoder layers [start, end) of the model, stored in `file`."""

    shard_id: int
    layers: tuple[int, int]
    hash: str
    size: int  # bytes of the file
    quant: str  # "none" | "int8" | "int4"
    file: str  # file name relative to the manifest's directory
    chunk_size: int = 0  # bytes per chunk of `chunks` (0: no chunk list, an older manifest)
    chunks: tuple[str, ...] = ()  # sha256 of each chunk_size piece of the file, in order

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of chunk `index` in the file."""
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, self.size - offset)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["layers"] = list(self.layers)
        if self.chunks:
            body["chunks"] = list(self.chunks)
        else:  # an older manifest: its JSON (and model hash) stay as they were
            del body["chunk_size"], body["chunks"]
        return body


@dataclass(frozen=True)
class Manifest:
    """A prepared model: see the module docstring for how each hash is derived."""

    model_id: str
    model_hash: str
    total_layers: int
    hidden_size: int
    dtype: str  # dtype of the activations exchanged between shards ("float32")
    tokenizer_hash: str
    config_hash: str
    client_hash: str
    shards: tuple[ShardEntry, ...]

    # ---- JSON ----------------------------------------------------------------------------
    def body_without_hash(self) -> dict[str, Any]:
        """The manifest's JSON without `model_hash` (what `model_hash` is the hash of)."""
        return {
            "model_id": self.model_id,
            "total_layers": self.total_layers,
            "hidden_size": self.hidden_size,
            "dtype": self.dtype,
            "tokenizer_hash": self.tokenizer_hash,
            "config_hash": self.config_hash,
            "client_hash": self.client_hash,
            "shards": [shard.to_json() for shard in self.shards],
        }

    def to_json(self) -> dict[str, Any]:
        return {"model_hash": self.model_hash, **self.body_without_hash()}

    @classmethod
    def build(
        cls,
        *,
        model_id: str,
        total_layers: int,
        hidden_size: int,
        dtype: str,
        tokenizer_hash: str,
        config_hash: str,
        client_hash: str,
        shards: tuple[ShardEntry, ...],
    ) -> Manifest:
        """A validated manifest with `model_hash` computed from the other fields."""
        draft = cls(
            model_id=model_id,
            model_hash="",
            total_layers=total_layers,
            hidden_size=hidden_size,
            dtype=dtype,
            tokenizer_hash=tokenizer_hash,
            config_hash=config_hash,
            client_hash=client_hash,
            shards=shards,
        )
        manifest = cls(**{**draft.__dict__, "model_hash": hash_json(draft.body_without_hash())})
        manifest.validate()
        return manifest

    @classmethod
    def from_json(cls, body: Any, *, source: str = "manifest") -> Manifest:
        """Parse and validate; `ConfigError` for a malformed manifest, `IntegrityError` when
        `model_hash` does not match the rest."""
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        expected = {
            "model_id", "model_hash", "total_layers", "hidden_size", "dtype",
            "tokenizer_hash", "config_hash", "client_hash", "shards",
        }  # fmt: skip
        missing = sorted(expected - body.keys())
        if missing:
            raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}")
        unknown = sorted(body.keys() - expected)
        if unknown:
            raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)}")
        if not isinstance(body["shards"], list):
            raise ConfigError(f"{source}: shards must be a list")
        shards = tuple(
            _shard_from_json(item, f"{source}: shards[{i}]")
            for i, item in enumerate(body["shards"])
        )
        manifest = cls(
            model_id=_typed(body, "model_id", str, source),
            model_hash=_typed(body, "model_hash", str, source),
            total_layers=_typed(body, "total_layers", int, source),
            hidden_size=_typed(body, "hidden_size", int, source),
            dtype=_typed(body, "dtype", str, source),
            tokenizer_hash=_typed(body, "tokenizer_hash", str, source),
            config_hash=_typed(body, "config_hash", str, source),
            client_hash=_typed(body, "client_hash", str, source),
            shards=shards,
        )
        manifest.validate(source)
        derived = hash_json(manifest.body_without_hash())
        if derived != manifest.model_hash:
            raise IntegrityError(
                f"{source}: model_hash {manifest.model_hash} does not match the manifest's "
                f"contents ({derived})",
                hint="the manifest was edited; prepare the model again",
            )
        return manifest

    def validate(self, source: str = "manifest") -> None:
        """Structural checks: hashes well formed, shards contiguous and covering all layers."""
        if not self.model_id:
            raise ConfigError(f"{source}: model_id is empty")
        if self.total_layers <= 0 or self.hidden_size <= 0:
            raise ConfigError(f"{source}: total_layers and hidden_size must be positive")
        for name in ("tokenizer_hash", "config_hash", "client_hash"):
            _check_hash(getattr(self, name), f"{source}: {name}")
        if self.model_hash:
            _check_hash(self.model_hash, f"{source}: model_hash")
        if not self.shards:
            raise ConfigError(f"{source}: no shards")
        position = 0
        for index, shard in enumerate(self.shards):
            where = f"{source}: shard {index}"
            if shard.shard_id != index:
                raise ConfigError(f"{where}: shard_id is {shard.shard_id}, expected {index}")
            start, end = shard.layers
            if start != position or end <= start:
                raise ConfigError(
                    f"{where}: layers [{start}, {end}) do not continue from layer {position}"
                )
            position = end
            if shard.quant not in QUANTS:
                raise ConfigError(f"{where}: unknown quant {shard.quant!r}")
            if shard.size < 0:
                raise ConfigError(f"{where}: negative size")
            if not _FILE_RE.fullmatch(shard.file):
                raise ConfigError(f"{where}: file name {shard.file!r} is not a plain file name")
            _check_hash(shard.hash, f"{where}: hash")
            if shard.chunks or shard.chunk_size:
                if not 0 < shard.chunk_size <= MAX_CHUNK_SIZE:
                    raise ConfigError(f"{where}: chunk_size must be 1..{MAX_CHUNK_SIZE}")
                expected = -(-shard.size // shard.chunk_size)
                if len(shard.chunks) != expected:
                    raise ConfigError(
                        f"{where}: {len(shard.chunks)} chunk hashes for {shard.size} bytes in "
                        f"chunks of {shard.chunk_size} (expected {expected})"
                    )
                for number, chunk in enumerate(shard.chunks):
                    _check_hash(chunk, f"{where}: chunks[{number}]")
        if position != self.total_layers:
            raise ConfigError(
                f"{source}: shards cover layers [0, {position}) but the model has "
                f"{self.total_layers}"
            )

    # ---- files ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read `path` (a manifest file or the directory holding `manifest.json`)."""
        path = manifest_path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as error:
            raise ConfigError(
                f"no manifest at {path}",
                hint="run `planet model prepare` first, or pass the manifest's path",
            ) from error
        except OSError as error:
            raise ConfigError(f"cannot read manifest {path}: {error}") from error
        try:
            body = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{path}: not valid JSON ({error.msg} at line {error.lineno})"
            ) from error
        return cls.from_json(body, source=str(path))

    def save(self, path: str | Path) -> Path:
        """Write the manifest as indented JSON (hashes never depend on the indentation)."""
        path = manifest_path(path)
        path.write_text(
            json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        return path

    def shard(self, shard_id: int) -> ShardEntry:
        if not 0 <= shard_id < len(self.shards):
            raise ConfigError(
                f"shard {shard_id} does not exist (the manifest has {len(self.shards)})"
            )
        return self.shards[shard_id]


def manifest_path(path: str | Path) -> Path:
    """`path` itself, or `path/manifest.json` when `path` is a directory."""
    path = Path(path).expanduser()
    return path / MANIFEST_NAME if path.is_dir() else path


def verify_file(path: Path, expected: str) -> None:
    """Raise `ShardIntegrityError` (naming both hashes) unless `path` hashes to `expected`."""
    if not path.is_file():
        raise IntegrityError(f"{path} is missing", hint="prepare the model again")
    actual = hash_file(path)
    if actual != expected:
        raise ShardIntegrityError(path, expected, actual)


def chunk_hashes(path: Path, chunk_size: int) -> tuple[str, ...]:
    """sha256 of each `chunk_size` piece of the file at `path`, in order."""
    hashes = []
    with path.open("rb") as handle:
        while piece := handle.read(chunk_size):
            hashes.append(sha256_hex(piece))
    return tuple(hashes)


def with_chunk_lists(manifest: Manifest, directory: Path, chunk_size: int = CHUNK_SIZE) -> Manifest:
    """`manifest` with every shard's chunk list derived from its file in `directory` (a new
    model hash; the files are unchanged). For a model prepared before chunk lists existed."""
    shards = tuple(
        ShardEntry(
            **{
                **shard.__dict__,
                "chunk_size": chunk_size,
                "chunks": chunk_hashes(directory / shard.file, chunk_size),
            }
        )
        for shard in manifest.shards
    )
    body = {k: v for k, v in manifest.__dict__.items() if k not in ("model_hash", "shards")}
    return Manifest.build(**body, shards=shards)


def verify_chunks(path: Path, entry: ShardEntry) -> None:
    """Raise `IntegrityError` naming the first chunk of `path` that is not what `entry` lists."""
    if not entry.chunks:
        return
    for index, actual in enumerate(chunk_hashes(path, entry.chunk_size)):
        if index >= len(entry.chunks) or actual != entry.chunks[index]:
            raise IntegrityError(
                f"{path}: chunk {index} does not match the manifest's chunk list",
                hint="the file is corrupt or was replaced; fetch the shard again",
            )


def verify_directory(manifest: Manifest, directory: Path) -> None:
    """Re-derive every hash of a prepared directory; raise `IntegrityError` on any mismatch."""
    verify_file(directory / CLIENT_FILE, manifest.client_hash)
    for shard in manifest.shards:
        verify_file(directory / shard.file, shard.hash)
        verify_chunks(directory / shard.file, shard)
    config = config_hash(directory / CONFIG_FILE)
    if config != manifest.config_hash:
        raise IntegrityError(
            f"{directory / CONFIG_FILE}: hash {config} does not match the manifest's "
            f"{manifest.config_hash}"
        )
    tokenizer = tokenizer_hash(directory / TOKENIZER_DIR)
    if tokenizer != manifest.tokenizer_hash:
        raise IntegrityError(
            f"{directory / TOKENIZER_DIR}: hash {tokenizer} does not match the manifest's "
            f"{manifest.tokenizer_hash}"
        )


def hashable_json(value: Any) -> Any:
    """`value` with every float replaced by its shortest round-trip `repr` string."""
    if isinstance(value, float):
        return repr(value)  # 'nan' / 'inf' included: JSON files from Python may carry them
    if isinstance(value, dict):
        return {key: hashable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [hashable_json(item) for item in value]
    return value


def config_hash(path: Path) -> str:
    """Canonical hash of a `config.json` (see the module docstring)."""
    return hash_json(hashable_json(_read_json(path)))


def tokenizer_hash(directory: Path) -> str:
    """Canonical hash of a tokenizer directory (see the module docstring)."""
    if not directory.is_dir():
        raise ConfigError(f"no tokenizer directory at {directory}")
    contents: dict[str, Any] = {}
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".json":
            contents[path.name] = hashable_json(_read_json(path))
        else:
            contents[path.name] = path.read_text(encoding="utf-8")
    if not contents:
        raise ConfigError(f"tokenizer directory {directory} is empty")
    return hash_json(contents)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ConfigError(f"missing {path}") from error
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error.msg})") from error


def _typed(body: dict[str, Any], key: str, kind: type, source: str) -> Any:
    value = body[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: {key} must be a {kind.__name__}")
    return value


def _check_hash(value: str, where: str) -> None:
    if not _HASH_RE.fullmatch(value):
        raise ConfigError(f"{where}: {value!r} is not a {HASH_PREFIX}<64 hex> hash")


def _shard_from_json(item: Any, source: str) -> ShardEntry:
    if not isinstance(item, dict):
        raise ConfigError(f"{source}: expected an object")
    fields = {"shard_id", "layers", "hash", "size", "quant", "file"}
    chunked = fields | {"chunk_size", "chunks"}
    if set(item) not in (fields, chunked):
        raise ConfigError(
            f"{source}: fields must be exactly {', '.join(sorted(fields))} "
            "(and chunk_size, chunks together)"
        )
    chunks = item.get("chunks", [])
    if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
        raise ConfigError(f"{source}: chunks must be a list of hashes")
    layers = item["layers"]
    if (
        not isinstance(layers, list)
        or len(layers) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in layers)
    ):
        raise ConfigError(f"{source}: layers must be [start, end] integers")
    return ShardEntry(
        shard_id=_typed(item, "shard_id", int, source),
        layers=(layers[0], layers[1]),
        hash=_typed(item, "hash", str, source),
        size=_typed(item, "size", int, source),
        quant=_typed(item, "quant", str, source),
        file=_typed(item, "file", str, source),
        chunk_size=_typed(item, "chunk_size", int, source) if "chunk_size" in item else 0,
        chunks=tuple(chunks),
    )
