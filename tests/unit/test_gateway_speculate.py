"""`planet gateway serve --speculate K`: the number a gateway operator types is checked at
the config boundary (0 … 16 guesses per pass), anything else a named UsageError."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.gateway.config import GatewayConfig
from protocol.errors import UsageError

pytestmark = pytest.mark.unit


def _config(tmp_path: Path, speculate: object) -> GatewayConfig:
    return GatewayConfig(
        evm_rpc="http://x",
        deployment=tmp_path / "d.json",
        committee_rpc="http://x",
        manifest=tmp_path / "m.json",
        wallet=tmp_path / "w.json",
        speculate=speculate,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("speculate", [0, 1, 8, 16])
def test_speculate_within_range_passes_its_check(tmp_path: Path, speculate: int) -> None:
    # the placeholder paths fail a later check (no manifest); never the --speculate one
    with pytest.raises(UsageError) as later:
        _config(tmp_path, speculate).validate()
    assert "--speculate" not in later.value.message and "manifest" in later.value.message


@pytest.mark.parametrize("speculate", [-1, 17, 10**9])
def test_speculate_out_of_range_is_a_usage_error(tmp_path: Path, speculate: int) -> None:
    with pytest.raises(UsageError, match="--speculate"):
        _config(tmp_path, speculate).validate()


@pytest.mark.parametrize("argv", [["--speculate", "17"], ["--speculate", "-3"]])
def test_planet_ask_speculate_out_of_range_exits_2_with_the_range(capsys, argv) -> None:
    from planet.main import main

    assert main(["ask", "hi", *argv]) == 2
    assert "--speculate takes 1 … 16" in capsys.readouterr().err
