"""Validator set changes: proposed and approved by the validators, applied at an epoch boundary.

    validator_change{action, pub_key[, power][, operator]}
                        a validator (NOT_VALIDATOR) proposes adding a validator (its key is
                        not one: VALIDATOR_CHANGE_INVALID; an ed25519 point, as the DKG seals
                        shares to it), setting one's power (a validator, another power) or
                        removing one (a validator; the set keeps MIN_VALIDATORS); neither the
                        proposer nor the target has a pending change (VALIDATOR_CHANGE_PENDING).
                        → `vchange/<id>` (`change_id`: the change and this height) with the
                        proposer's approval, `last_epoch` = this epoch + CHANGE_EPOCHS;
                        `vchprop/<proposer address>`, `vchkey/<target key>` = id.
    validator_approve{change}
                        a validator (NOT_VALIDATOR) approves a pending change
                        (VALIDATOR_CHANGE_UNKNOWN), once (DUPLICATE_VOTE), by its last epoch
                        (VALIDATOR_CHANGE_EXPIRED). The change is approved (`approved_height`)
                        once the approvers still in the set hold ≥ 2/3 of the power.

At the end of an epoch's last block H (`close`): the approved changes, in id order, each
checked again against the set they would change (dropped with `planet.validator_change_dropped`
when no longer valid, e.g. a second removal below the minimum), make the next set; their
records go. FinalizeBlock of H returns them as `validator_updates` (`State.validator_updates`;
power 0 removes), CometBFT uses the new set from height H + 2, and so does the app:
`meta/validators_next` = {from_height: H + 2, validators} becomes `meta/validators` at the end
of block H + 1 (`switch`), so txs, 2/3 counts and vote extensions of block H + 2 on see the
new set. A change unapproved at the end of its last epoch expires: its proposer and target may
propose again, its record stays one more epoch (approvals: VALIDATOR_CHANGE_EXPIRED), then goes.
Changes approved while a switch is still due wait for the next boundary.

Each validator has at most one pending change as proposer and one as target: at most 2n
records. Heights, epochs, integers and ids only: every validator applies the same set.
The credit key: a key period's DKG takes the validators at its config block
(abci_app/credit_dkg.py), so the first run configured after the switch deals the new set its
shares (docs/credits.md, *Validator set changes*).
"""

from __future__ import annotations

from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State, validator_address
from protocol.committee.envelope import SignedTx
from protocol.committee.validator_set import ADD, POWER, REMOVE, ValidatorApprove, ValidatorChange
from protocol.committee.validator_set import change_id as make_change_id
from protocol.credit_dkg_run import box_key_of
from protocol.dkg import DkgMessageError

MIN_VALIDATORS = 4  # the smallest set (3f + 1, f = 1) whose DKG threshold ⌊2n/3⌋ + 1 < n
CHANGE_EPOCHS = 4  # a change not approved by the end of its epoch + this many goes
NEXT = "validators_next"


def _problem(validators: list[dict[str, Any]], change: dict[str, Any]) -> str | None:
    """Why `change` cannot apply to `validators` (None: it can)."""
    current = {v["pub_key"]: v for v in validators}
    target = current.get(change["pub_key"])
    if change["action"] == ADD:
        return f"{change['pub_key']} is a validator already" if target is not None else None
    if target is None:
        return f"{change['pub_key']} is not a validator"
    if change["action"] == POWER:
        same = target["power"] == change["power"]
        return f"the power is {target['power']} already" if same else None
    left = len(validators) - 1
    if left < MIN_VALIDATORS:
        return f"a removal would leave {left} validators, fewer than {MIN_VALIDATORS}"
    return None


def _apply(validators: list[dict[str, Any]], change: dict[str, Any]) -> list[dict[str, Any]]:
    others = [v for v in validators if v["pub_key"] != change["pub_key"]]
    if change["action"] == REMOVE:
        return others
    if change["action"] == POWER:
        old = next(v for v in validators if v["pub_key"] == change["pub_key"])
        return sorted([*others, {**old, "power": change["power"]}], key=lambda v: v["address"])
    added = {
        "address": change["address"],
        "pub_key": change["pub_key"],
        "power": change["power"],
        "operator": change["operator"],
    }
    return sorted([*others, added], key=lambda v: v["address"])


def _approved_power(state: State, approvals: list[str]) -> int:
    return sum(state.by_address[a]["power"] for a in approvals if a in state.by_address)


def validator_change(state: State, tx: SignedTx) -> None:
    body: ValidatorChange = tx.body
    proposer = rules.validator(state, tx.signer)
    if body.action == ADD:
        try:
            box_key_of(bytes.fromhex(body.pub_key))
        except DkgMessageError:
            rules.reject(Code.VALIDATOR_CHANGE_INVALID, f"{body.pub_key} is not an ed25519 key")
    change: dict[str, Any] = {
        "action": body.action,
        "pub_key": body.pub_key,
        "address": validator_address(bytes.fromhex(body.pub_key)),
        "power": body.power,
        "operator": body.operator,
    }
    problem = _problem(state.validators, change)
    if problem is not None:
        rules.reject(Code.VALIDATOR_CHANGE_INVALID, problem)
    if state.get(schema.VALIDATOR_CHANGE_BY_PROPOSER, proposer["address"]) is not None:
        rules.reject(
            Code.VALIDATOR_CHANGE_PENDING, f"validator {proposer['address']} has a pending change"
        )
    if state.get(schema.VALIDATOR_CHANGE_BY_KEY, body.pub_key) is not None:
        rules.reject(Code.VALIDATOR_CHANGE_PENDING, f"{body.pub_key} has a pending change")
    identifier = make_change_id(body, state.block_height)
    approvals = [proposer["address"]]
    record = {
        **change,
        "id": identifier,
        "proposer": proposer["address"],
        "height": state.block_height,
        "last_epoch": rules.epoch_of(state, state.block_height) + CHANGE_EPOCHS,
        "approvals": approvals,
        "approved_height": None,
    }
    if state.has_two_thirds(_approved_power(state, approvals)):
        record["approved_height"] = state.block_height
    state.put(schema.VALIDATOR_CHANGE, identifier, record)
    state.put(schema.VALIDATOR_CHANGE_BY_PROPOSER, proposer["address"], identifier)
    state.put(schema.VALIDATOR_CHANGE_BY_KEY, body.pub_key, identifier)
    state.emit("planet.validator_change", id=identifier, action=body.action, key=body.pub_key)


def validator_approve(state: State, tx: SignedTx) -> None:
    body: ValidatorApprove = tx.body
    validator = rules.validator(state, tx.signer)
    record = state.get(schema.VALIDATOR_CHANGE, body.change)
    if record is None:
        rules.reject(Code.VALIDATOR_CHANGE_UNKNOWN, f"no pending validator change {body.change}")
    if rules.epoch_of(state, state.block_height) > record["last_epoch"]:
        rules.reject(
            Code.VALIDATOR_CHANGE_EXPIRED,
            f"validator change {body.change} expired with epoch {record['last_epoch']}",
        )
    if validator["address"] in record["approvals"]:
        rules.reject(Code.DUPLICATE_VOTE, f"validator {validator['address']} approved already")
    approvals = sorted([*record["approvals"], validator["address"]])
    updated = {**record, "approvals": approvals}
    if record["approved_height"] is None and state.has_two_thirds(
        _approved_power(state, approvals)
    ):
        updated["approved_height"] = state.block_height
    state.put(schema.VALIDATOR_CHANGE, body.change, updated)
    state.emit("planet.validator_approve", id=body.change, validator=validator["address"])


def _drop(state: State, record: dict[str, Any]) -> None:
    state.delete(schema.VALIDATOR_CHANGE, record["id"])
    state.delete(schema.VALIDATOR_CHANGE_BY_PROPOSER, record["proposer"])
    state.delete(schema.VALIDATOR_CHANGE_BY_KEY, record["pub_key"])


def close(state: State, height: int) -> None:
    """At an epoch's last block: the approved changes make the next set (module docstring)."""
    epoch = rules.epoch_of(state, height)
    due = state.get(schema.META, NEXT) is not None  # a switch still due: approved ones wait
    validators = state.validators
    applied: list[dict[str, Any]] = []
    for _, record in state.items(schema.VALIDATOR_CHANGE):
        if record["approved_height"] is None:
            if epoch == record["last_epoch"]:  # expired: proposer and target free again
                state.delete(schema.VALIDATOR_CHANGE_BY_PROPOSER, record["proposer"])
                state.delete(schema.VALIDATOR_CHANGE_BY_KEY, record["pub_key"])
                state.emit("planet.validator_change_expired", id=record["id"])
            elif epoch > record["last_epoch"]:  # kept one epoch to refuse approvals by name
                state.delete(schema.VALIDATOR_CHANGE, record["id"])
            continue
        if due:
            continue
        _drop(state, record)
        problem = _problem(validators, record)
        if problem is not None:
            state.emit("planet.validator_change_dropped", id=record["id"], reason=problem)
            continue
        validators = _apply(validators, record)
        applied.append(record)
    if not applied:
        return
    before = {v["pub_key"]: v["power"] for v in state.validators}
    after = {v["pub_key"]: v["power"] for v in validators}
    state.validator_updates = [
        (key, after.get(key, 0))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]
    state.put(schema.META, NEXT, {"from_height": height + 2, "validators": validators})
    state.emit("planet.validator_set", from_height=height + 2, validators=len(validators))


def switch(state: State, height: int) -> None:
    """At the end of block H + 1: the set CometBFT uses from H + 2 becomes the app's."""
    pending = state.get(schema.META, NEXT)
    if pending is None or pending["from_height"] != height + 1:
        return
    state.delete(schema.META, NEXT)
    state.set_validators(pending["validators"])


def changes(state: State, params: dict[str, Any]) -> Any:
    """/validator_changes: {changes: the pending (and just-expired) changes by id, next: the
    set a boundary made that is not in effect yet ({from_height, validators}) or null}
    (committed state; at most 2n + n records)."""
    return {
        "changes": [record for _, record in state.committed_items(schema.VALIDATOR_CHANGE)],
        "next": state.committed(schema.META, NEXT),
    }
