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


class _PagedCommittee:
    """`CommitteeLink` as `earnings_of` uses it: `/payouts?account` paged as the committee
    pages it (newest first, at most 2 a page here, `next` the `after` of the next page)."""

    def __init__(self, urls: object) -> None:
        self.numbers = list(range(1, 6))  # statement n pays the account n wei

    async def query(self, path: str, **params: object) -> object:
        if path == "/credits":
            return {"epoch": 9, "credits": []}
        assert path == "/payouts" and "account" in params
        order = sorted(self.numbers, reverse=True)
        if "after" in params:
            order = order[order.index(int(str(params["after"]))) + 1 :]
        rows = order[: min(int(str(params.get("limit", 2))), 2)]
        return {
            "epochs": [
                {"epoch": n, "pages": 1, "amount": str(n), "shares": "1", "confirmed": True}
                for n in rows
            ],
            "next": str(rows[-1]) if len(order) > len(rows) else None,
        }

    async def close(self) -> None:
        return None


class _PostedEscrow:
    def __init__(self, config: object) -> None:
        pass

    def epoch_of(self, epoch: int) -> tuple[int, int]:
        return 1, 0

    def payable(self, epoch: int, amount: int) -> int:
        return amount

    def claimed(self, epoch: int, account: str) -> bool:
        return False

    def now(self) -> int:
        return NOW


def test_earnings_list_every_page_of_statements(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 42: `planet earnings` / `planet claim` read `/payouts?account` to its last page
    (the first page alone hid every epoch past the 1,000 newest); past `STATEMENT_PAGES` the
    newest are listed and a warning says the older ones are not."""
    from types import SimpleNamespace

    import node.chain.committee_link
    import node.cli.earnings as earnings

    monkeypatch.setattr(node.chain.committee_link, "CommitteeLink", _PagedCommittee)
    monkeypatch.setattr(earnings, "EscrowView", _PostedEscrow)
    config = SimpleNamespace(committee_rpc="http://committee.invalid")
    rows, _ = earnings.earnings_of(config, "0x" + "ab" * 20, None)
    assert [(row.epoch, row.amount) for row in rows] == [(n, n) for n in range(1, 6)]
    monkeypatch.setattr(earnings, "STATEMENT_PAGES", 2)
    with caplog.at_level("WARNING", logger="node.cli.earnings"):
        rows, _ = earnings.earnings_of(config, "0x" + "ab" * 20, None)
    assert [row.epoch for row in rows] == [2, 3, 4, 5]
    assert any("only the newest are listed" in r.getMessage() for r in caplog.records)
