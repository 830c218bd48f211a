"""`planet earnings` / `planet claim`: epoch states and the named refusals (no chain needed)."""

from __future__ import annotations

import pytest

from node.cli.earnings import (
    AlreadyClaimed,
    ChallengeWindowOpen,
    EpochEarning,
    EscrowView,
    NothingToClaim,
    RootNotPosted,
    _check_claimable,
)
from planet.main import main

pytestmark = pytest.mark.unit

NOW = 1_000


def earning(**changes: object) -> EpochEarning:
    base = {
        "epoch": 3,
        "shares": 800,
        "amount": 515,
        "payable": 515,
        "confirmed": True,
        "escrow_status": 1,
        "claimable_at": NOW - 1,
        "claimed": False,
    }
    return EpochEarning(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "state"),
    [
        ({}, "claimable"),
        ({"claimed": True}, "claimed"),
        ({"escrow_status": 2}, "disputed"),
        ({"escrow_status": 0, "confirmed": False}, "signing"),
        ({"escrow_status": 0}, "posting"),
        ({"claimable_at": NOW + 30}, "challenge window"),
    ],
)
def test_earnings_epoch_state(changes: dict, state: str) -> None:
    assert earning(**changes).state(NOW) == state


@pytest.mark.parametrize(
    ("changes", "error", "text"),
    [
        ({"amount": 0}, NothingToClaim, "pays nothing"),
        ({"claimed": True}, AlreadyClaimed, "already claimed"),
        ({"escrow_status": 0}, RootNotPosted, "not on the escrow yet"),
        ({"escrow_status": 2}, RootNotPosted, "disputed"),
        ({"claimable_at": NOW + 30}, ChallengeWindowOpen, "30 s more"),
    ],
)
def test_claim_refusals_are_named(changes: dict, error: type, text: str) -> None:
    with pytest.raises(error) as raised:
        _check_claimable(earning(**changes), NOW)
    assert text in raised.value.message
    _check_claimable(earning(), NOW)  # claimable: no error


def test_claim_without_a_wallet_is_an_error_with_a_hint(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    assert main(["claim", "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no wallet at") and "hint:" in err and "Traceback" not in err


def test_earnings_bad_epoch_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["earnings", "--epoch", "٣"])
    assert exited.value.code == 2
    assert "not an epoch number" in capsys.readouterr().err


class _Shortfall:
    def __init__(self, total: int, collected: int) -> None:
        self.value = (total, collected)

    def shortfallOf(self, epoch: int) -> _Shortfall:
        return self

    def call(self) -> tuple[int, int]:
        return self.value


@pytest.mark.parametrize(
    ("total", "collected", "pays"), [(0, 0, 515), (1000, 1000, 515), (1000, 400, 206), (3, 1, 171)]
)
def test_a_short_epoch_pays_its_scaled_amount(total: int, collected: int, pays: int) -> None:
    escrow = EscrowView.__new__(EscrowView)  # no chain: only the shortfall read is exercised
    escrow.contract = type("C", (), {"functions": _Shortfall(total, collected)})()
    assert escrow.payable(3, 515) == pays  # the contract's rule: amount × collected ÷ total


def test_a_short_epoch_counts_what_it_pays() -> None:
    row = earning(payable=206)
    assert row.to_json(NOW)["payable"] == "206" and row.to_json(NOW)["amount"] == "515"
