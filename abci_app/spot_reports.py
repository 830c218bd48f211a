"""Spot-check reports: what the chain credits verifiers for (`spot_check_report`).

The commitments made during epoch e are selected under the seed of epoch e+1 and assigned
among the verifier set e+1's record fixed (abci_app/epochs.py, protocol/spotcheck.py). A
validator's verifier that has done its checks reports the triples:

    spot_check_report{epoch e, checks [[node, session, step, shard], …]}   signer: a validator
        e < the block's epoch and e ≥ the block's epoch − MAX_REPORT_LAG; one per (validator, e);
        every triple committed in e (`commit/…` height in e), selected under e+1's seed at
        genesis `spot_check_ppm`, and assigned to the signer — else the whole tx is refused

Effects: `spotrep/<e>/<signer>` = {count, height}; `vwork/<block's epoch>/<operator>` += count
(the validator's genesis operator address). At that epoch's close, settlement turns the
`vwork` entries into `shares.payouts.VerificationWork` (the verifiers' cut of the fees, split
by spot checks). The chain cannot see whether a check was done — the verdict votes show the
failed ones — but it never credits more checks than the committee's own draw assigned to the
signer. Codes: NOT_VALIDATOR 14, SPOT_REPORT_EPOCH 50, DUPLICATE_SPOT_REPORT 51,
SPOT_CHECK_NOT_ASSIGNED 52. Records are indexed for pruning (`retention.track`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from abci_app import retention
from abci_app.codes import Code, Rejected
from protocol.committee import SignedTx, SpotCheckReport
from protocol.spotcheck import Triple, assign_verifier, epoch_verifiers, is_selected
from shares.payouts import VerificationWork

if TYPE_CHECKING:
    from abci_app.state import State

REPORTS = "spotrep"
CREDITS = "vwork"
MAX_REPORT_LAG = 2  # epochs after e during which e's checks may still be reported


def _key(epoch: int, who: str) -> str:
    return f"{epoch:012d}/{who}"


def spot_check_report(state: State, tx: SignedTx) -> None:
    body: SpotCheckReport = tx.body
    validator = state.validator_by_signer(tx.signer)
    if validator is None:
        raise Rejected(Code.NOT_VALIDATOR, f"signer {tx.signer} is not a validator")
    current = retention.epoch_of(state, state.block_height)
    if not current - MAX_REPORT_LAG <= body.epoch < current:
        raise Rejected(
            Code.SPOT_REPORT_EPOCH,
            f"checks of epoch {body.epoch} are reported during epochs {body.epoch + 1} … "
            f"{body.epoch + MAX_REPORT_LAG} (this block is in epoch {current})",
        )
    entry = _key(body.epoch, tx.signer)
    if state.get(REPORTS, entry) is not None:
        raise Rejected(Code.DUPLICATE_SPOT_REPORT, f"epoch {body.epoch} is already reported")
    fixed = epoch_verifiers(state.get("epoch", str(body.epoch + 1)))
    if fixed is None:
        raise Rejected(Code.SPOT_REPORT_EPOCH, f"no record of epoch {body.epoch + 1}")
    seed, verifiers = fixed
    if tx.signer not in verifiers:
        raise Rejected(Code.SPOT_CHECK_NOT_ASSIGNED, "not a verifier of that epoch")
    rate = state.genesis.spot_check_ppm
    for node, session, step, shard in body.checks:
        commit = state.get("commit", f"{node}/{session}/{step}/{shard}")
        if commit is None or retention.epoch_of(state, commit["height"]) != body.epoch:
            raise Rejected(
                Code.SPOT_CHECK_NOT_ASSIGNED, f"no commitment of epoch {body.epoch} for {node[:12]}"
            )
        triple = Triple(node, session, step, shard)
        if not is_selected(seed, triple, rate) or assign_verifier(seed, triple, verifiers) != (
            tx.signer
        ):
            raise Rejected(Code.SPOT_CHECK_NOT_ASSIGNED, "a listed block is not assigned here")
    count = len(body.checks)
    state.put(REPORTS, entry, {"count": count, "height": state.block_height})
    retention.track(state, REPORTS, entry)
    operator = validator.get("operator")
    if operator:
        credit = _key(current, str(operator).lower())
        held = state.get(CREDITS, credit)
        if held is None:
            retention.track(state, CREDITS, credit)
        state.put(CREDITS, credit, (held or 0) + count)
    state.emit("planet.spot_report", epoch=body.epoch, validator=validator["address"], count=count)


def verification_work(state: State, epoch: int) -> tuple[VerificationWork, ...]:
    """The spot checks credited in `epoch`, per operator account, in key order."""
    prefix = f"{epoch:012d}/"
    return tuple(
        VerificationWork(account=key[len(prefix) :], spot_checks=count)
        for key, count in state.items(CREDITS, prefix, f"{epoch:012d}0")
        if count > 0
    )


def reports_view(state: State, epoch: int) -> dict[str, Any]:
    """`/spot_reports?epoch=e` (committed state): the reports of e's checks, by signer, and the
    checks credited in e, by operator."""
    prefix, stop = f"{epoch:012d}/", f"{epoch:012d}0"
    return {
        "epoch": epoch,
        "reports": [
            {"signer": key[len(prefix) :], **value}
            for key, value in state.committed_items(REPORTS, prefix, stop)
        ],
        "credits": [
            {"account": key[len(prefix) :], "spot_checks": value}
            for key, value in state.committed_items(CREDITS, prefix, stop)
        ],
    }
