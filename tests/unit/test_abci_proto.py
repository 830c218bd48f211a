"""Generated CometBFT protobuf classes: built from the Go module cache, clear error if missing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from abci_app import proto
from abci_app.proto import build
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit


def test_abci_proto_missing_module_raises_config_error_with_setup_hint() -> None:
    with pytest.raises(ConfigError) as raised:
        proto._load("tendermint.abci.not_generated_pb2")
    assert "deploy/setup.sh" in (raised.value.hint or "")


def test_abci_proto_build_missing_sources_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        build.build(tmp_path / "empty-modcache", tmp_path / "gen")
    assert "go mod download" in (raised.value.hint or "")


def test_abci_proto_build_generates_request_with_all_abci2_methods(tmp_path: Path) -> None:
    modcache = build.go_modcache()
    if not (modcache / "github.com" / "cometbft" / "cometbft@v0.38.25").exists():
        pytest.fail(f"CometBFT module sources missing in {modcache}: run bash deploy/setup.sh")
    out = build.build(modcache, tmp_path / "gen")
    assert (out / "tendermint" / "abci" / "types_pb2.py").is_file()
    assert (out / "tendermint" / "abci" / "__init__.py").is_file()
    # the in-tree generated module (what the app imports) has every ABCI 2.0 request
    methods = {f.name for f in proto.abci_pb().Request.DESCRIPTOR.oneofs_by_name["value"].fields}
    assert {
        "prepare_proposal",
        "process_proposal",
        "extend_vote",
        "verify_vote_extension",
        "finalize_block",
        "check_tx",
        "commit",
        "query",
        "info",
        "init_chain",
        "flush",
        "echo",
    } <= methods
    assert "begin_block" not in methods and "deliver_tx" not in methods
    assert importlib.import_module("tendermint.abci.types_pb2") is proto.abci_pb()
    assert str(proto.GEN_DIR) in sys.path
