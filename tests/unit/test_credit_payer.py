"""The client's `CreditPayer` bookkeeping alone: a credit a hop refuses `credit_not_taken` comes
back into the wallet whether the refusal comes while its session runs or after it closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.client.credit_wallet import CreditWallet
from node.client.paying import CLOSED_KEPT, CreditPayer
from protocol.paid_credits import spent_id
from tests.credit_fakes import fake_credits

pytestmark = pytest.mark.unit

URLS = ["http://a:1", "http://b:2"]


def _payer(tmp_path: Path, count: int) -> CreditPayer:
    wallet = CreditWallet(tmp_path / "credits.json")
    wallet.add(fake_credits(count))
    return CreditPayer(wallet, {url: 8 for url in URLS}, min_positions=8)


def _pay(payer: CreditPayer, sid: int, used: int) -> list[str]:
    """Pay `sid`'s hops for `used` positions; the spent ids sent, hop by hop."""
    sent = []
    for index, credits in enumerate(payer.take(payer.due(sid, URLS, used))):
        for credit in credits:
            payer.paid(sid, index, URLS[index], credit)
            sent.append(spent_id(credit))
    return sent


def test_a_refusal_while_the_session_runs_pays_that_hop_again(tmp_path: Path) -> None:
    payer = _payer(tmp_path, 4)
    first, _ = _pay(payer, 1, 8)
    assert payer.give_back(1, 0, first) and payer.wallet.count() == 3 and payer.spent == 1
    assert payer.due(1, URLS, 8) == [1, 0]  # hop 0 is owed its credit again


def test_a_refusal_after_the_session_closed_still_returns_the_credit(tmp_path: Path) -> None:
    """A node that could not check a credit in time refuses it after the client's session
    failed and closed (both hops opened it): the credit, never taken, is the user's again."""
    payer = _payer(tmp_path, 4)
    first, second = _pay(payer, 1, 8)
    payer.forget(1, {0, 1})
    assert payer.wallet.count() == 2 and payer.spent == 2
    assert payer.give_back(1, 0, first)
    assert payer.wallet.count() == 3 and payer.spent == 1
    assert not payer.give_back(1, 0, first)  # once
    # a later session on the same sid (circuits share a hosted payer) keeps its own tally
    _pay(payer, 1, 8)
    assert payer.give_back(1, 1, second) and payer.due(1, URLS, 8) == [0, 0]


def test_closed_sessions_are_kept_for_late_refusals_up_to_a_bound(tmp_path: Path) -> None:
    payer = _payer(tmp_path, 2 * (CLOSED_KEPT + 1))
    oldest, _ = _pay(payer, 1, 8)
    payer.forget(1, {0, 1})
    for sid in range(2, CLOSED_KEPT + 2):
        _pay(payer, sid, 8)
        payer.forget(sid, {0, 1})
    assert not payer.give_back(1, 0, oldest)  # the oldest closed session's record went
    assert len(payer._closed) == CLOSED_KEPT
