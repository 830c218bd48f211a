"""The compute nodes' pay at the epoch close (issue 42, "credits that hold"; docs/credits.md,
*What a node is paid*).

A node's `credit_redeem` (credits.py) owes the credits' price to its epoch (`cdue/`) and adds
the count to `credit/<epoch>/<node's EVM address>/<shard>/<model>`. The close of that epoch
(settlement.py) takes the records here:

- each node's account is paid its credits at face value less the verifiers' cut,
  `⌊credits · credits.price_wei · (10,000 − verifier_cut_bps) / 10,000⌋` (per account, over
  all its shards and models; `shares.payouts.net_of_cut`): a *direct* row on the epoch's pool
  pages (`shares.settlement.close_epoch_pages(direct=…)`), outside the share table, like an
  overlay relay's (relay_payouts.py). No weight and no scarcity bonus: what a node is paid
  for a credit never depends on who else worked in the epoch, so a node that buys credits and
  redeems them itself gets back (1 − cut) of what it paid, never more, and never any part of
  another node's pay. The rest of the credits' price (the verifiers' part, rounding included)
  is left in the draw for the verifiers' table;
- when the draw falls short of the rows (after the relays'), what it holds for the nodes is
  split over them by their rows (largest remainder, `shares.payouts.split_pro_rata`) and the
  rest stays due to the next epoch;
- an account slashed in the epoch is paid nothing: its credits are counted as `forfeit`,
  whose price the close does not draw (it stays in the credit pool);
- a close that draws nothing for the nodes (an empty pool, or a draw left off the close's
  pages) moves their credits to the next epoch once (`carried`); credits moved in before are
  dropped then (their price stays due, as a relay's).

Every function is deterministic: integers and sorted keys only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from abci_app import schema
from abci_app.state import State
from shares.payouts import net_of_cut, rows_out_of

MAX_LAYER_TOKENS = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class NodeEarnings:
    """What an epoch's nodes redeemed: credits per account (slashed ones left out), the
    credits of slashed accounts (`forfeit`), the records (for `carry_forward`), the price and
    the verifiers' cut."""

    credits: dict[str, int]
    forfeit: int
    records: tuple[dict[str, Any], ...]
    price: int
    cut_bps: int

    @property
    def face(self) -> int:
        """Wei the nodes' credits cost their payers: every credit at the credit's price."""
        return sum(self.credits.values()) * self.price

    def net(self) -> dict[str, int]:
        """Each account's row in full: its credits' price less the verifiers' cut."""
        return {
            account: net_of_cut(count * self.price, self.cut_bps)
            for account, count in self.credits.items()
        }

    @property
    def owed(self) -> int:
        """Wei the nodes' rows come to in full (≤ `face`; the difference is the verifiers')."""
        return sum(self.net().values())

    def rows(self, drawn: int) -> tuple[tuple[str, int], ...]:
        """The nodes' rows out of `drawn` wei (≤ `owed`): each in full when it covers them,
        else split by their full rows; zero amounts get no row."""
        return rows_out_of(drawn, self.net())


def take(state: State, epoch: int, slashed: set[str]) -> NodeEarnings:
    """The epoch's redemption records, deleted (the close pays or moves them)."""
    credits: dict[str, int] = {}
    forfeit = 0
    records = []
    for key, record in state.items(schema.CREDIT, *schema.epoch_range(epoch)):
        state.delete(schema.CREDIT, key)
        records.append(record)
        account = record["account"]
        if account in slashed:
            forfeit += record["credits"]
        elif record["credits"] > 0:
            credits[account] = credits.get(account, 0) + record["credits"]
    genesis = state.genesis
    return NodeEarnings(
        credits,
        forfeit,
        tuple(records),
        genesis.credit_price_wei or 0,
        genesis.verifier_cut_bps,
    )


def carry_forward(state: State, epoch: int, earnings: NodeEarnings) -> None:
    """The credits the close of `epoch` paid nothing for move to epoch + 1 once (merged per
    account and shard, marked `carried`), so redeemed work is not lost to one empty close;
    credits moved in before are dropped (their price stays due), as are a slashed account's."""
    for credit in earnings.records:
        own = credit["credits"] - credit.get("carried", 0)
        if credit["account"] not in earnings.credits or own <= 0:
            continue
        key = schema.credit_key(epoch + 1, credit["account"], credit["model"], credit["shard"])
        later = state.get(schema.CREDIT, key) or {}
        tokens = own * state.genesis.credit_layer_tokens + later.get("layer_tokens", 0)
        state.put(
            schema.CREDIT,
            key,
            {
                "account": credit["account"],
                "model": credit["model"],
                "shard": credit["shard"],
                "credits": own + later.get("credits", 0),
                "layer_tokens": min(tokens, MAX_LAYER_TOKENS),
                "carried": own + later.get("carried", 0),
            },
        )
