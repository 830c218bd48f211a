"""The nodes file: which prepared model and which nodes, in circuit order.

    {"manifest": "/abs/path/manifest.json",
     "nodes": [{"url": "https://10.0.0.7:18100", "shard": 0, "layers": [0, 10],
                "key": "<the node key, 64 hex>"}, ...]}

A node that serves a span of shards as one hop (`planet node serve --shards 1-2`) is listed once
with its first shard, `"last"` its last shard and the span's layers:
`{"url": …, "shard": 1, "last": 2, "layers": [10, 30]}`.

`key` is the node's ed25519 node key: an https:// node must prove it in its TLS handshake
(node/links.py), so it is required there; an http:// node (local mode, `planet local up`
writes `http://127.0.0.1:…`) needs none. An optional top-level `"committee_rpc": URL` names
the committee the nodes are registered on: `planet ask --credits` then pays each node the
price it registered there (`/nodes`), never its `/info` alone (node/client/chain_prices.py).

`planet local up` writes it to `$PLANET_HOME/local/nodes.json`; `planet ask` reads it from there
unless `--nodes FILE` says otherwise. The client needs the manifest for its own part of the model
(tokenizer, embeddings, final norm, LM head); the nodes hold the layers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from protocol.canonical import loads_bounded
from protocol.errors import ConfigError, UsageError
from protocol.fields import is_int
from protocol.links import check_node_key, is_encrypted


def planet_home() -> Path:
    return Path(os.environ.get("PLANET_HOME") or "~/.cache/planet").expanduser()


def local_run_dir() -> Path:
    return planet_home() / "local"


def default_nodes_path() -> Path:
    return local_run_dir() / "nodes.json"


@dataclass(frozen=True, slots=True)
class NodeRef:
    url: str
    shard: int
    layers: tuple[int, int]
    key: str | None = None  # node key (64 hex), required for an https:// url
    last: int | None = None  # a span's last shard (served as one hop with `shard` … `last`)


@dataclass(frozen=True, slots=True)
class NodesFile:
    manifest: Path
    nodes: tuple[NodeRef, ...]
    committee_rpc: str | None = None  # where the nodes' prices are registered (None: no chain)

    def to_json(self) -> dict[str, Any]:
        return {
            **({} if self.committee_rpc is None else {"committee_rpc": self.committee_rpc}),
            "manifest": str(self.manifest),
            "nodes": [
                {"url": n.url, "shard": n.shard, "layers": list(n.layers)}
                | ({} if n.key is None else {"key": n.key})
                | ({} if n.last is None else {"last": n.last})
                for n in self.nodes
            ],
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> NodesFile:
        """Read and check a nodes file; every user mistake is a UsageError/ConfigError."""
        raw = _read_json(path)
        try:
            manifest = _text(raw["manifest"], "manifest")
            nodes = tuple(_node(n, i) for i, n in enumerate(_list(raw["nodes"], "nodes")))
            committee = raw.get("committee_rpc")
            committee = None if committee is None else _http_url(committee, "committee_rpc")
        except (KeyError, TypeError) as error:
            raise ConfigError(
                f"nodes file {path} is malformed: {_reason(error)}", hint=_SHAPE_HINT
            ) from None
        except ValueError as error:
            raise ConfigError(
                f"nodes file {path} is malformed: {error}", hint=_SHAPE_HINT
            ) from None
        if not nodes:
            raise ConfigError(f"nodes file {path} lists no nodes", hint=_SHAPE_HINT)
        return cls(manifest=Path(manifest), nodes=nodes, committee_rpc=committee)


_SHAPE_HINT = 'expected {"manifest": PATH, "nodes": [{"url", "shard", "layers"[, "key"]}, ...]}'
MAX_NODES_FILE_BYTES = 1024 * 1024
MAX_NODES = 1024


def _read_json(path: Path) -> Any:
    if path.is_dir():
        raise UsageError(
            f"{path} is a directory, not a nodes file",
            hint=f"pass the JSON file itself, e.g. --nodes {path / 'nodes.json'}",
        )
    if not path.exists():
        raise UsageError(
            f"no nodes file at {path}",
            hint="start local nodes with `planet local up --nodes 3`, or pass --nodes FILE",
        )
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_NODES_FILE_BYTES + 1)
    except OSError as error:
        raise UsageError(
            f"cannot read nodes file {path}: {error.strerror or error}",
            hint="check the path and its permissions",
        ) from None
    if len(data) > MAX_NODES_FILE_BYTES:
        raise ConfigError(
            f"nodes file {path} is larger than {MAX_NODES_FILE_BYTES} bytes", hint=_SHAPE_HINT
        )
    try:
        return loads_bounded(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"nodes file {path} is not UTF-8 text", hint=_SHAPE_HINT) from None
    except (ValueError, RecursionError) as error:
        raise ConfigError(
            f"nodes file {path} is not JSON: {str(error)[:120]}", hint=_SHAPE_HINT
        ) from None


def _reason(error: Exception) -> str:
    return f"missing field {error}" if isinstance(error, KeyError) else str(error)


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096 or "\x00" in value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _http_url(value: Any, name: str) -> str:
    url = _text(value, name).rstrip("/")
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{name} must be an http(s):// URL, got {url[:80]!r}")
    return url


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > MAX_NODES:
        raise ValueError(f"{name} must be a list of at most {MAX_NODES} entries")
    return value


def _int(value: Any, name: str) -> int:
    if not is_int(value, 0, 2**31 - 1):
        raise ValueError(f"{name} must be an integer >= 0, got {str(value)[:40]!r}")
    return value


def _node(raw: Any, index: int) -> NodeRef:
    if not isinstance(raw, dict):
        raise ValueError(f"nodes[{index}] must be an object")
    url = _text(raw["url"], f"nodes[{index}].url").rstrip("/")
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query:
        raise ValueError(f"nodes[{index}].url must be http(s)://HOST:PORT, got {url[:80]!r}")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"nodes[{index}].url has a bad port: {url[:80]!r}") from None
    layers = _list(raw["layers"], f"nodes[{index}].layers")
    if len(layers) != 2:
        raise ValueError(f"nodes[{index}].layers must be [start, end]")
    key = raw.get("key")
    if key is not None:
        try:
            key = check_node_key(key)
        except ValueError:
            raise ValueError(f"nodes[{index}].key must be 64 lower-case hex characters") from None
    elif is_encrypted(url):
        raise ValueError(f"nodes[{index}] is an https:// node: give its node key as `key`")
    shard = _int(raw["shard"], f"nodes[{index}].shard")
    last = raw.get("last")
    if last is not None and (_int(last, f"nodes[{index}].last") < shard):
        raise ValueError(f"nodes[{index}].last must be >= its shard ({shard}), got {last}")
    return NodeRef(
        url=url,
        shard=shard,
        layers=(_int(layers[0], "layers[0]"), _int(layers[1], "layers[1]")),
        key=key,
        last=last,
    )
