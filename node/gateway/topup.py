"""Keeping the hosted gateway's credit wallet stocked: one background task, `TopUp.run`.

Every `every_s` (5 s) a pass:

1. drops the credits past their epochs (`CreditExpiry`, node/client/paying.py): no node takes
   them, and paying with one would cost a failed `pay`;
2. finishes the purchases an earlier pass or an earlier run left in flight: each is in the
   credit file before its mint is sent (node/client/credit_purchase.py), so a gateway stopped
   mid-purchase finishes it after its restart, and nothing paid is lost;
3. when the wallet holds fewer than `below` credits and no purchase still waits for its funding,
   buys `amount` credits in mints of at most MAX_BUY (128), one after another: each paid from the
   gateway's balance at the escrow's own address (`planet balance deposit X --credits` with the
   gateway's keystore), signed by the gateway's EVM key (`CommitteeShop`).

A pass that fails (a committee that does not answer, a balance that does not cover the mint,
anything else) is logged — an unfunded balance with the `planet balance deposit` hint — and the
next pass waits twice as long as the last, from `backoff_s` up to `max_backoff_s`; the task
never ends on an error, only when cancelled or on `stop`. `amount` 0 turns buying off (the
expired credits are still dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from node.client.credit_purchase import MintUnfunded, buy_credits, finish_pending
from node.client.credit_sizes import MAX_BUY
from node.client.credit_wallet import CreditWallet
from node.client.paying import CreditExpiry
from protocol.errors import PlanetError
from protocol.paid_credits import PaidCredit

log = logging.getLogger(__name__)

EVERY_S = 5.0  # between passes while all is well (seconds)
BACKOFF_S = 5.0  # after a first failure (seconds), doubling with each failure in a row
MAX_BACKOFF_S = 300.0
PURCHASE_TTL_S = 3600  # a purchase's signed lifetime (`planet credits buy --ttl`)
FUND_WAIT_S = 60.0  # how long one mint may wait for the validators to vouch for it
UNFUNDED_HINT = (
    "fund the gateway's credit balance: planet balance deposit X --credits --wallet <the "
    "gateway's keystore>"
)


class Stock(Protocol):
    """What the top-up reads of the wallet (`CreditWallet`)."""

    def count(self) -> int: ...
    def pending(self) -> list[Any]: ...


class StillUnfunded(PlanetError):
    """Purchases wait for the validators to vouch that the gateway's balance covers them."""

    code = "credits_unfunded"

    def __init__(self, waiting: int) -> None:
        super().__init__(
            f"{waiting} credit purchase(s) still wait for funding: the gateway's balance at the "
            "escrow does not cover them (yet); no more are bought until they land",
            hint=UNFUNDED_HINT,
        )


@dataclass
class TopUp:
    """The task's state: the wallet, how to buy and finish, the marks, the failures in a row."""

    wallet: Stock
    buy: Callable[[int], Awaitable[Sequence[Any]]]  # mint n ≤ MAX_BUY credits: those bought
    finish: Callable[[], Awaitable[Sequence[Any]]]  # finish purchases in flight: credits gained
    below: int  # buy when the wallet holds fewer credits than this
    amount: int  # credits per top-up (0: never buy)
    expiry: CreditExpiry | None = None
    every_s: float = EVERY_S
    backoff_s: float = BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    failures: int = 0  # passes failed in a row
    bought: int = 0  # credits bought or finished by this task

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set (or the task is cancelled: a purchase in flight is on
        disk and finishes at the next start)."""
        while not stop.is_set():
            wait = await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def step(self) -> float:
        """One pass; returns the seconds to wait before the next (longer after a failure)."""
        try:
            await self._pass()
        except (MintUnfunded, StillUnfunded) as error:  # the gateway's balance is short
            return self._failed(error.message, UNFUNDED_HINT)
        except PlanetError as error:
            return self._failed(error.message, error.hint)
        except Exception as error:  # a bug here must never stop the gateway
            log.exception("credit top-up failed unexpectedly")
            return self._failed(repr(error), None)
        self.failures = 0
        return self.every_s

    async def _pass(self) -> None:
        if self.expiry is not None:
            await self.expiry.check_quietly()
        if self.wallet.pending():
            gained = len(await self.finish())
            self.bought += gained
            if gained:
                log.info("credit top-up: finished purchases in flight, %d credits gained", gained)
            waiting = len(self.wallet.pending())
            if waiting:
                raise StillUnfunded(waiting)
        held = self.wallet.count()
        if not self.amount or held >= self.below:
            return
        log.info(
            "credit top-up: %d credits held, fewer than %d: buying %d",
            held,
            self.below,
            self.amount,
        )
        left = self.amount
        while left > 0:
            count = min(MAX_BUY, left)
            got = len(await self.buy(count))
            left -= count
            self.bought += got
            log.info("credit top-up: bought %d credits, %d held", got, self.wallet.count())

    def _failed(self, message: str, hint: str | None) -> float:
        self.failures += 1
        wait = min(self.max_backoff_s, self.backoff_s * 2 ** min(self.failures - 1, 20))
        log.warning(
            "credit top-up failed (%d in a row, %d credits held; next try in %.0f s): %s%s",
            self.failures,
            self.wallet.count(),
            wait,
            message,
            f" (hint: {hint})" if hint else "",
        )
        return wait


@dataclass
class CommitteeShop:
    """Buying from the committee for the gateway (node/client/credit_purchase.py): mints signed
    by `payer_key`, paid from its balance at the escrow's own address."""

    validator_rpcs: tuple[str, ...]  # every validator's RPC: each blind-signs its own share
    payer_key: bytes  # the gateway's EVM key
    wallet: CreditWallet
    ttl_s: int = PURCHASE_TTL_S
    fund_wait_s: float = FUND_WAIT_S

    async def buy(self, count: int) -> list[PaidCredit]:
        return await buy_credits(
            list(self.validator_rpcs),
            self.payer_key,
            count,
            self.wallet,
            expiry=int(time.time()) + self.ttl_s,
            fund_timeout_s=self.fund_wait_s,
            progress=_progress,
        )

    async def finish(self) -> list[PaidCredit]:
        return await finish_pending(
            list(self.validator_rpcs),
            self.wallet,
            fund_timeout_s=self.fund_wait_s,
            progress=_progress,
        )


def _progress(line: str) -> None:
    log.info("credit top-up: %s", line)
