"""A key period's anonymity set as the chain counts it: the distinct payers of its funded mints.

    cbuyer/<period>/<payer>   the height of the payer's first funded mint of that period
    cbuyers/<period>          how many such payers (what `/credit_period` answers as `buyers`)

A credit names its key period only, so whoever sees a redemption learns "one of this period's
buyers" and no more (docs/privacy.md). Kept while the period's credits can be redeemed (pruned
with the period's issue epoch + lifetime, when its credits' window is over).
"""

from __future__ import annotations

from abci_app import rules, schema
from abci_app.state import State


def note(state: State, period: int, payer: str, issue_epoch: int) -> None:
    """Count `payer` among `period`'s buyers (once); kept until its credits' window ends
    (`issue_epoch` + lifetime)."""
    key = f"{schema.epoch_key(period)}/{payer}"
    if state.get(schema.CREDIT_PERIOD_BUYER, key) is not None:
        return
    state.put(schema.CREDIT_PERIOD_BUYER, key, state.block_height)
    count_key = schema.epoch_key(period)
    count = int(state.get(schema.CREDIT_PERIOD_BUYERS, count_key) or 0) + 1
    state.put(schema.CREDIT_PERIOD_BUYERS, count_key, count)
    until = issue_epoch + state.genesis.credit_lifetime_epochs
    rules.track_at(state, schema.CREDIT_PERIOD_BUYER, key, until)
    rules.track_at(state, schema.CREDIT_PERIOD_BUYERS, count_key, until)
