"""Relays paid from credits (issue 43; docs/overlay.md "Relays are paid").

    relay_redeem{credits[, assignments]}
                               a registered relay (role `relay`: WRONG_ROLE for a node's key;
                               UNKNOWN_NODE unregistered; INVALID_LIFECYCLE once LEFT) cashes
                               credits users' clients paid it with, each assigned by its holder
                               to the relay's registered X25519 key (CREDIT_NOT_ASSIGNED:
                               credit_holders.py). Each credit goes through the
                               checks of a node's `credit_redeem` (credits.check_credits): its
                               window (CREDIT_EPOCH), the one spent set shared with nodes
                               (CREDIT_SPENT: a credit a node or another relay redeemed, or one
                               listed twice), a node's lock (CREDIT_LOCKED: a credit a node
                               locked before it served), σ under the period's key
                               (CREDIT_INVALID: forged, or of no formed key). No served
                               positions: the client pays a relay only once the path's exit
                               acknowledged the cloves it carried, so there is nothing for the
                               chain to cover.
                               → `cspent/<id>` per credit (as a node's redemption), the issue
                               counters, the credits' price due to this epoch (`cdue/<epoch>`,
                               as a node's: the close draws it from the credit pool),
                               `rpay/<epoch>/<evm address>` += count (what the close pays the
                               relay's staking address: a row of count · price on the epoch's
                               pool page, settlement.py) and `rcredit/<relay key>/<epoch>` +=
                               count: the relay's earnings of the epoch, with its EVM address.

The whole tx is refused on any failing item, naming it (`credit <i>:`), nothing written.

/relay_credits  ?key    {key, evm_address, epochs: [{epoch, credits}], committed_height}: what
                        the relay of that committee key redeemed, per epoch (retained epochs)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from abci_app import credit_holders, credits, rules, schema
from abci_app.codes import Code
from abci_app.query_params import NODE_KEY, QueryError, str_param
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.relay_credits import RelayRedeem
from protocol.committee.relays import RELAY_ROLE


def relay(state: State, key: str) -> dict[str, Any]:
    """A registered relay that has not left."""
    node = rules.registered_node(state, key)  # UNKNOWN_NODE
    if node["role"] != RELAY_ROLE:
        rules.reject(Code.WRONG_ROLE, f"node {key} has role {node['role']}, not relay")
    if node["status"] == schema.LEFT:
        rules.reject(Code.INVALID_LIFECYCLE, f"relay {key} has left")
    return node


def relay_redeem(state: State, tx: SignedTx) -> None:
    body: RelayRedeem = tx.body
    credits.enabled(state)  # CREDITS_DISABLED
    node = relay(state, tx.signer)
    credit_holders.check_relay_redemption(  # CREDIT_NOT_ASSIGNED
        state, node["relay_key"], body.credits, body.assignments
    )
    spent = credits.check_credits(state, body.credits, tx.signer)
    credits.mark_spent(state, spent)
    current = rules.epoch_of(state, state.block_height)
    account = str(node["evm_address"]).lower()
    credits.owe(state, current, len(spent) * (state.genesis.credit_price_wei or 0))
    add_pay(state, current, account, len(spent))
    key = earnings_key(tx.signer, current)
    held: dict[str, Any] | None = state.get(schema.RELAY_CREDIT, key)
    state.put(
        schema.RELAY_CREDIT,
        key,
        {"account": account, "credits": (held["credits"] if held else 0) + len(spent)},
    )
    if held is None:
        rules.track(state, schema.RELAY_CREDIT, key)
    state.emit("planet.relay_redeem", relay=tx.signer, epoch=current, credits=len(spent))


def add_pay(state: State, epoch: int, account: str, count: int, carried: int = 0) -> None:
    """`rpay/<epoch>/<account>`: credits += count (`carried` of them moved in from the epoch
    before, settlement.py): what the close of `epoch` pays the relay's address."""
    key = schema.in_epoch(epoch, account)
    held: dict[str, Any] = state.get(schema.RELAY_PAY, key) or {"account": account, "credits": 0}
    record = {"account": account, "credits": held["credits"] + count}
    if carried or held.get("carried"):
        record["carried"] = held.get("carried", 0) + carried
    state.put(schema.RELAY_PAY, key, record)


def earnings_key(relay_key: str, epoch: int) -> str:
    return f"{relay_key}/{schema.epoch_key(epoch)}"


def _relay_credits(state: State, params: dict[str, Any]) -> Any:
    key = str_param(params, "key", NODE_KEY)
    if key is None:
        raise QueryError(Code.BAD_QUERY, "key (a relay's committee key, 64 hex) is required")
    node = state.committed(schema.NODE, key) or {}
    rows = state.committed_items(schema.RELAY_CREDIT, f"{key}/", f"{key}0")
    return {
        "key": key,
        "evm_address": node.get("evm_address"),
        "epochs": [
            {"epoch": int(k.rsplit("/", 1)[1]), "credits": value["credits"]} for k, value in rows
        ],
        "committed_height": state.height,
    }


RELAY_CREDIT_ROUTES: dict[str, Callable[[State, dict[str, Any]], Any]] = {
    "/relay_credits": _relay_credits
}
