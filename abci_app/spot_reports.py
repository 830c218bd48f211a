"""Spot-check reports: what the chain credits verifiers for (`spot_check_report`).

The commitments made during epoch e are selected under the seed of epoch e+1 and assigned
among the verifier set e+1's record fixed (abci_app/epochs.py, protocol/spotcheck.py). A
validator's verifier that has done its checks reports the triples:

    spot_check_report{epoch e, checks [[node, session, step, shard], …]}   signer: a validator
        e < the block's epoch and e ≥ the block's epoch − MAX_REPORT_LAG; one per (validator, e);
        every triple committed in e (`commit/…` height in e), selected under e+1's seed at the
        node's rate (genesis `spot_check_ppm`, raised to `spot_check_floor` / the node's records
        of e: protocol/spotcheck.py `node_rate_ppm`), and assigned to the signer — else the
        whole tx is refused

Effects: `spotrep/<e>/<signer>` = {count, height}; `vwork/<block's epoch>/<operator>` += count
(the validator's genesis operator address). At that epoch's close, settlement turns the
`vwork` entries into `shares.payouts.VerificationWork` (the verifiers' cut of the fees, split
by spot checks). The chain cannot see whether a check was done — the verdict votes show the
failed ones — but it never credits more checks than the committee's own draw assigned to the
signer. Codes: NOT_VALIDATOR 14, SPOT_REPORT_EPOCH 50, DUPLICATE_SPOT_REPORT 51,
SPOT_CHECK_NOT_ASSIGNED 52. Records are indexed for pruning (`rules.track`).
"""

from __future__ import annotations

from abci_app import coverage, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.verification import SpotCheckReport
from protocol.spotcheck import (
    Triple,
    assign_verifier,
    epoch_verifiers,
    is_selected,
    node_rate_ppm,
)

MAX_REPORT_LAG = 2  # epochs after e during which e's checks may still be reported


def spot_check_report(state: State, tx: SignedTx) -> None:
    body: SpotCheckReport = tx.body
    validator = rules.validator(state, tx.signer)
    current = rules.epoch_of(state, state.block_height)
    if not current - MAX_REPORT_LAG <= body.epoch < current:
        rules.reject(
            Code.SPOT_REPORT_EPOCH,
            f"checks of epoch {body.epoch} are reported during epochs {body.epoch + 1} … "
            f"{body.epoch + MAX_REPORT_LAG} (this block is in epoch {current})",
        )
    entry = schema.in_epoch(body.epoch, tx.signer)
    if state.get(schema.SPOT_REPORT, entry) is not None:
        rules.reject(Code.DUPLICATE_SPOT_REPORT, f"epoch {body.epoch} is already reported")
    fixed = epoch_verifiers(state.get(schema.EPOCH, str(body.epoch + 1)))
    if fixed is None:
        rules.reject(Code.SPOT_REPORT_EPOCH, f"no record of epoch {body.epoch + 1}")
    seed, verifiers = fixed
    if tx.signer not in verifiers:
        rules.reject(Code.SPOT_CHECK_NOT_ASSIGNED, "not a verifier of that epoch")
    rate, floor = state.genesis.spot_check_ppm, state.genesis.spot_check_floor
    rates: dict[str, int] = {}
    for node, session, step, shard in body.checks:
        if node not in rates:
            blocks = coverage.blocks_in(coverage.node_entries(state, node), body.epoch)
            rates[node] = node_rate_ppm(rate, floor, blocks)
        commit = state.get(schema.COMMITMENT, schema.commitment_key(node, session, step, shard))
        if commit is None or rules.epoch_of(state, commit["height"]) != body.epoch:
            rules.reject(
                Code.SPOT_CHECK_NOT_ASSIGNED, f"no commitment of epoch {body.epoch} for {node[:12]}"
            )
        triple = Triple(node, session, step, shard)
        mine = assign_verifier(seed, triple, verifiers) == tx.signer
        if not is_selected(seed, triple, rates[node]) or not mine:
            rules.reject(Code.SPOT_CHECK_NOT_ASSIGNED, "a listed block is not assigned here")
    count = len(body.checks)
    state.put(schema.SPOT_REPORT, entry, {"count": count, "height": state.block_height})
    rules.track(state, schema.SPOT_REPORT, entry)
    operator = validator.get("operator")
    if operator:
        credit = schema.in_epoch(current, str(operator).lower())
        held = state.get(schema.SPOT_CREDIT, credit)
        if held is None:
            rules.track(state, schema.SPOT_CREDIT, credit)
        state.put(schema.SPOT_CREDIT, credit, (held or 0) + count)
    state.emit("planet.spot_report", epoch=body.epoch, validator=validator["address"], count=count)
