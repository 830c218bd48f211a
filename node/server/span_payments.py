"""A span hop is paid as its shards' hops: one `Payments` per shard of the span (its own price,
party, credit spool and lock marks), one account per shard in each session.

    payments = SpanPayments({1: Payments(...shard 1...), 2: Payments(...shard 2...)})
    await payments.accept(account, credit, shard)   the credit goes to `shard`'s account (a
                                                    `pay` names the shard; none: the first),
                                                    checked, spooled and locked as that
                                                    shard's node would (node/server/payments.py)
    await payments.cover(account, count)            every shard's account covers `count`
                                                    more positions (each waits for its `pay`)
    payments.refund / give_back                     on every shard's account

So a client pays a span hop the credits of each of its shards at each shard's registered price
(docs/compute.md, *Span hops*); the spools are `<credits base>/shard-K`, which the node agent
already redeems each on its shard (node/agent/credit_spools.py), and the chain holds each
shard's redemptions to the positions committed on that shard (the span commits each shard's
work as that shard: node/server/served.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.server.payments import Account, CreditRefusedError, Payments
from protocol.paid_credits import PaidCredit


class SpanPayments:
    """The `Payments` of each shard of a span, behind the interface the stream uses."""

    def __init__(self, parts: Mapping[int, Payments]) -> None:
        if not parts:
            raise ValueError("a span is paid per shard: give at least one")
        self.parts = dict(sorted(parts.items()))
        self.first = next(iter(self.parts))

    @property
    def positions(self) -> int:
        """The first shard's price (/info `credit_positions`; `shard_prices` has each)."""
        return self.parts[self.first].positions

    def shard_prices(self) -> dict[str, int]:
        return {str(shard): part.positions for shard, part in self.parts.items()}

    @property
    def wait_s(self) -> float:
        return self.parts[self.first].wait_s

    @property
    def accepted(self) -> int:
        return sum(part.accepted for part in self.parts.values())

    @property
    def refused(self) -> int:
        return sum(part.refused for part in self.parts.values())

    @property
    def double_spent(self) -> int:
        return sum(part.double_spent for part in self.parts.values())

    def _account(self, account: Account, shard: int) -> Account:
        own = account.parts.setdefault(shard, Account())
        if account.opened and not own.opened:  # the open went out: its credits are kept
            own.opened = True
            own.taken.clear()
        return own

    async def accept(self, account: Account, credit: PaidCredit, shard: int | None = None) -> None:
        shard = self.first if shard is None else shard
        part = self.parts.get(shard)
        if part is None:
            raise CreditRefusedError(
                f"this span serves shards {list(self.parts)}, not shard {shard}"
            )
        await part.accept(self._account(account, shard), credit)
        account.notify()

    async def cover(self, account: Account, count: int) -> None:
        covered: list[tuple[Payments, Account]] = []
        try:
            for shard, part in self.parts.items():
                own = self._account(account, shard)
                await part.cover(own, count)
                covered.append((part, own))
        except BaseException:
            for part, own in covered:
                part.refund(own, count)
            raise
        account.used += count

    def refund(self, account: Account, count: int) -> None:
        for shard, part in self.parts.items():
            part.refund(self._account(account, shard), count)
        account.used -= count

    def give_back(self, account: Account) -> list[PaidCredit]:
        returned: list[PaidCredit] = []
        for shard, part in self.parts.items():
            returned += part.give_back(self._account(account, shard))
        return returned


def payment_parts(payments: Any, shard: int) -> dict[int, Payments]:
    """Shard → its `Payments`: a span's each, else the node's one (on `shard`)."""
    if isinstance(payments, SpanPayments):
        return payments.parts
    return {} if payments is None else {shard: payments}
