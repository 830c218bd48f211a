"""The hosted gateway pays the compute nodes that charge with its own bearer credits.

    payer = HostedPayer(CreditWallet(config.credits_path), router.prices, min_positions=16)
    Gateway(..., payer=payer)        each circuit client pays its charging hops as answers run

The same payment as the personal client's (node/client/paying.py: a credit per chunk of
positions per charging hop, never dearer than the floor; free nodes are not paid), with the
gateway's wallet, which its top-up task keeps stocked (node/gateway/topup.py). Its users pay the
gateway as before (deposits, vouchers, payment keys: payments.py), never the nodes.

When the wallet cannot pay the next chunk, the question fails with `GatewayOutOfCredits`: 503
`gateway_out_of_credits` (the user's payment is fine, the gateway is short), and its payment
state machine releases the user's hold when nothing was delivered (payment_state.py): the
nodes are never worked unpaid, the user is never charged for an answer they did not get.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from node.client.paying import MIN_POSITIONS, CreditPayer, OutOfCreditsError
from protocol.credits import Credit
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

# The hosted gateway's defaults (`planet gateway serve` flags; light to import for its --help)
MIN_CREDIT_POSITIONS = MIN_POSITIONS  # the floor: never a credit per fewer positions (16)
TOP_UP_BELOW = 100  # credits: the top-up buys when the wallet holds fewer (topup.py)
TOP_UP = 300  # credits bought per top-up, in mints of at most MAX_BUY (30)
MAX_TOP_UP = 100_000  # the most `--top-up` takes


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


@dataclass
class HostedPayer(CreditPayer):
    """A `CreditPayer` whose empty wallet is the gateway's shortfall, not its user's."""

    def take(self, owed: list[int]) -> list[list[Credit]]:
        try:
            return super().take(owed)
        except OutOfCreditsError:
            needed, held = sum(owed), self.wallet.count()
            log.warning(
                "credit wallet cannot pay the nodes: a question needs %d credits, %d held in %s; "
                "the question fails and is charged only what was delivered (see the top-up's "
                "lines: --top-up-below, --top-up)",
                needed,
                held,
                self.wallet.path,
            )
            raise GatewayOutOfCredits(needed, held) from None
