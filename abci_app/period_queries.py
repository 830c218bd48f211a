"""Credit key period queries (committed state): a period's DKG run and key, its buyers.

/credit_period  ?period   (default: the key period of the next block) {period,
                          current_period, committed_height, key_period_blocks, dkg_phase_blocks,
                          run: null | {session, receivers [[address, pub_key]], threshold,
                          start, finish, result, deals {dealer: hex}, complaints [[dealer,
                          receiver]], justifications [[dealer, receiver, share]]},
                          buyers}: `result` is null while the run goes on, {key, commitments,
                          public_shares {address: hex}, qualified, threshold} once formed,
                          {failed: reason} when too few dealers qualified; `buyers` is the
                          period's anonymity set so far: distinct payers of its funded mints
                          (`planet credits buy --min-anonymity` reads it)
"""

from __future__ import annotations

from typing import Any

from abci_app import credit_dkg, schema
from abci_app.query_params import int_param
from abci_app.state import State

MAX_PERIOD = (1 << 63) - 1


def buyers(read: Any, period: int) -> int:
    """Distinct payers with a funded mint of `period` (`cbuyers/<period>`), through `read`."""
    return int(read(schema.CREDIT_PERIOD_BUYERS, schema.epoch_key(period)) or 0)


def credit_period(state: State, params: dict[str, Any]) -> Any:
    plan = credit_dkg.schedule(state)
    current = plan.period_of(state.height + 1)
    period = int_param(params, "period", current, 0, MAX_PERIOD)
    period = current if period is None else period
    record = state.committed(schema.CREDIT_DKG, schema.epoch_key(period))
    run = None
    if record is not None:
        run = {**record, **credit_dkg.messages(state.committed_items, period, record["attempt"])}
        run["deals"] = {str(k): v for k, v in run["deals"].items()}
    return {
        "period": period,
        "current_period": current,
        "committed_height": state.height,
        "key_period_blocks": plan.period_blocks,
        "dkg_phase_blocks": plan.phase_blocks,
        "run": run,
        "buyers": buyers(state.committed, period),
    }
