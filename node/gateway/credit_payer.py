"""The hosted gateway pays the compute nodes that charge with its own bearer credits.

    payer = HostedPayer(CreditWallet(config.credits_path), router.prices, min_positions=16)
    Gateway(..., payer=payer)        each circuit client pays its charging hops as answers run

The same payment as the personal client's (node/client/paying.py: a credit per chunk of
positions per charging hop, never dearer than the floor; free nodes are not paid), with the
gateway's wallet, which its top-up task keeps stocked (node/gateway/topup.py). Its users pay the
gateway as before (deposits, vouchers, payment keys: payments.py), never the nodes.

Before a question uses a circuit it holds the credits that circuit can cost it
(node/gateway/credit_holds.py: `HostedPayer.hold()`, `CURRENT_HOLD`): when the wallet's unheld
credits cannot cover them, the question fails with `GatewayOutOfCredits` — 503
`gateway_out_of_credits` (the user's payment is fine, the gateway is short) — before anything
is sent to that circuit's nodes, and the user is charged nothing. Where a question still runs
past its hold (a failover, a price change, credits expired under the holds) and the wallet is
dry, it fails the same way, and its user is charged for the prompt and the tokens its nodes
computed, which the answer hands over (node/gateway/app.py): the nodes are never worked
unpaid, the gateway never pays for an answer nobody pays for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from node.client.paying import CreditPayer, split
from node.gateway.credit_holds import (
    CURRENT_HOLD,
    CreditHold,
    CreditReserve,
    GatewayOutOfCredits,
)
from protocol.paid_credits import PaidCredit

log = logging.getLogger(__name__)


@dataclass
class HostedPayer(CreditPayer):
    """A `CreditPayer` whose empty wallet is the gateway's shortfall, not its user's, and whose
    credits questions hold before they start (`reserve`, credit_holds.py): a pay made for a
    question draws on that question's hold (`CURRENT_HOLD`), any other pay only on credits
    nobody holds."""

    reserve: CreditReserve = field(init=False)

    def __post_init__(self) -> None:
        self.reserve = CreditReserve(self.wallet)

    def hold(self) -> CreditHold:
        """A new, empty hold for one question (release it on every exit)."""
        return self.reserve.hold()

    def take(self, owed: list[int]) -> list[list[PaidCredit]]:
        needed = sum(owed)
        if not needed:
            return [[] for _ in owed]
        hold = CURRENT_HOLD.get()
        try:
            if hold is None:
                hold = self.reserve.hold()  # a pay for no question: unheld credits only
                try:
                    credits = hold.draw(needed, self.wallet.take)
                finally:
                    hold.release()
            else:
                credits = hold.draw(needed, self.wallet.take)
        except GatewayOutOfCredits:
            log.warning(
                "credit wallet cannot pay the nodes: a question needs %d credits, %d held in %s "
                "(%d of them held for other questions); the question fails and is charged for "
                "what its nodes computed (see the top-up's lines: --top-up-below, --top-up)",
                needed,
                self.wallet.count(),
                self.wallet.path,
                self.reserve.reserved,
            )
            raise
        self.spent += needed
        return split(credits, owed)
