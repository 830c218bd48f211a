"""The hosted gateway's credit top-up (node/gateway/topup.py): it buys when the wallet holds
fewer than the low-water mark, in mints of at most MAX_BUY, and not otherwise; a failed pass is
logged (an unfunded balance with the `planet balance deposit … --credits` hint) and retried
after a doubling wait, never raising; a purchase an earlier run left in flight is finished
first — with the real credit file and the in-process committee chain — and no new one is bought
while one still waits for its funding."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node.client import credit_purchase
from node.client.credit_purchase import MintUnfunded
from node.client.credit_wallet import MAX_BUY, CreditWallet
from node.gateway.topup import MAX_BACKOFF_S, UNFUNDED_HINT, CommitteeShop, TopUp
from protocol.errors import UnavailableError
from tests.credit_chain import PAYER
from tests.unit.test_credit_purchase_resume import ChainLink, _fund, _gather, _setup

pytestmark = pytest.mark.unit


@dataclass
class FakeWallet:
    held: int = 0
    waiting: list[Any] = field(default_factory=list)  # purchases in flight

    def count(self) -> int:
        return self.held

    def pending(self) -> list[Any]:
        return list(self.waiting)


@dataclass
class FakeShop:
    """Buys into a `FakeWallet`; `fail` raises instead, for as many calls as it lists."""

    wallet: FakeWallet
    fail: list[BaseException] = field(default_factory=list)
    mints: list[int] = field(default_factory=list)
    finished: int = 0

    async def buy(self, count: int) -> list[int]:
        if self.fail:
            raise self.fail.pop(0)
        self.mints.append(count)
        self.wallet.held += count
        return [0] * count

    async def finish(self) -> list[int]:
        self.finished += 1
        return []


AMOUNT = 2 * MAX_BUY + 10  # a top-up of two whole mints and a part


def top_up(wallet: FakeWallet, shop: FakeShop, **options: Any) -> TopUp:
    return TopUp(wallet, shop.buy, shop.finish, **{"below": 100, "amount": AMOUNT, **options})


def test_topup_below_the_mark_buys_the_amount_in_mints_of_at_most_max_buy() -> None:
    wallet = FakeWallet(held=99)
    shop = FakeShop(wallet)
    topup = top_up(wallet, shop)
    assert asyncio.run(topup.step()) == topup.every_s
    assert shop.mints == [MAX_BUY, MAX_BUY, 10]
    assert wallet.held == 99 + AMOUNT and topup.bought == AMOUNT and topup.failures == 0


def test_topup_at_or_above_the_mark_or_turned_off_buys_nothing() -> None:
    for held, amount in ((100, AMOUNT), (5000, AMOUNT), (0, 0)):
        wallet = FakeWallet(held=held)
        shop = FakeShop(wallet)
        assert asyncio.run(top_up(wallet, shop, amount=amount).step()) > 0
        assert shop.mints == [] and wallet.held == held, (held, amount)


def test_topup_failures_back_off_doubling_to_the_cap_and_never_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wallet = FakeWallet(held=0)
    errors: list[BaseException] = [UnavailableError("committee down")] * 3 + [RuntimeError("bug")]
    errors += [UnavailableError("still down")] * 20
    tries = len(errors)
    shop = FakeShop(wallet, fail=errors)
    topup = top_up(wallet, shop, backoff_s=2.0)
    with caplog.at_level(logging.WARNING, logger="node.gateway.topup"):
        waits = [asyncio.run(topup.step()) for _ in range(tries)]
    assert waits[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert waits[-1] == MAX_BACKOFF_S and max(waits) == MAX_BACKOFF_S
    assert topup.failures == tries and wallet.held == 0
    assert "committee down" in caplog.text and "RuntimeError('bug')" in caplog.text
    assert asyncio.run(topup.step()) == topup.every_s  # the shop answers again: bought, reset
    assert topup.failures == 0 and wallet.held == AMOUNT


def test_topup_an_unfunded_balance_is_logged_with_the_deposit_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wallet = FakeWallet(held=3)
    unfunded = MintUnfunded("mint 0xab was not funded within 60 s", final=False, hint="other")
    shop = FakeShop(wallet, fail=[unfunded])
    with caplog.at_level(logging.WARNING, logger="node.gateway.topup"):
        assert asyncio.run(top_up(wallet, shop).step()) > 0
    assert "not funded within 60 s" in caplog.text and UNFUNDED_HINT in caplog.text
    assert "planet balance deposit X --credits" in UNFUNDED_HINT


def test_topup_buys_nothing_while_a_purchase_still_waits_for_its_funding(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wallet = FakeWallet(held=0, waiting=["mint in flight"])
    shop = FakeShop(wallet)
    topup = top_up(wallet, shop)
    with caplog.at_level(logging.WARNING, logger="node.gateway.topup"):
        assert asyncio.run(topup.step()) == topup.backoff_s
    assert shop.finished == 1 and shop.mints == [] and topup.failures == 1
    assert "1 credit purchase(s) still wait for funding" in caplog.text
    assert UNFUNDED_HINT in caplog.text


def test_topup_run_goes_on_through_failures_until_stopped() -> None:
    wallet = FakeWallet(held=0)
    shop = FakeShop(wallet, fail=[UnavailableError("down"), RuntimeError("bug")])
    topup = top_up(wallet, shop, every_s=0.01, backoff_s=0.01)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(topup.run(stop))
        async with asyncio.timeout(5):
            while wallet.held < AMOUNT:
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert shop.mints == [MAX_BUY, MAX_BUY, 10] and topup.failures == 0


def test_topup_after_a_restart_finishes_the_purchase_left_in_the_credit_file_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway died after its mint was sent and funded: the purchase is in its credit file.
    The new process's first pass (the real `CommitteeShop`, over the in-process committee
    chain) finishes it — the credits into the wallet, nothing pending — and buys nothing more
    once that lifts the wallet to the mark."""
    chain, stores, request, _, _ = _setup(tmp_path)
    link = ChainLink(chain)
    [landed] = chain.block([chain.tx(request.body, link.key)])
    assert landed.code == 0, landed.log
    assert _fund(chain, request.mint_id) == [0] * len(chain.validators)
    monkeypatch.setattr(credit_purchase, "CommitteeLink", lambda *a, **k: link)
    monkeypatch.setattr(credit_purchase, "partials_from", lambda *a: _gather(chain, stores))
    wallet = CreditWallet(tmp_path / "credits.json")  # the new process's
    shop = CommitteeShop(("http://validator",), PAYER, wallet, fund_wait_s=0.01)
    bought: list[int] = []

    async def buy(count: int) -> list[Any]:
        bought.append(count)
        return []

    topup = TopUp(wallet, buy, shop.finish, below=3, amount=30)
    assert asyncio.run(topup.step()) == topup.every_s
    assert wallet.count() == 3 and wallet.pending() == [] and topup.bought == 3
    assert bought == [] and link.submitted == 0  # finished, not sent again nor bought anew
