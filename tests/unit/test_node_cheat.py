"""Cheater modes of a compute node (tests/doubles/cheating.py) compute what they say, and only a
test entry point (tests/doubles/cheating_node.py) serves them: the product's `planet node serve`
and ServerConfig have no cheat option."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from node.server import tickets
from node.server.config import ServerConfig
from node.server.tickets import CommitteePolicy, TicketRefusedError
from planet import main as cli
from protocol.errors import ConfigError, UsageError
from protocol.spotcheck import Triple, assign_verifier
from protocol.tickets import TicketRequest
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
        ("noise:0.1:4:withhold", cheat.CheatMode("noise", every=4, relative=0.1, withhold=True)),
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


@pytest.mark.parametrize(
    "text",
    [
        "substitute-skip:2:withhold",
        "substitute-perturb:0.05:withhold",
        "no-tickets:withhold",
        "silent:withhold",
        "noise:0.1:withhold",
        "noise:0.1:4:withhold:withhold",
        "noise:0.1:4:Withhold",
        "noise:0.1:4:",
    ],
)
def test_cheat_withhold_only_as_the_noise_suffix(text: str) -> None:
    with pytest.raises(ConfigError, match="unknown cheat mode") as refused:
        cheat.parse_mode(text)
    assert "noise:R:K[:withhold]" in (refused.value.hint or "")


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


# ---- noise:R:K:withhold: tickets only for the assigned verifier --------------------------------
SEED = "0x" + "5e" * 32
TRIPLE = Triple(node="ab" * 32, session="0x" + "cd" * 32, block=3, shard=1)
VERIFIERS = sorted(f"{i:02x}" * 32 for i in range(1, 6))
ASSIGNED = assign_verifier(SEED, TRIPLE, VERIFIERS)
OTHER = next(key for key in VERIFIERS if key != ASSIGNED)
OUTSIDER = "ee" * 32


def _ask(verifier: str, seed: str = SEED) -> TicketRequest:
    return TicketRequest(TRIPLE, seed, verifier)


def test_cheat_withholding_serves_only_the_assigned_verifier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert ASSIGNED != OTHER and OUTSIDER not in VERIFIERS
    honest = tickets.authorize_selection
    withheld = cheat.withholding(honest)
    seeds = {SEED}
    honest(_ask(OTHER), seeds, VERIFIERS, 1_000_000)  # the honest node lets it re-judge
    withheld(_ask(ASSIGNED), seeds, VERIFIERS, 1_000_000, floor=1, blocks=4)
    caplog.set_level("INFO", logger=cheat.__name__)
    with pytest.raises(TicketRefusedError, match="not the verifier assigned"):
        withheld(_ask(OTHER), seeds, VERIFIERS, 1_000_000)
    assert f"ticket withheld from verifier {OTHER[:12]}" in caplog.messages


def test_cheat_withholding_still_refuses_what_the_honest_rule_refuses() -> None:
    withheld = cheat.withholding(tickets.authorize_selection)
    with pytest.raises(TicketRefusedError, match="not an epoch seed"):
        withheld(_ask(ASSIGNED, seed="0x" + "00" * 32), {SEED}, VERIFIERS, 1_000_000)
    with pytest.raises(TicketRefusedError, match="not a spot-check verifier"):
        withheld(_ask(OUTSIDER), {SEED}, VERIFIERS, 1_000_000)
    with pytest.raises(TicketRefusedError, match="not a spot-check verifier"):
        withheld(_ask(ASSIGNED), {SEED}, [], 1_000_000)


class _Committee:
    """One epoch whose record fixes SEED and VERIFIERS (a CommitteePolicy's rpc)."""

    async def abci_query(self, path: str) -> dict:
        if path == "/epochs":
            return {"current": 1}
        if path == "/epochs?epoch=1":
            return {"epochs": [{"epoch": 1, "seed": SEED[2:], "verifiers": VERIFIERS}]}
        if path == "/params":
            return {"genesis": {}}
        assert path.startswith("/coverage?node=")
        return {"shards": []}


def test_cheating_node_withholds_through_the_committee_policy_while_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--cheat noise:R:K:withhold` swaps the module function the node's CommitteePolicy calls
    for as long as the node serves, and puts the honest one back after."""
    import asyncio

    honest = tickets.authorize_selection
    seen: list[str] = []

    async def ask(verifier: str) -> str:
        try:
            await CommitteePolicy(_Committee(), rate_ppm=1_000_000).authorize(_ask(verifier))
        except TicketRefusedError:
            return "refused"
        return "ticket"

    def serve_wrapped(module: str, doing: str, rest: object, wrap: object, banner: str) -> int:
        seen.extend([banner, asyncio.run(ask(ASSIGNED)), asyncio.run(ask(OTHER))])
        return 0

    monkeypatch.setattr(cheating_node, "serve_wrapped", serve_wrapped)
    assert (
        cheating_node.run([*_serve_args(), *cheating_node.cheat_args("noise:0.1:4:withhold")]) == 0
    )
    assert seen == ["CHEATING NODE mode=noise:0.1:4:withhold", "ticket", "refused"]
    assert tickets.authorize_selection is honest
    seen.clear()
    assert cheating_node.run([*_serve_args(), "--cheat", "noise:0.1:4"]) == 0
    assert seen == ["CHEATING NODE mode=noise:0.1:4", "ticket", "ticket"]


def test_cheating_join_passes_withhold_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from node.agent import launch
    from tests.doubles import cheating_join

    started: list[dict] = []
    monkeypatch.setattr(launch, "start_node", lambda **kwargs: started.append(kwargs))
    start_node, _spawn = cheating_join._cheating_launcher("noise:0.1:4:withhold")
    start_node(extra_args=("--port", "1"))
    assert started == [
        {
            "extra_args": ["--port", "1", "--cheat", "noise:0.1:4:withhold"],
            "module": cheating_node.MODULE,
        }
    ]
