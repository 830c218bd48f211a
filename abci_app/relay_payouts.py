"""The overlay relays' pay at the epoch close (issue 43; docs/overlay.md, *Relays are paid*).

A relay's `relay_redeem` (relay_credits.py) owes the credits' price to its epoch (`cdue/`, as
a node's `credit_redeem`) and adds the count to `rpay/<epoch>/<relay's EVM address>`. The
close of that epoch (settlement.py) takes the records here:

- each relay's account is paid `credits · genesis credits.price_wei`, the price the pool
  received for each of them and the price a node's redemption owes: a *direct* row on the
  epoch's pool page (`shares.settlement.close_epoch_pages(direct=…)`), outside the share
  table (no verifiers' cut: a relay's credit is not a layer-token), merged with the nodes'
  rows (node_payouts.py) and the verifiers', so the page's total is still the sum of its rows;
- the draw pays the relays first (`rows`): when the pool holds less than is due, what it holds
  is split over the relays by credits (largest remainder, `shares.payouts.split_pro_rata`) and
  the rest stays due to the next epoch, as a node's row would;
- an account slashed in the epoch is paid nothing: its credits are counted as `forfeit`, whose
  price the close does not draw (it stays in the credit pool), as a slashed node's;
- a close that draws nothing for the relays (an empty pool, or a draw left off the close's
  pages) moves their credits to the next epoch once, as a node's (`carried`).

Every function is deterministic: integers and sorted keys only.
"""

from __future__ import annotations

from dataclasses import dataclass

from abci_app import schema
from abci_app.relay_credits import add_pay
from abci_app.state import State
from shares.payouts import rows_out_of


@dataclass(frozen=True, slots=True)
class RelayEarnings:
    """What an epoch's relays redeemed: credits per account (slashed ones left out, ascending)
    and the part of each moved in from the epoch before; `forfeit`: the credits of slashed
    accounts."""

    credits: dict[str, int]
    carried: dict[str, int]
    price: int
    forfeit: int = 0

    @property
    def owed(self) -> int:
        """Wei the relays are due: every credit at the credit's price."""
        return sum(self.credits.values()) * self.price

    def rows(self, drawn: int) -> tuple[tuple[str, int], ...]:
        """The relays' rows out of `drawn` wei (≤ `owed`): each in full when it covers them,
        else split by credits; zero amounts get no row."""
        return rows_out_of(drawn, {a: count * self.price for a, count in self.credits.items()})


def take(state: State, epoch: int, slashed: set[str]) -> RelayEarnings:
    """The epoch's relay records, deleted (the close pays or moves them)."""
    credits: dict[str, int] = {}
    carried: dict[str, int] = {}
    forfeit = 0
    for key, record in state.items(schema.RELAY_PAY, *schema.epoch_range(epoch)):
        state.delete(schema.RELAY_PAY, key)
        account = record["account"]
        if account in slashed:
            forfeit += max(record["credits"], 0)
            continue
        if record["credits"] <= 0:
            continue
        credits[account] = record["credits"]
        carried[account] = record.get("carried", 0)
    return RelayEarnings(credits, carried, state.genesis.credit_price_wei or 0, forfeit)


def carry_forward(state: State, epoch: int, earnings: RelayEarnings) -> None:
    """Credits the close of `epoch` did not pay move to epoch + 1 once: those moved in before
    are dropped (their price stays due, as a node's carried work)."""
    for account, count in sorted(earnings.credits.items()):
        own = count - earnings.carried.get(account, 0)
        if own > 0:
            add_pay(state, epoch + 1, account, own, carried=own)
