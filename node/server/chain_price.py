"""A charging node charges the price it registered on the committee chain, not its own flag.

    follow_chain_price(app, node_key_hex, model_hash, shard)   (node/server/run.py)

Its agent registers `--credit-positions` (`set_price`, abci_app/prices.py); a first price counts
at once, a change from the next epoch. Clients pay what the chain says for the current epoch, so
the node does too: every `REFRESH_S` it reads its own price (`/prices?model=&node=`, every page:
`read_prices`) and, once the chain has one above 0, a credit taken from then on pays for that
many positions (`Payments.positions`, also its `/info` `credit_positions`). Until the chain has
a price (the agent has not registered it yet) the flag's price stands, and no client pays it: a
node with no price on the chain is not routed while it charges, a payer refuses it
`price_unregistered`, and the chain redeems nothing there (`REDEMPTION_UNPRICED`). A node
restarted with a raised price mid-epoch is paid the registered one until the epoch ends, and its
sessions are never stopped for paying what the chain asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from node.chain.committee_pages import read_prices
from node.server.span_payments import payment_parts
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

REFRESH_S = 5.0


def current_price(answer: Any, node: str, shard: int) -> int | None:
    """The price `node` has on `shard` in the epoch a `/prices` answer is for (None: none)."""
    rows = answer.get("prices") if isinstance(answer, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("node") == node and row.get("shard") == shard:
            value = row.get("positions")
            return value if type(value) is int else None
    return None


async def refresh(state: Any, link: Any, node: str, model: str, shard: int) -> None:
    """Once: the chain's current price of (node, shard) into `state.payments.positions`."""
    rows = await read_prices(link.query, model=model, node=node)  # every page
    for own, payments in payment_parts(state.payments, shard).items():  # a span: each shard's
        price = current_price({"prices": rows}, node, own)
        if price is not None and price > 0 and price != payments.positions:
            log.info(
                "price on the chain: shard %d, %d positions per credit (was %d)",
                own,
                price,
                payments.positions,
            )
            payments.positions = price


def follow_chain_price(app: Any, node: str, model: str, shard: int) -> None:
    """With payments installed (`install_payments`, which must come first): follow the chain."""
    from node.chain.committee_link import CommitteeLink
    from node.server.state import CONFIG_KEY, STATE_KEY

    async def lifetime(_app: Any) -> AsyncIterator[None]:
        config = app[CONFIG_KEY]
        link = CommitteeLink([config.committee_rpc])

        async def loop() -> None:
            while True:
                try:
                    await refresh(app[STATE_KEY], link, node, model, shard)
                except (PlanetError, KeyError, TypeError, ValueError) as error:
                    log.debug("price not read: %r", error)
                await asyncio.sleep(REFRESH_S)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()

    app.cleanup_ctx.append(lifetime)
