"""Cheater modes of a compute node (node/server/cheat.py): impossible to switch on by accident
(hidden flag AND environment confirmation; `wrap` needs its confirm string), and each mode
computes what it says."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from node.cli import main as cli
from node.cli import node as node_cli
from node.server import cheat
from node.server.fake import FakeShard
from protocol.errors import ConfigError, UsageError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("substitute-skip:2", cheat.CheatMode("substitute-skip", every=2)),
        ("substitute-perturb:0.05", cheat.CheatMode("substitute-perturb", relative=0.05)),
        ("noise:0.1:4", cheat.CheatMode("noise", every=4, relative=0.1)),
        ("no-tickets", cheat.CheatMode("no-tickets")),
    ],
)
def test_cheat_parse_mode_known_modes_round_trip(text: str, mode: cheat.CheatMode) -> None:
    assert cheat.parse_mode(text) == mode
    assert str(mode) == text


@pytest.mark.parametrize(
    "text", ["", "honest", "substitute-skip:1", "noise:0.1:0", "noise:nan:4", "no-tickets ", "²"]
)
def test_cheat_parse_mode_refuses_anything_else(text: str) -> None:
    with pytest.raises(ConfigError):
        cheat.parse_mode(text)


def test_cheat_wrap_needs_its_confirm_string() -> None:
    with pytest.raises(ConfigError):
        cheat.wrap(FakeShard(), cheat.CheatMode("no-tickets"), confirm="yes")


def test_cheat_noise_touches_only_every_kth_position() -> None:
    backend = cheat.wrap(
        FakeShard(hidden_size=16), cheat.parse_mode("noise:0.5:4"), confirm=cheat.CONFIRM
    )
    hidden = np.ones((1, 9, 16), dtype=np.float32)
    out = backend.forward(hidden, np.arange(9), backend.new_cache())
    changed = [p for p in range(9) if not np.allclose(out[0, p], 2.0)]
    assert changed == [0, 4, 8]
    assert backend.answers_tickets and backend.model_hash == "sha256:" + "0" * 64


def test_cheat_substitute_skip_keeps_first_and_every_nth_layer() -> None:
    model = SimpleNamespace(_modules=list("abcdef"), _types=list("ABCDEF"))
    backend = FakeShard()
    backend.model = model
    cheat.wrap(backend, cheat.parse_mode("substitute-skip:2"), confirm=cheat.CONFIRM)
    assert model._modules == ["a", "c", "e"] and model._types == ["A", "C", "E"]
    silent = cheat.wrap(FakeShard(), cheat.parse_mode("no-tickets"), confirm=cheat.CONFIRM)
    assert not silent.answers_tickets


def _serve_args(**kw: object) -> list[str]:
    return ["node", "serve", "--manifest", "/nonexistent/manifest.json", "--shard", "0", *kw]


def test_cli_cheat_flag_without_env_confirmation_exits_2(monkeypatch, capsys) -> None:
    monkeypatch.delenv(cheat.ENV, raising=False)
    assert cli.main([*_serve_args(), "--cheat", "noise:0.1:4"]) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: --cheat needs its confirmation" in err and "Traceback" not in err


def test_cli_cheat_env_without_flag_exits_2(monkeypatch, capsys) -> None:
    monkeypatch.setenv(cheat.ENV, cheat.CONFIRM)
    assert cli.main(_serve_args()) == UsageError.exit_status
    assert "no --cheat mode" in capsys.readouterr().err


def test_cli_cheat_flag_is_hidden_from_help() -> None:
    parser = argparse.ArgumentParser(prog="planet")
    node_cli.register(parser.add_subparsers())
    serve = parser.parse_args(["node", "serve", "--manifest", "m", "--shard", "0"])
    assert serve.cheat == ""
    node_parser = parser._subparsers._group_actions[0].choices["node"]
    text = node_parser._subparsers._group_actions[0].choices["serve"].format_help()
    assert "--threads" in text and "cheat" not in text
