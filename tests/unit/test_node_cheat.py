"""Cheater modes of a compute node (tests/doubles/cheating.py) compute what they say, and only a
test entry point (tests/doubles/cheating_node.py) serves them: the product's `planet node serve`
and ServerConfig have no cheat option."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from node.cli import main as cli
from node.server.config import ServerConfig
from protocol.errors import ConfigError, UsageError
from tests.doubles import cheating as cheat
from tests.doubles import cheating_node
from tests.doubles.fake_shard import FakeShard

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


def test_cheat_noise_touches_only_every_kth_position() -> None:
    backend = cheat.wrap(FakeShard(hidden_size=16), cheat.parse_mode("noise:0.5:4"))
    hidden = np.ones((1, 9, 16), dtype=np.float32)
    out = backend.forward(hidden, np.arange(9), backend.new_cache())
    changed = [p for p in range(9) if not np.allclose(out[0, p], 2.0)]
    assert changed == [0, 4, 8]
    assert backend.answers_tickets and backend.model_hash == "sha256:" + "0" * 64


def test_cheat_substitute_skip_keeps_first_and_every_nth_layer() -> None:
    model = SimpleNamespace(_modules=list("abcdef"), _types=list("ABCDEF"))
    backend = FakeShard()
    backend.model = model
    cheat.wrap(backend, cheat.parse_mode("substitute-skip:2"))
    assert model._modules == ["a", "c", "e"] and model._types == ["A", "C", "E"]
    silent = cheat.wrap(FakeShard(), cheat.parse_mode("no-tickets"))
    assert not silent.answers_tickets


def _serve_args(**kw: object) -> list[str]:
    return [
        "node", "serve", "--manifest", "/nonexistent/manifest.json", "--shard", "0",
        "--plaintext-links", *kw,
    ]  # fmt: skip


def test_cli_node_serve_has_no_cheat_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*_serve_args(), "--cheat", "noise:0.1:4"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --cheat" in capsys.readouterr().err


def test_server_config_has_no_cheat_field() -> None:
    assert not [f.name for f in dataclasses.fields(ServerConfig) if "cheat" in f.name]


def test_cheating_node_checks_the_node_arguments_with_the_cli(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["-v", *_serve_args(), *cheating_node.cheat_args("noise:0.1:4")]
    assert cheating_node.main(argv) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: no manifest at /nonexistent/manifest.json" in err and "Traceback" not in err


def test_cheating_node_refuses_an_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert cheating_node.main([*_serve_args(), "--cheat", "honest"]) == ConfigError.exit_status
    assert "error: unknown cheat mode 'honest'" in capsys.readouterr().err


def test_cheating_node_serves_only_node_serve() -> None:
    with pytest.raises(UsageError, match="only `node serve` can cheat"):
        cheating_node.run(["local", "up", "--cheat", "noise:0.1:4"])
