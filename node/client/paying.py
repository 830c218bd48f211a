"""Paying the nodes of a circuit with bearer credits as the answer runs (issue 28).

    payer = CreditPayer(CreditWallet(path), {hop.url: info["credit_positions"], ...})
    CircuitClient(hops, ..., payer=payer)

A node that charges (`credit_positions` > 0 in its /info; node/server/payments.py) computes a
session's positions only while credits paid for that session cover them. Before the client
sends a frame it pays every charging hop, on the client's own link to that hop, enough credits
to cover every position sent so far plus the frame's: one `pay` per credit, `positions` each
(protocol/stream.py). So the client is at most one credit per hop ahead of the work, and a node
never works unpaid. A free hop (0, or not listed) is never paid.

Credits are taken out of the wallet file before they are sent (a credit shown to a node is the
node's: a client that died after sending must not show it to another node, whose redemption
would then fail). A session that fails keeps what it paid: a failover's replay is paid again
on the new session (at most one credit per hop lost per failure).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from node.client.credit_wallet import CreditWallet
from protocol.credits import Credit
from protocol.errors import ProtocolError


class OutOfCreditsError(ProtocolError):
    """The credit wallet has no credit left to pay the circuit's nodes with."""

    code = "out_of_credits"

    def __init__(self, needed: int, held: int) -> None:
        super().__init__(
            f"the nodes ask for {needed} more credits and the credit wallet holds {held}",
            hint="buy credits with `planet credits buy N` (see `planet credits show`)",
        )


@dataclass
class CreditPayer:
    """The wallet credits come from, and each charging node's price (positions per credit)."""

    wallet: CreditWallet
    prices: Mapping[str, int]  # node URL → positions one credit pays for (0: free)
    spent: int = 0  # credits sent to nodes by this payer
    _paid: dict[tuple[int, int], int] = field(default_factory=dict)  # (sid, hop) → positions

    def price(self, url: str) -> int:
        return max(0, int(self.prices.get(url, 0)))

    def due(self, sid: int, urls: list[str], used: int) -> list[int]:
        """Per hop, how many credits to send so that `used` positions of `sid` are paid."""
        owed = []
        for index, url in enumerate(urls):
            price = self.price(url)
            paid = self._paid.get((sid, index), 0)
            owed.append(0 if price == 0 or paid >= used else -(-(used - paid) // price))
        return owed

    def take(self, owed: list[int]) -> list[list[Credit]]:
        """Take the credits `owed` per hop out of the wallet at once (OutOfCreditsError, and
        nothing taken, when it holds fewer)."""
        needed = sum(owed)
        if not needed:
            return [[] for _ in owed]
        try:
            credits = self.wallet.take(needed)
        except ProtocolError:
            raise OutOfCreditsError(needed, self.wallet.count()) from None
        self.spent += needed
        out, at = [], 0
        for count in owed:
            out.append(credits[at : at + count])
            at += count
        return out

    def paid(self, sid: int, index: int, url: str, credits: int) -> None:
        key = (sid, index)
        self._paid[key] = self._paid.get(key, 0) + credits * self.price(url)

    def forget(self, sid: int) -> None:
        for key in [k for k in self._paid if k[0] == sid]:
            del self._paid[key]
