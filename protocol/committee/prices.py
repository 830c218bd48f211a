"""The price tx: what one credit buys on a compute node's shard, registered on the chain.

    set_price{model, shard, positions}   a compute node registers how many positions of
                                         (`model`, `shard`) one bearer credit buys there
                                         (0: free, the node takes no credits); a first
                                         registration counts from its own epoch, a change
                                         from the next one

The chain's rules: `abci_app/prices.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import NAME, check

MAX_PRICE_POSITIONS = 2**31 - 1  # positions per credit: the bound `--credit-positions` takes


@dataclass(frozen=True, slots=True)
class SetPrice:
    """A compute node's price on (`model`, `shard`): positions one credit buys (0: free)."""

    model: str
    shard: int
    positions: int

    TYPE: ClassVar[str] = "set_price"

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "positions": self.positions, "shard": self.shard}

    @classmethod
    def from_json(cls, body: Any) -> SetPrice:
        b = check.exact_object(body, "body", {"model", "positions", "shard"})
        return cls(
            model=check.text(b["model"], "body.model", NAME),
            shard=check.integer(b["shard"], "body.shard", 0, 65535),
            positions=check.integer(b["positions"], "body.positions", 0, MAX_PRICE_POSITIONS),
        )


# what a new paid node charges when no node of its model has registered a price yet (a credit
# per 64 positions: one question of a few dozen tokens costs each hop a credit or two)
DEFAULT_PRICE_POSITIONS = 64


def going_price(prices: list[int]) -> int:
    """The median of the positive `prices` (lower middle), else `DEFAULT_PRICE_POSITIONS`: the
    going price of a model, from every current price of its `/prices` pages."""
    positive = sorted(p for p in prices if p > 0)
    if not positive:
        return DEFAULT_PRICE_POSITIONS
    return positive[(len(positive) - 1) // 2]
