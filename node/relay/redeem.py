"""A relay redeems what it was paid (issue 43): the credits it holds (node/relay/earnings.py) go
to the committee as `relay_redeem` txs (abci_app/relay_credits.py), MAX_REDEEM a tx.

    redeemed = await redeem_held(link, earnings)         one pass (`planet relay redeem`)
    await keep_redeeming(link, earnings, stop)           while `planet relay serve` runs

The chain refuses a whole tx for one bad credit and names it (`credit <i>: …`). A credit
refused for good — CREDIT_SPENT (another party redeemed it first: a client that gave one
credit twice), CREDIT_INVALID (forged, or under no committee key), CREDIT_LOCKED (a node locked
it), CREDIT_EPOCH (outside its window) — is dropped with one log line naming the code, and
the rest are sent again at once. Anything else (the committee unreachable, a refusal of the
relay itself: not registered, LEFT) keeps every credit for the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from node.chain.committee_rpc import TxRejectedError
from node.relay.earnings import Earnings
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import MAX_REDEEM
from protocol.committee.relay_credits import RelayRedeem
from protocol.errors import RemoteError, UnavailableError
from protocol.paid_credits import AssignedCredit

log = logging.getLogger(__name__)

OK: Final = 0
# FinalizeBlock codes (abci_app/codes.py) that refuse one named credit for good
REFUSED_FOR_GOOD: Final = {
    77: "CREDIT_INVALID",
    78: "CREDIT_SPENT",
    79: "CREDIT_EPOCH",
    86: "CREDIT_LOCKED",
    102: "CREDIT_NOT_ASSIGNED",
}
REDEEM_EVERY_S: Final = 5.0
_ITEM = re.compile(r"credit (\d+):")


class Link(Protocol):
    async def send(self, body: Any, *, timeout_s: float = ...) -> tuple[int, str]: ...


@dataclass
class Redeemed:
    """One pass: credits the chain took, and those it refused for good by name."""

    credits: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, name: str) -> None:
        self.refused[name] = self.refused.get(name, 0) + 1


async def redeem_held(link: Link, earnings: Earnings, *, timeout_s: float = 20.0) -> Redeemed:
    done = Redeemed()
    batch = one_form(earnings.pending()[:MAX_REDEEM])
    while batch:
        assignments = tuple(c.assignment for c in batch if isinstance(c, AssignedCredit))
        body = RelayRedeem(tuple(batch), assignments)
        try:
            code, text = await link.send(body, timeout_s=timeout_s)
        except TxRejectedError as error:  # CheckTx: the relay itself (nonce, signature, …)
            code, text = error.tx_code, error.log_text
        if code == OK:
            earnings.settle(batch)
            done.credits += len(batch)
        else:
            item = _ITEM.search(text)
            name = REFUSED_FOR_GOOD.get(code)
            if item is None or int(item.group(1)) >= len(batch) or name is None:
                log.warning("relay: redemption refused code=%d: %s (kept)", code, text)
                return done
            bad = batch[int(item.group(1))]
            log.info("relay: credit refused %s by the committee: %s", name, text)
            earnings.settle([bad])
            done.refuse(name)
        batch = one_form(earnings.pending()[:MAX_REDEEM])
    return done


def one_form(batch: list[ThresholdCredit]) -> list[ThresholdCredit]:
    """The longest prefix of `batch` whose credits all carry assignments, or all do not."""
    if not batch:
        return batch
    bound = isinstance(batch[0], AssignedCredit)
    for index, credit in enumerate(batch):
        if isinstance(credit, AssignedCredit) != bound:
            return batch[:index]
    return batch


async def keep_redeeming(
    link: Link, earnings: Earnings, stop: asyncio.Event, every_s: float = REDEEM_EVERY_S
) -> None:
    """Redeem what the relay holds every `every_s` until `stop` (and once more then)."""
    while True:
        stopping = stop.is_set()
        if earnings.pending():
            try:
                done = await redeem_held(link, earnings)
                if done.credits or done.refused:
                    log.info("relay: redeemed %d credits (refused %s)", done.credits, done.refused)
            except (UnavailableError, RemoteError) as error:
                log.warning("relay: committee not reached to redeem: %s", error.message)
        if stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
