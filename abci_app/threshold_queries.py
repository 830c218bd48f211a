"""This validator's partial signatures for a funded threshold mint, as it posted them.

/credit_partials  ?mint   {mint, period, validator, index, public_share, partials [hex]}: the set
                          s_i = x_i · B this validator posted on the chain for the mint
                          (`mint_partials`, verified there: abci_app/mint_partials.py; its watcher
                          posts it once the mint is funded, node/watcher/mint_signer.py).
                          MINT_UNFUNDED until the mint is funded, PARTIALS_NOT_POSTED while this
                          validator's set is not on the chain yet (ask again), MINT_SIGNING_CLOSED
                          once the mint is refunded, NOT_FOUND when the mint is not a threshold
                          mint or this validator holds no share of its period.

The route answers nothing that is not on the chain: a partial given off the chain would let a
client combine credits for a mint the chain then refunds (fewer than t sets posted by its
deadline). `/mint_partials` (credit_queries.py) lists every validator's posted set at once; this
route is kept for clients that ask each validator. It needs to know which validator it is, which
the key share held in `<home>/credit_shares/` says, so `app.py` serves it as a local route.
"""

from __future__ import annotations

from typing import Any

from abci_app import credit_dkg, schema
from abci_app.codes import Code
from abci_app.query_params import HASH32, QueryError, str_param
from abci_app.state import State
from protocol.credit_shares import CreditShareStore

PARTIALS_PATH = "/credit_partials"


def partials(state: State, store: CreditShareStore, params: dict[str, Any]) -> Any:
    identifier = str_param(params, "mint", HASH32)
    if identifier is None:
        raise QueryError(Code.BAD_QUERY, "mint: required")
    record = state.committed(schema.MINT, identifier)
    if record is None or "points" not in record:
        raise QueryError(Code.NOT_FOUND, f"no threshold mint {identifier}")
    if record.get("funded_height") is None:
        raise QueryError(
            Code.MINT_UNFUNDED,
            f"mint {identifier} is not funded yet: validators with 2/3 of the power have not "
            "vouched that its payer's prepaid balance covers it",
        )
    if record.get("refunded_height") is not None:
        raise QueryError(
            Code.MINT_SIGNING_CLOSED,
            f"mint {identifier} was refunded at block {record['refunded_height']}: fewer than "
            "t validators posted their partial signatures by its deadline",
        )
    period = int(record["period"])
    held = store.share(period)
    run = state.committed(schema.CREDIT_DKG, schema.epoch_key(period))
    formed = credit_dkg.period_key(state, period) if run is not None else None
    if held is None or formed is None:
        raise QueryError(Code.NOT_FOUND, f"this validator holds no share of key period {period}")
    index, _ = held
    address = run["receivers"][index - 1][0]
    posted = state.committed(schema.MINT_PARTIALS, f"{identifier}/{address}")
    if posted is None:
        raise QueryError(
            Code.PARTIALS_NOT_POSTED,
            f"validator {address} has not posted its partials of mint {identifier} yet",
        )
    return {
        "mint": identifier,
        "period": period,
        "validator": address,
        "index": index,
        "public_share": formed["public_shares"][address],
        "partials": posted["partials"],
    }
