"""The nodes file: which prepared model and which nodes, in circuit order.

    {"manifest": "/abs/path/manifest.json",
     "nodes": [{"url": "http://127.0.0.1:18100", "shard": 0, "layers": [0, 10]}, ...]}

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

from protocol.errors import ConfigError, UsageError


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


@dataclass(frozen=True, slots=True)
class NodesFile:
    manifest: Path
    nodes: tuple[NodeRef, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": str(self.manifest),
            "nodes": [
                {"url": n.url, "shard": n.shard, "layers": list(n.layers)} for n in self.nodes
            ],
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> NodesFile:
        if not path.exists():
            raise UsageError(
                f"no nodes file at {path}",
                hint="start local nodes with `planet local up --nodes 3`, or pass --nodes FILE",
            )
        try:
            raw = json.loads(path.read_text())
            manifest = Path(raw["manifest"])
            nodes = tuple(
                NodeRef(
                    url=str(n["url"]).rstrip("/"),
                    shard=int(n["shard"]),
                    layers=(int(n["layers"][0]), int(n["layers"][1])),
                )
                for n in raw["nodes"]
            )
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise ConfigError(
                f"nodes file {path} is malformed: {error}",
                hint='expected {"manifest": PATH, "nodes": [{"url", "shard", "layers"}, ...]}',
            ) from None
        if not nodes:
            raise ConfigError(f"nodes file {path} lists no nodes")
        return cls(manifest=manifest, nodes=nodes)
