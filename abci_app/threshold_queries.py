"""This validator's partial signatures for a funded threshold mint (its own key share).

/credit_partials  ?mint   {mint, period, validator, index, public_share, partials [hex]}:
                          s_i = x_i · B for every blinded point B of the mint's one list, under
                          this validator's share of the mint's key period
                          (`<home>/credit_shares/`); MINT_UNFUNDED until the mint is funded,
                          NOT_FOUND when the mint is not a threshold mint or this validator holds
                          no share of its period. The client checks each partial against X_i
                          (`/credit_period`), combines any t and unblinds.

Not a function of the chain state (it needs the share), so `app.py` serves it as a local route.
Signing is deterministic (s_i depends on x_i and B only), so a cache changes no answer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from abci_app import credit_dkg, schema
from abci_app.codes import Code
from abci_app.query_params import HASH32, QueryError, str_param
from abci_app.state import State
from protocol import blind_bls
from protocol.credit_shares import CreditShareStore

PARTIALS_PATH = "/credit_partials"
PARTIALS_CACHE = 256
_signed: OrderedDict[tuple[str, int], list[str]] = OrderedDict()


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
    period = int(record["period"])
    held = store.share(period)
    run = state.committed(schema.CREDIT_DKG, schema.epoch_key(period))
    formed = credit_dkg.period_key(state, period) if run is not None else None
    if held is None or formed is None:
        raise QueryError(Code.NOT_FOUND, f"this validator holds no share of key period {period}")
    index, share = held
    address = run["receivers"][index - 1][0]
    cache_key = (identifier, index)
    signed = _signed.get(cache_key)
    if signed is None:
        signed = [blind_bls.partial_sign(share, bytes.fromhex(p)).hex() for p in record["points"]]
        _signed[cache_key] = signed
        if len(_signed) > PARTIALS_CACHE:
            _signed.popitem(last=False)
    return {
        "mint": identifier,
        "period": period,
        "validator": address,
        "index": index,
        "public_share": formed["public_shares"][address],
        "partials": signed,
    }
