"""What `planet join` charges: the node's price, positions per bearer credit on its shard.

    price = join_price(args.credit_positions, args.free, lambda: going_price(config, model))

A credit is what a client pays a node for its work; the price is how many positions (prompt
tokens plus generated tokens, counted per shard the node serves) one credit buys there. It is
registered on the committee chain by the node's agent (abci_app/prices.py): clients pay what
the chain says, a redemption of N credits needs N × price committed served positions, and a
change counts from the next epoch. Without a price flag a node charges the pool's going price
(the median of the prices registered for the model, or the default when none is); free only
when asked (`--free`, or `--credit-positions 0`): a free node is paid by nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from protocol.committee.prices import MAX_PRICE_POSITIONS
from protocol.committee.prices import going_price as going_price_of
from protocol.errors import UsageError
from protocol.fields import is_int


def join_price(credit_positions: int | None, free: bool, going: Callable[[], int]) -> int:
    """The price to register: `--free` → 0, `--credit-positions N` → N, else `going()`."""
    if credit_positions is not None and not 0 <= credit_positions <= MAX_PRICE_POSITIONS:
        raise UsageError(
            f"--credit-positions must be 0 (free) or a positive count of positions, at most "
            f"{MAX_PRICE_POSITIONS}"
        )
    if free:
        if credit_positions:
            raise UsageError(
                f"--free and --credit-positions {credit_positions} disagree",
                hint="drop one: --free serves without pay, --credit-positions N charges",
            )
        return 0
    if credit_positions is not None:
        return credit_positions
    return going()


def going_from_rows(rows: list[dict[str, Any]]) -> int:
    """The going price (`protocol.committee.prices.going_price`: the median of the positive
    current prices, else the default) of every `/prices` row of a model; a row's `positions`
    that is not an integer within `MAX_PRICE_POSITIONS` counts as no price."""
    current = [row.get("positions") for row in rows]
    return going_price_of([p for p in current if is_int(p, 0, MAX_PRICE_POSITIONS)])


def going_price(committee_rpc: str, model_hash: str) -> int:
    """The model's going price on the committee chain, from every page of `/prices?model=`
    (`read_prices`); a malformed page or a list past `PRICE_PAGES` pages is a `UsageError`
    naming it (`bad_page`, `too_many_pages`) whose hint says to name the price."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.chain.committee_pages import BadPage, TooManyPages, read_prices

    async def read() -> list[dict[str, Any]]:
        link = CommitteeLink([committee_rpc])
        try:
            return await read_prices(link.query, model=model_hash)
        finally:
            await link.close()

    try:
        return going_from_rows(asyncio.run(read()))
    except (BadPage, TooManyPages) as error:
        raise UsageError(
            f"the committee's price list is unreadable ({error.code}): {error.message}",
            hint="name the price yourself: --credit-positions N (or --free)",
        ) from None
