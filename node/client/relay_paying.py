"""What pays the relays of a client's overlay paths (issue 43; docs/overlay.md "Relays are
paid"): the chain's rate and the user's credit wallet, shared by every link of the client.

    purse = RelayPurse(rate, CreditWallet(path).take, CreditWallet(path).add)
    OverlayRoute(relays, ..., purse=purse)        each link pays its paths' relays

The rate is the committee's (`/credit_keys` relay_bytes: genesis `credits.relay_bytes`), read
once at start (`read_rate`), never a relay's own word. A link (node/client/overlay.py) pays a
path's relays floor((forward clove bytes the node acknowledged + backward clove bytes that
came back) / rate) credits each, less what it paid them before, each relay in a PAY cell
inside its own layer (`protocol.relay_pay`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.blind_bls import ThresholdCredit
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)


class RelayRateError(ProtocolError):
    code = "relay_rate_invalid"


@dataclass
class RelayPurse:
    """Credits for relays: `take(n)` removes n from the wallet (ProtocolError when short),
    `give_back` returns credits a PAY cell could not carry. `paid` counts the credits given per
    relay URL over the client's life (for logs and tests)."""

    rate: int
    take: Callable[[int], list[ThresholdCredit]]
    give_back: Callable[[Sequence[ThresholdCredit]], None]
    paid: dict[str, int] = field(default_factory=dict)
    short: bool = False  # the wallet ran short once: said once in the log

    def draw(self, n: int) -> list[ThresholdCredit] | None:
        try:
            credits = self.take(n)
        except ProtocolError as error:
            if not self.short:
                log.warning("overlay: relays not paid, the credit wallet is short: %s", error)
            self.short = True
            return None
        self.short = False
        return credits

    def note(self, url: str, n: int) -> None:
        self.paid[url] = self.paid.get(url, 0) + n


def parse_rate(answer: Any) -> int:
    """The relay rate from a `/credit_keys` answer (RelayRateError naming what is wrong)."""
    rate = answer.get("relay_bytes") if isinstance(answer, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 1 << 40:
        raise RelayRateError(f"/credit_keys relay_bytes: {rate!r} is not a rate in [1, 2^40]")
    return rate


async def read_rate(query: Callable[[str], Awaitable[Any]]) -> int:
    """The chain's relay rate (clove bytes a credit pays a relay for)."""
    return parse_rate(await query("/credit_keys"))
