"""The node's price on the committee chain: the agent registers what a credit buys on its shard
(`set_price`, abci_app/prices.py) and keeps the chain's latest registered price equal to it.

    keeper = PriceKeeper(link, model_hash, shard, positions=64)
    await keeper.step()     each agent pass: nothing once the chain holds this price (current or
                            scheduled for the next epoch); else one `set_price`, looked at again
                            a few passes later

The first price of a node counts at once; a change counts from the next epoch (the clients of
the current one pay what the chain said at its start), so a node restarted with another
`--credit-positions` is paid its old price until the epoch ends.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from node.chain.committee_pages import read_prices
from protocol.committee.prices import SetPrice

log = logging.getLogger(__name__)

RECHECK_PASSES = 5  # agent passes between a submitted `set_price` and the next look


class PriceLink(Protocol):
    signer: str

    async def query(self, path: str, **params: Any) -> Any: ...
    async def submit(self, body: Any) -> Any: ...


def registered_price(answer: Any, node: str, shard: int) -> int | None:
    """The latest price `node` registered on `shard` in a `/prices` answer (the pending change
    when there is one, else the current price); None when it registered none (or the answer
    does not have the committee's shape)."""
    rows = answer.get("prices") if isinstance(answer, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("node") != node or row.get("shard") != shard:
            continue
        pending = row.get("next")
        value = pending.get("positions") if isinstance(pending, dict) else row.get("positions")
        return value if type(value) is int else None
    return None


class PriceKeeper:
    def __init__(self, link: PriceLink, model: str, shard: int, positions: int) -> None:
        self.link = link
        self.model = model
        self.shard = shard
        self.positions = positions
        self.settled = False  # the chain holds `positions` as this node's latest price
        self._wait = 0

    async def step(self) -> None:
        if self.settled:
            return
        if self._wait > 0:
            self._wait -= 1
            return
        # every page of this node's prices (`read_prices`: a malformed page is `BadPage`)
        rows = await read_prices(self.link.query, model=self.model, node=self.link.signer)
        if registered_price({"prices": rows}, self.link.signer, self.shard) == self.positions:
            self.settled = True
            log.info(
                "price registered: %d positions per credit on shard %d", self.positions, self.shard
            )
            return
        await self.link.submit(SetPrice(self.model, self.shard, self.positions))
        self._wait = RECHECK_PASSES
