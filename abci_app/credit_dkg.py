"""The credit key periods' DKG on the chain: each period's committee key X_p, made by its
validators in txs, phases by block height (`protocol.credit_periods.KeySchedule`).

    end of block s − 1      `cdkg/<p>`: the run's receivers (the validators, ascending by
                            address, index 1..n), its session id, threshold t = ⌊2n/3⌋ + 1
    dkg_deal{p, deal}       in the deal blocks; the deal's dealer index is the signer's
                            (NOT_DKG_PARTICIPANT, DKG_MESSAGE_INVALID), once, of the run's shape
                            with strictly parsed commitments (`DkgState.submit_deal`)
    dkg_complaint{p, dealer}
                            in the complaint blocks; the signer complains once about a dealer
                            that dealt
    dkg_justify{p, receiver, share}
                            in the justify blocks; the signer (dealer) answers a complaint
                            against it, once
    end of block s + 3P − 1 (the record's `finish`) the run is replayed through
                            `protocol.dkg.DkgState` from the stored messages: QUAL,
                            X_p = Σ C_{i,0}, every receiver's public share X_j (by validator
                            address) in `cdkg/<p>`.result, or {failed: reason}
                            when fewer than t dealers qualify: then attempt a + 1 is configured
                            with a new session, its deal blocks from the next block on (while
                            the period lasts); its messages are keyed by attempt

A run's record and messages are kept while credits of its period can be redeemed, then go
with the period's mints and buyers: indexed for pruning (`rules.track_at`) at the period's
issue epoch + `credits.lifetime_epochs` (`threshold_mint.issue_epoch`), deleted once that
epoch is settled and `retention_epochs` more have passed (retention.py) — heights and epochs
only, the same block on every validator. The current and the previous periods' keys stay
(their credits are redeemable), an old period's ~3 KB per validator does not.

A message outside its phase's blocks is DKG_PHASE. Every rule reads and writes state only:
integers, bytes, the stored messages in key order — every validator forms the same key.
Without genesis `credits` no run is configured (and every DKG tx is DKG_PHASE).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol import bls, dkg_wire
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.committee.envelope import SignedTx
from protocol.credit_dkg_run import config_of, session_of
from protocol.credit_periods import PHASES, DkgWindow, KeySchedule
from protocol.dkg import (
    Complaint,
    DkgConfig,
    DkgError,
    DkgState,
    Justification,
    threshold_for,
)
from protocol.threshold_mint import issue_epoch

_INDEX = "{:05d}"


def schedule(state: State) -> KeySchedule:
    genesis = state.genesis
    return KeySchedule(genesis.credit_key_period_blocks, genesis.credit_dkg_phase_blocks)


def run_record(state: State, period: int) -> dict[str, Any] | None:
    return state.get(schema.CREDIT_DKG, schema.epoch_key(period))


def period_key(state: State, period: int) -> dict[str, Any] | None:
    """The formed key of `period`: {key, commitments, public_shares, qualified, threshold}, or
    None (no run, still running, or failed)."""
    record = run_record(state, period)
    if record is None or not record["result"] or "key" not in record["result"]:
        return None
    return record["result"]


def _keep_while_redeemable(state: State, ns: str, key: str, period: int) -> None:
    """Index a record of `period`'s run for pruning once its credits' window is over."""
    issued = issue_epoch(schedule(state), period, state.genesis.epoch_length)
    rules.track_at(state, ns, key, issued + state.genesis.credit_lifetime_epochs)


def _put_message(state: State, period: int, key: str, value: Any) -> None:
    state.put(schema.CREDIT_DKG_MESSAGE, key, value)
    _keep_while_redeemable(state, schema.CREDIT_DKG_MESSAGE, key, period)


def _config(record: dict[str, Any]) -> DkgConfig:
    return config_of(
        bytes.fromhex(record["session"]), [bytes.fromhex(k) for _, k in record["receivers"]]
    )


def _msg(period: int, attempt: int, *parts: str) -> str:
    return "/".join((schema.epoch_key(period), f"{attempt:04d}", *parts))


def _open_run(state: State, tx: SignedTx, period: int, phase: DkgWindow) -> tuple[dict, int]:
    """The run record and the signer's index, or the named refusal."""
    record = run_record(state, period)
    if record is None:
        rules.reject(Code.DKG_PHASE, f"no DKG run for key period {period}")
    window = schedule(state).window_from(record["start"], state.block_height)
    if window is not phase:
        rules.reject(
            Code.DKG_PHASE,
            f"a {phase.value} of key period {period}'s DKG in its {window.value} blocks",
        )
    for index, (_, pub_key) in enumerate(record["receivers"], start=1):
        if pub_key == tx.signer:
            return record, index
    rules.reject(Code.NOT_DKG_PARTICIPANT, f"signer {tx.signer} is not in period {period}'s run")


def dkg_deal(state: State, tx: SignedTx) -> None:
    body: DkgDeal = tx.body
    record, index = _open_run(state, tx, body.period, DkgWindow.DEAL)
    attempt = record["attempt"]
    try:
        deal = dkg_wire.decode_deal(body.deal)
        if deal.dealer != index:
            rules.reject(
                Code.DKG_MESSAGE_INVALID, f"deal of dealer {deal.dealer} signed by {index}"
            )
        DkgState(_config(record)).submit_deal(deal)  # shape and strict point parsing
    except DkgError as error:
        rules.reject(Code.DKG_MESSAGE_INVALID, error.message)
    except bls.BlsError as error:
        rules.reject(Code.DKG_MESSAGE_INVALID, error.message)
    key = _msg(body.period, attempt, "d", _INDEX.format(index))
    if state.get(schema.CREDIT_DKG_MESSAGE, key) is not None:
        rules.reject(Code.DKG_MESSAGE_INVALID, f"dealer {index} already dealt")
    _put_message(state, body.period, key, body.deal.hex())
    state.emit("planet.dkg_deal", period=body.period, dealer=index)


def dkg_complaint(state: State, tx: SignedTx) -> None:
    body: DkgComplaint = tx.body
    record, index = _open_run(state, tx, body.period, DkgWindow.COMPLAINT)
    attempt = record["attempt"]
    dealt = _msg(body.period, attempt, "d", _INDEX.format(body.dealer))
    if state.get(schema.CREDIT_DKG_MESSAGE, dealt) is None:
        rules.reject(Code.DKG_MESSAGE_INVALID, f"dealer {body.dealer} did not deal")
    key = _msg(body.period, attempt, "c", _INDEX.format(body.dealer), _INDEX.format(index))
    if state.get(schema.CREDIT_DKG_MESSAGE, key) is not None:
        rules.reject(Code.DKG_MESSAGE_INVALID, "a receiver complains once per dealer")
    _put_message(state, body.period, key, 0)
    state.emit("planet.dkg_complaint", period=body.period, dealer=body.dealer, receiver=index)


def dkg_justify(state: State, tx: SignedTx) -> None:
    body: DkgJustify = tx.body
    record, index = _open_run(state, tx, body.period, DkgWindow.JUSTIFY)
    attempt = record["attempt"]
    pair = (_INDEX.format(index), _INDEX.format(body.receiver))
    if state.get(schema.CREDIT_DKG_MESSAGE, _msg(body.period, attempt, "c", *pair)) is None:
        rules.reject(Code.DKG_MESSAGE_INVALID, f"no complaint of {body.receiver} against {index}")
    key = _msg(body.period, attempt, "j", *pair)
    if state.get(schema.CREDIT_DKG_MESSAGE, key) is not None:
        rules.reject(Code.DKG_MESSAGE_INVALID, "a complaint is answered once")
    try:
        bls.parse_scalar(body.share, "revealed share", allow_zero=True)
    except bls.BlsError as error:
        rules.reject(Code.DKG_MESSAGE_INVALID, error.message)
    _put_message(state, body.period, key, body.share.hex())
    state.emit("planet.dkg_justify", period=body.period, dealer=index, receiver=body.receiver)


# --- end of block -------------------------------------------------------------------------------


def end_block(state: State, height: int) -> None:
    """Record the runs that start next block, form the keys whose runs end with this block."""
    if state.genesis.credit_price_wei is None:
        return
    plan = schedule(state)
    for period in plan.configured_at(height):
        if run_record(state, period) is None:
            _configure(state, plan, period, 0, plan.dkg_start(period))
    current = plan.period_of(height)
    for period in (current, current + 1):
        record = run_record(state, period)
        if record is None or record["result"] is not None or record["finish"] != height:
            continue
        if _finish(state, period, record) or height >= plan.period_end(period):
            continue
        # failed (validators not up, or cheating): run it again from the next block
        _configure(state, plan, period, record["attempt"] + 1, height + 1)


def _configure(state: State, plan: KeySchedule, period: int, attempt: int, start: int) -> None:
    key = schema.epoch_key(period)
    validators = sorted(state.validators, key=lambda v: v["address"])
    state.put(
        schema.CREDIT_DKG,
        key,
        {
            "period": period,
            "session": session_of(state.chain_id, period, attempt).hex(),
            "attempt": attempt,
            "receivers": [[v["address"], v["pub_key"]] for v in validators],
            "threshold": threshold_for(len(validators)),
            "start": start,
            "finish": start + PHASES * plan.phase_blocks - 1,
            "result": None,
        },
    )
    _keep_while_redeemable(state, schema.CREDIT_DKG, key, period)
    state.emit("planet.dkg_start", period=period, attempt=attempt, receivers=len(validators))


def messages(
    items: Callable[..., Iterable[tuple[str, Any]]], period: int, attempt: int
) -> dict[str, Any]:
    """The run's stored messages read through `items` (`state.items`, or `committed_items` for
    a query): {deals {dealer: hex}, complaints [[dealer, receiver]], justifications [[dealer,
    receiver, share hex]]} (key order: deterministic)."""
    prefix = f"{schema.epoch_key(period)}/{attempt:04d}/"
    start, stop = prefix, prefix[:-1] + "0"
    deals: dict[int, str] = {}
    complaints: list[list[int]] = []
    answers: list[list[Any]] = []
    for key, value in items(schema.CREDIT_DKG_MESSAGE, start, stop):
        parts = key.split("/")[2:]
        if parts[0] == "d":
            deals[int(parts[1])] = value
        elif parts[0] == "c":
            complaints.append([int(parts[1]), int(parts[2])])
        else:
            answers.append([int(parts[1]), int(parts[2]), value])
    return {"deals": deals, "complaints": complaints, "justifications": answers}


def _finish(state: State, period: int, record: dict[str, Any]) -> bool:
    """Form the key of `period`'s run; False when the run failed."""
    stored = messages(state.items, period, record["attempt"])
    config = _config(record)
    run = DkgState(config)
    try:
        for dealer in sorted(stored["deals"]):
            run.submit_deal(dkg_wire.decode_deal(bytes.fromhex(stored["deals"][dealer])))
        run.close_deals()
        for dealer, receiver in stored["complaints"]:
            run.submit_complaint(Complaint(receiver, dealer))
        run.close_complaints()
        for dealer, receiver, share in stored["justifications"]:
            # a dealer excluded by t complaints that answers anyway: changes nothing
            with contextlib.suppress(DkgError):
                run.submit_justification(Justification(dealer, receiver, bytes.fromhex(share)))
        run.close_justifications()
        result = run.finish()
    except DkgError as error:
        outcome: dict[str, Any] = {"failed": error.reason}
        state.emit("planet.dkg_failed", period=period, reason=error.reason)
        formed = False
    else:
        addresses = [address for address, _ in record["receivers"]]
        outcome = {
            "key": result.group_key.hex(),
            "commitments": [c.hex() for c in result.commitments],
            "public_shares": {
                addresses[i - 1]: share.hex() for i, share in sorted(result.public_shares.items())
            },
            "qualified": list(result.qualified),
            "threshold": result.threshold,
        }
        state.emit("planet.dkg_key", period=period, qualified=len(result.qualified))
        formed = True
    # a failed attempt's record is replaced by the next attempt's (same key): kept only when
    # the period has no time left for another
    state.put(schema.CREDIT_DKG, schema.epoch_key(period), {**record, "result": outcome})
    return formed
