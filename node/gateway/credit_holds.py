"""The hosted gateway's credit reservations: a question holds the credits its circuit may need
before any of that circuit's nodes is asked anything (issue 42, attack 8).

    reserve = CreditReserve(wallet)          one per gateway (`HostedPayer.reserve`)
    hold = reserve.hold()                    one per question, released in its `finally`
    hold.cover(needed)                       before a circuit is used: hold `needed` credits, or
                                             GatewayOutOfCredits (503) and nothing held more
    hold.draw(n, wallet.take)                a pay to the circuit's nodes: from the hold first
    hold.release()                           what is still held goes back, exactly once

**The bound.** A session of a question sends each hop at most `session_positions(prompt,
max_tokens, lookahead)` positions (the prompt, then one position per decode pass, plus the
guesses of speculative decoding; a failover's replay starts a new session that re-sends the
history, within the same bound). A hop that asks a credit per `price` positions is paid
ceil(positions / price) credits for it (node/client/paying.py), a free hop nothing. So
`circuit_credits` is the most one circuit can cost, and a question holding it before its
prompt is sent cannot run the wallet dry on that circuit: other questions draw only on credits
nobody holds.

**Where a question can still outrun its hold**, and what happens then (node/gateway/app.py):
a failover to a new circuit needs a new `cover` (the first circuit's credits are spent), a
node's registered price falling at an epoch's start mid-answer asks more than was held, and
credits past their window leave the wallet (topup.py) under the holds. A draw past the hold
takes unheld credits; when there are none the question fails `gateway_out_of_credits`, and
since its nodes were paid (`drawn`), its user is charged for the prompt and the tokens
computed, which the answer hands over: the gateway never pays for an answer nobody pays for.

Single-threaded (the gateway's event loop): each method runs to its end without a switch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from node.client.paying import OutOfCreditsError
from protocol.errors import ProtocolError
from protocol.paid_credits import PaidCredit

log = logging.getLogger(__name__)


class GatewayOutOfCredits(OutOfCreditsError):
    """The hosted gateway's credit wallet holds too few credits to pay the circuit's nodes."""

    code = "gateway_out_of_credits"
    http_status = 503

    def __init__(self, needed: int, held: int, *, charged: bool = True) -> None:
        ProtocolError.__init__(
            self,
            f"this gateway holds {held} credits and the compute nodes ask for {needed} more: it "
            "cannot pay them" + ("" if charged else "; nothing was charged"),
            hint="ask again shortly: the gateway buys credits as it runs low",
        )
        self.needed = needed
        self.held = held

    def uncharged(self) -> GatewayOutOfCredits:
        """The same refusal, saying the user was charged nothing (nothing was delivered)."""
        return GatewayOutOfCredits(self.needed, self.held, charged=False)


class Stock(Protocol):
    def count(self) -> int: ...


def session_positions(prompt: int, max_tokens: int, lookahead: int = 0) -> int:
    """The most positions one session of a question sends every hop: the prompt, then for the
    c-th chosen token (c = 1 … max_tokens − 1, the last one is never fed back) one pass of the
    token and at most min(lookahead, max_tokens − c − 1) guesses (node/client/failover.py)."""
    decode = sum(1 + min(lookahead, max_tokens - c - 1) for c in range(1, max_tokens))
    return prompt + decode


def circuit_credits(prices: Sequence[int], positions: int) -> int:
    """Credits a circuit whose hops ask a credit per `prices[i]` positions (0: free) costs for
    `positions` positions at every hop."""
    return sum(-(-positions // price) for price in prices if price > 0)


@dataclass
class CreditReserve:
    """The credits of the wallet that questions hold: `free()` is what nobody holds."""

    wallet: Stock
    reserved: int = 0  # Σ `held` over the open holds
    holds: set[CreditHold] = field(default_factory=set)

    def free(self) -> int:
        return self.wallet.count() - self.reserved

    def hold(self) -> CreditHold:
        hold = CreditHold(self)
        self.holds.add(hold)
        return hold


@dataclass(eq=False)
class CreditHold:
    """One question's reservation (see the module docstring)."""

    reserve: CreditReserve
    held: int = 0  # credits reserved for it and not yet taken
    drawn: int = 0  # credits taken out of the wallet for its nodes: the gateway paid them
    released: bool = False

    def cover(self, needed: int) -> None:
        """Hold at least `needed` credits from now on (a circuit about to be used); the wallet's
        unheld credits make up the difference, or GatewayOutOfCredits and nothing more held."""
        if self.released:
            raise RuntimeError("cover() after the hold was released")
        extra = needed - self.held
        if extra <= 0:
            return
        free = self.reserve.free()
        if free < extra:
            log.warning(
                "credit wallet cannot hold a question's credits: needs %d more, %d unheld "
                "(%d held by questions in flight)",
                extra,
                free,
                self.reserve.reserved,
            )
            raise GatewayOutOfCredits(extra, max(free, 0))
        self.reserve.reserved += extra
        self.held += extra

    def draw(self, count: int, take: Callable[[int], list[PaidCredit]]) -> list[PaidCredit]:
        """`count` credits out of the wallet (`take`) for this question's nodes: what it holds
        first, unheld credits past that; GatewayOutOfCredits, nothing taken, when short."""
        if self.released:
            raise RuntimeError("draw() after the hold was released")
        from_hold = min(count, self.held)
        beyond = count - from_hold
        if beyond and self.reserve.free() < beyond:
            raise GatewayOutOfCredits(beyond, max(self.reserve.free(), 0))
        try:
            credits = take(count)
        except ProtocolError:  # the wallet holds fewer than its holds (credits expired)
            raise GatewayOutOfCredits(count, self.reserve.wallet.count()) from None
        self.held -= from_hold
        self.reserve.reserved -= from_hold
        self.drawn += count
        return credits

    def release(self) -> bool:
        """Give back what is still held; True the first time, False (nothing done) after."""
        if self.released:
            return False
        self.released = True
        self.reserve.reserved -= self.held
        self.held = 0
        self.reserve.holds.discard(self)
        return True


# the hold of the question the running task serves (set by node/gateway/app.py around it): the
# circuit clients are shared between questions, so a pay finds its question here
CURRENT_HOLD: ContextVar[CreditHold | None] = ContextVar("planet_credit_hold", default=None)


@dataclass(frozen=True)
class CircuitCover:
    """`RouterCircuits`' check before a circuit is used: its question's hold covers one session
    at every charging hop of it (prices from the router's /info reads)."""

    hold: CreditHold
    prices: Mapping[str, int]
    positions: int  # `session_positions` of the question

    def __call__(self, endpoints: Sequence[str]) -> None:
        prices = [max(0, int(self.prices.get(url, 0))) for url in endpoints]
        self.hold.cover(circuit_credits(prices, self.positions))
