"""CometBFT's ABCI protobuf classes, generated at build time into `gen/` (never committed).

`abci_pb()` returns the `tendermint.abci.types_pb2` module and `canonical_pb()` the
`tendermint.types.canonical_pb2` module. The generated code imports its siblings as top-level
packages (`tendermint.*`, `gogoproto`), so `gen/` is put on `sys.path` on first use. When the
classes are missing, a `ConfigError` tells the operator to run `bash deploy/setup.sh`
(or `python -m abci_app.proto.build`).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from protocol.errors import ConfigError

GEN_DIR = Path(__file__).resolve().parent / "gen"


def _load(name: str) -> ModuleType:
    if str(GEN_DIR) not in sys.path:
        sys.path.insert(0, str(GEN_DIR))
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ConfigError(
            f"the CometBFT protobuf classes are not generated ({error})",
            hint="run bash deploy/setup.sh (or .venv/bin/python -m abci_app.proto.build)",
        ) from None


def abci_pb() -> ModuleType:
    """`tendermint.abci.types_pb2` (Request, Response and every ABCI message)."""
    return _load("tendermint.abci.types_pb2")


def canonical_pb() -> ModuleType:
    """`tendermint.types.canonical_pb2` (CanonicalVoteExtension for vote-extension sign bytes)."""
    return _load("tendermint.types.canonical_pb2")
