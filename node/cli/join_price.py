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

from protocol.committee.prices import DEFAULT_PRICE_POSITIONS, MAX_PRICE_POSITIONS
from protocol.errors import UsageError


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


def going_from_answer(answer: Any) -> int:
    """The `going_price` of a committee `/prices` answer (the default when it has none)."""
    value = answer.get("going_price") if isinstance(answer, dict) else None
    if type(value) is int and 0 < value <= MAX_PRICE_POSITIONS:
        return value
    return DEFAULT_PRICE_POSITIONS


def going_price(committee_rpc: str, model_hash: str) -> int:
    """The model's going price on the committee chain (`/prices?model=`)."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    async def read() -> Any:
        link = CommitteeLink([committee_rpc])
        try:
            return await link.query("/prices", model=model_hash)
        finally:
            await link.close()

    return going_from_answer(asyncio.run(read()))
