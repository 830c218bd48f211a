"""Credit queries (committed state): the chain's credit clock, the mints, the spent set.

/credit_keys        ?epoch           the credits' clock: epoch (default: the current one),
                                     lifetime_epochs, epoch_length, key_period_blocks and
                                     committed_height (the chain's time: what a node checks a
                                     credit's window against, `protocol.credits.ChainClock`),
                                     relay_bytes (a relay's rate: docs/overlay.md) and
                                     holder_bound (genesis `credits.holder_bound`: locks and
                                     redemptions need the holders' assignments);
                                     the name is kept from the per-validator keys it once listed
/mints              ?id              one mint record (NOT_FOUND when absent)
                    ?pending=true    a page of the mints waiting for ≥ 2/3 of the power to vouch
                                     for them: returning buyers' (`buyer`: true) first, then new
                                     payers', by id within each lane
                    ?payer           a page of a payer's retained mints (funded or not), by id
                    ?signing=true    a page of the funded mints still short of t posted partial
                                     sets, by signing deadline (what each validator's watcher
                                     signs: node/watcher/mint_signer.py)
                    ?after ?limit    both lists page: {mints, next}; `next` is the `after` of
                                     the next page, null on the last (1,000 a page at most)
/credit_spent       ?id              {id, height, committed_height, locked_by}: the height whose
                                     block redeemed the credit whose spent id
                                     (protocol.paid_credits.spent_id) this is, or null, the
                                     latest committed height, and the node key that locked it
                                     (credit_locks.py) or null — what a node asks before it takes
                                     a credit as pay
/credit_period      ?period          a key period's DKG run and key (period_queries.py)
/mint_partials      ?mint            {mint, period, threshold, deadline, refunded_height,
                                     committed_height, sets}: the partial signatures validators
                                     posted for the mint (`mint_partials` tx, each set verified
                                     by the chain), one {mint, validator, index, partials} per
                                     validator by index: what a client combines (any t)

`/credit_partials` (one validator's own posted set, the older route): threshold_queries.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from abci_app import credit_dkg, period_queries, rules, schema
from abci_app.codes import Code
from abci_app.query_params import (
    ACCOUNT,
    HASH32,
    QueryError,
    bool_param,
    int_param,
    limit_param,
    str_param,
)
from abci_app.state import State

MAX_EPOCH = (1 << 63) - 1


def _credit_keys(state: State, params: dict[str, Any]) -> Any:
    current = rules.epoch_of(state, state.height + 1)
    epoch = int_param(params, "epoch", current, 1, MAX_EPOCH) or current
    return {
        "epoch": epoch,
        "lifetime_epochs": state.genesis.credit_lifetime_epochs,
        # the chain's time, for a node that takes a credit (protocol/paid_credits.py)
        "committed_height": state.height,
        "epoch_length": state.genesis.epoch_length,
        "key_period_blocks": state.genesis.credit_key_period_blocks,  # a credit's window
        # a relay's rate: clove bytes that arrived one credit pays for (docs/overlay.md)
        "relay_bytes": state.genesis.credit_relay_bytes,
        # credits are locked and redeemed only with their holders' assignments (credit_holders.py)
        "holder_bound": state.genesis.credit_holder_bound,
    }


def _mint_record(state: State, params: dict[str, Any], name: str) -> dict[str, Any]:
    identifier = str_param(params, name, HASH32)
    if identifier is None:
        raise QueryError(Code.BAD_QUERY, f"{name}: required")
    record = state.committed(schema.MINT, identifier)
    if record is None:
        raise QueryError(Code.NOT_FOUND, f"no mint {identifier}")
    return {"id": identifier, **record}


_SPENT_ID = re.compile(r"[0-9a-f]{64}\Z")


def _credit_spent(state: State, params: dict[str, Any]) -> Any:
    identifier = str_param(params, "id", _SPENT_ID)
    if identifier is None:
        raise QueryError(Code.BAD_QUERY, "id (64 lowercase hex, a credit's spent id) is required")
    lock = state.committed(schema.CREDIT_LOCK, identifier)
    return {
        "id": identifier,
        "height": state.committed(schema.CREDIT_SPENT, identifier),
        "committed_height": state.height,  # the latest block this answer is true at
        # the node that locked it (credit_locks.py), or null: another node's credit to refuse
        "locked_by": None if lock is None else lock["node"],
    }


def _mint_partials(state: State, params: dict[str, Any]) -> Any:
    record = _mint_record(state, params, "mint")
    identifier = record["id"]
    if "points" not in record:
        raise QueryError(Code.NOT_FOUND, f"no threshold mint {identifier}")
    sets = [
        {
            "mint": identifier,
            "validator": key.split("/", 1)[1],
            "index": posted["index"],
            "partials": posted["partials"],
        }
        for key, posted in state.committed_items(
            schema.MINT_PARTIALS, identifier + "/", identifier + "0"
        )
    ]
    formed = credit_dkg.period_key(state, int(record["period"]))
    return {
        "mint": identifier,
        "period": record["period"],
        "threshold": None if formed is None else formed["threshold"],
        "funded_height": record.get("funded_height"),
        "deadline": record.get("deadline"),
        "refunded_height": record.get("refunded_height"),
        "committed_height": state.height,
        "sets": sorted(sets, key=lambda one: one["index"]),
    }


# a cursor of `/mints?signing=true`: a deadline (20 digits) and a mint id (schema.signing_key)
SIGNING_CURSOR = re.compile(r"[0-9]{20}/0x[0-9a-f]{64}\Z")
# a cursor of `/mints?pending=true`: the lane and id of the last mint of a page (schema.py)
PENDING_CURSOR = re.compile(r"[01]/0x[0-9a-f]{64}\Z")


def _page(
    state: State, ns: str, lower: str, upper: str, after: str | None, limit: int
) -> tuple[list[str], str | None]:
    """Up to `limit` keys of `ns` in [lower, upper) after `after`, and the cursor of the next
    page (the last key returned) when more follow, else None."""
    start = lower if after is None or after < lower else after
    keys: list[str] = []
    for key, _ in state.committed_items(ns, start, upper):
        if key == after:
            continue  # the previous page's last entry
        if len(keys) == limit:
            return keys, keys[-1]
        keys.append(key)
    return keys, None


def _brief(state: State, identifier: str) -> dict[str, Any] | None:
    record = state.committed(schema.MINT, identifier)
    if record is None:
        return None
    return {"id": identifier, **record}


def _mints(state: State, params: dict[str, Any]) -> Any:
    """One mint (`?id`), or a page of the mints waiting for their funding (`?pending=true`:
    returning buyers' first, then new payers', each lane by id) or of one payer's retained
    mints (`?payer`, by id): `next` is the `after` of the next page, null on the last one —
    every mint is listed once over the pages, and nothing is left out silently."""
    if params.get("id") is not None:
        return _mint_record(state, params, "id")
    limit = limit_param(params)
    mints: list[dict[str, Any]] = []
    if bool_param(params, "pending"):
        after = str_param(params, "after", PENDING_CURSOR)
        keys, cursor = _page(state, schema.MINT_UNFUNDED, "", "2", after, limit)
        for key in keys:
            lane, identifier = key.split("/", 1)
            brief = _brief(state, identifier)
            if brief is not None:
                mints.append({**brief, "buyer": lane == schema.BUYER_LANE})
        return {"mints": mints, "next": cursor}
    if bool_param(params, "signing"):
        after = str_param(params, "after", SIGNING_CURSOR)
        keys, cursor = _page(state, schema.MINT_SIGNING, "", "a", after, limit)
        for key in keys:
            brief = _brief(state, key.split("/", 1)[1])
            if brief is not None:
                mints.append(brief)
        return {"mints": mints, "next": cursor}
    payer = str_param(params, "payer", ACCOUNT)
    if payer is None:
        raise QueryError(
            Code.BAD_QUERY, "one of id, pending=true, signing=true or payer is required"
        )
    payer = payer.lower()
    after = str_param(params, "after", HASH32)
    keys, cursor = _page(
        state,
        schema.MINT_BY_PAYER,
        payer + "/",
        payer + "0",
        None if after is None else f"{payer}/{after}",
        limit,
    )
    for key in keys:
        brief = _brief(state, key.split("/", 1)[1])
        if brief is not None:
            mints.append(brief)
    return {"mints": mints, "next": None if cursor is None else cursor.split("/", 1)[1]}


CREDIT_ROUTES: dict[str, Callable[[State, dict[str, Any]], Any]] = {
    "/credit_keys": _credit_keys,
    "/mints": _mints,
    "/credit_spent": _credit_spent,
    "/credit_period": period_queries.credit_period,
    "/mint_partials": _mint_partials,
}
