"""`random_free_port`: an auto-chosen node port, drawn at random among the free ones, so two
`planet join` side by side on one host do not both take the lowest free port."""

from __future__ import annotations

import pytest

from node.server import launcher
from protocol.errors import UnavailableError

pytestmark = pytest.mark.unit


def test_a_drawn_port_is_free_and_draws_spread_over_the_free_ones(monkeypatch) -> None:
    free = {18_103, 18_150, 18_177, 18_190}
    monkeypatch.setattr(launcher, "port_is_free", lambda port: port in free)
    drawn = [launcher.random_free_port(18_100, 18_200) for _ in range(200)]
    assert set(drawn) == free  # never a busy port; not always the lowest free one


def test_no_free_port_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setattr(launcher, "port_is_free", lambda port: False)
    with pytest.raises(UnavailableError, match="no free port in 18100-18109"):
        launcher.random_free_port(18_100, 18_110)
