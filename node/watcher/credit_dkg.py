"""`CreditDkgDriver`: this validator's part in each key period's on-chain DKG.

The chain runs the phases by height (abci_app/credit_dkg.py, protocol/credit_periods.py); the
watcher of every validator plays its participant. One `step()` reads `/credit_period` for the
current key period and the next, and for each run that names this validator:

    deal blocks       deal once: a fresh polynomial (`protocol.dkg.deal`), saved to the share
                      store BEFORE the `dkg_deal` tx is sent, so a restart answers complaints
                      with the same polynomial
    complaint blocks  open every deal (`open_share`, with the X25519 key mapped from the
                      consensus key); a `dkg_complaint` for each that does not open or verify
    justify blocks    a `dkg_justify` for each complaint against this validator
    key formed        the final share x_i (`final_share`, checked against the chain's X_i) into
                      `<home>/credit_shares/<period>.json` (0600); the polynomial is dropped

Decisions are made on committed state (`plan`: pure, testable without a network); a message the
chain already holds is never sent twice. A failure is logged and tried again next pass.

The next period's answer is read only when it can ask for something (`next_may_act`): its run is
configured (the committed height has reached the block that records it) and this validator's
share of it is not in the store yet. Otherwise `plan` would return nothing for it, so most
passes read `/credit_period` once, not twice.

Each `/credit_period` answer is checked at the boundary (`checked_answer`) before `plan` reads
it: every field it uses typed and in range, the deals decodable, the receivers' keys ed25519
points, a formed key through `PeriodKey.from_answer`. An answer that does not pass (a bug, a
corrupted store) is refused by name (`PeriodAnswerError`, code `credit_period_invalid`, naming
the field), logged as an error and counted in `refused`; that period is left alone this pass,
the other one is still played, and the watcher's loop goes on.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from node.watcher.payouts import Committee
from protocol import bls, dkg_wire
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.credit_dkg_run import box_key_of, box_private_of, config_of
from protocol.credit_periods import DkgWindow, KeySchedule
from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore
from protocol.dkg import (
    MAX_PARTICIPANTS,
    Complaint,
    DealerSecret,
    DkgConfig,
    DkgError,
    DkgResult,
    deal,
    final_share,
    justify,
    open_share,
)
from protocol.errors import PlanetError
from protocol.fields import Fields
from protocol.threshold_mint import MAX_PERIOD, PeriodAnswerError, PeriodKey

log = logging.getLogger(__name__)

DkgBody = DkgDeal | DkgComplaint | DkgJustify


class DkgTxRefused(PlanetError):
    code = "dkg_tx_refused"

    def __init__(self, kind: str, period: int, tx_code: int, text: str) -> None:
        super().__init__(f"{kind} of key period {period} refused (code {tx_code}): {text}")


MAX_HEIGHT = (1 << 63) - 1
_ADDRESS = re.compile(r"[0-9A-F]{40}\Z")  # a CometBFT validator address
_HEX32 = re.compile(r"[0-9a-f]{64}\Z")  # a session id, an ed25519 key, a scalar
_G2 = re.compile(rf"[0-9a-f]{{{2 * bls.G2_BYTES}}}\Z")
_HEX = re.compile(r"(?:[0-9a-f]{2})+\Z")
_DEALER = re.compile(r"[1-9][0-9]{0,3}\Z")


def checked_answer(answer: Any, period: int | None = None) -> dict[str, Any]:
    """`answer`, a `/credit_period` answer (of `period`, when given), once every field `plan`
    reads is of its type and range; `PeriodAnswerError` naming the first field that is not
    (abci_app/period_queries.py writes it)."""
    check = Fields(PeriodAnswerError)
    if not isinstance(answer, dict):
        raise PeriodAnswerError("/credit_period: expected an object")
    number = check.integer(answer.get("period"), "/credit_period period", 0, MAX_PERIOD)
    if period is not None and number != period:
        raise PeriodAnswerError(f"/credit_period period: asked for {period}, answered {number}")
    check.integer(answer.get("current_period"), "/credit_period current_period", 0, MAX_PERIOD)
    check.integer(answer.get("committed_height"), "/credit_period committed_height", 0, MAX_HEIGHT)
    for name in ("key_period_blocks", "dkg_phase_blocks"):
        check.integer(answer.get(name), f"/credit_period {name}", 1, MAX_HEIGHT)
    run = answer.get("run")
    if run is None:
        return answer
    if not isinstance(run, dict):
        raise PeriodAnswerError("/credit_period run: expected an object or null")
    _check_run(check, run)
    result = run.get("result")
    if result is not None and not isinstance(result, dict):
        raise PeriodAnswerError("/credit_period run.result: expected an object or null")
    if result is not None and "key" in result:
        _check_result(check, PeriodKey.from_answer(answer, period=number), result, run)
    return answer


def _check_result(
    check: Fields, formed: PeriodKey, result: dict[str, Any], run: dict[str, Any]
) -> None:
    """A formed key's fields beyond `PeriodKey` (its key, threshold and shares): a public share
    for every receiver, the qualified dealers, `threshold` commitments."""
    where = "/credit_period run.result"
    count = len(run["receivers"])
    if len(formed.public_shares) != count:
        raise PeriodAnswerError(f"{where}.public_shares: expected one for each of {count}")
    for dealer in check.items(result.get("qualified"), f"{where}.qualified", count):
        check.integer(dealer, f"{where}.qualified[]", 1, count)
    commitments = check.items(result.get("commitments"), f"{where}.commitments", count)
    if len(commitments) != formed.threshold:
        raise PeriodAnswerError(f"{where}.commitments: expected {formed.threshold}")
    for commitment in commitments:
        check.text(commitment, f"{where}.commitments[]", _G2, 2 * bls.G2_BYTES)


def _check_run(check: Fields, run: dict[str, Any]) -> None:
    where = "/credit_period run"
    check.text(run.get("session"), f"{where}.session", _HEX32, 64)
    check.integer(run.get("attempt"), f"{where}.attempt", 0, MAX_HEIGHT)
    check.integer(run.get("start"), f"{where}.start", 0, MAX_HEIGHT)
    receivers = check.rows(run.get("receivers"), f"{where}.receivers", 2, MAX_PARTICIPANTS)
    if not receivers:
        raise PeriodAnswerError(f"{where}.receivers: a run has receivers")
    for i, (address, public) in enumerate(receivers):
        check.text(address, f"{where}.receivers[{i}] address", _ADDRESS, 40)
        check.text(public, f"{where}.receivers[{i}] key", _HEX32, 64)
        try:
            box_key_of(bytes.fromhex(public))
        except DkgError as error:
            raise PeriodAnswerError(f"{where}.receivers[{i}] key: {error.reason}") from None
    count = len(receivers)
    deals = run.get("deals")
    if not isinstance(deals, dict):
        raise PeriodAnswerError(f"{where}.deals: expected an object")
    for dealer, data in deals.items():
        check.text(dealer, f"{where}.deals dealer", _DEALER, 4)
        check.integer(int(dealer), f"{where}.deals dealer", 1, count)
        check.text(data, f"{where}.deals[{dealer}]", _HEX, 2 * dkg_wire.MAX_DEAL_BYTES)
        try:
            dkg_wire.decode_deal(bytes.fromhex(data))
        except DkgError as error:
            raise PeriodAnswerError(f"{where}.deals[{dealer}]: {error.reason}") from None
    for pair in check.rows(run.get("complaints"), f"{where}.complaints", 2, count * count):
        for index in pair:
            check.integer(index, f"{where}.complaints[]", 1, count)
    for row in check.rows(run.get("justifications"), f"{where}.justifications", 3, count * count):
        check.integer(row[0], f"{where}.justifications[] dealer", 1, count)
        check.integer(row[1], f"{where}.justifications[] receiver", 1, count)
        check.text(row[2], f"{where}.justifications[] share", _HEX32, 64)


def plan(answer: dict[str, Any], key: SigningKey, store: CreditShareStore) -> list[DkgBody]:
    """What this validator sends next for the run in `answer` (a `/credit_period` answer that
    `checked_answer` passed), with the share store updated first (its deal's polynomial, the
    shares it opened, its final share)."""
    run = answer.get("run")
    period = int(answer["period"])
    if run is None:
        return []
    mine = key.verify_key.encode().hex()
    keys = [pub for _, pub in run["receivers"]]
    if mine not in keys:
        return []
    index = keys.index(mine) + 1
    config = config_of(bytes.fromhex(run["session"]), [bytes.fromhex(k) for k in keys])
    schedule = KeySchedule(int(answer["key_period_blocks"]), int(answer["dkg_phase_blocks"]))
    window = schedule.window_from(int(run["start"]), int(answer["committed_height"]) + 1)
    attempt = int(run["attempt"])
    doc = store.load(period)
    if doc is not None and doc.get("share"):
        return []
    if doc is None or doc.get("attempt", 0) != attempt:  # a new attempt: deal afresh
        doc = {"index": index, "attempt": attempt, "polynomial": None, "opened": {}, "share": None}
    deals = {int(d): dkg_wire.decode_deal(bytes.fromhex(h)) for d, h in run["deals"].items()}
    if window is DkgWindow.DEAL and index not in deals:
        if doc["polynomial"] is None:
            dealt, secret = deal(config, index)
            doc["polynomial"] = [bls.scalar_bytes(c).hex() for c in secret.polynomial]
            doc["deal"] = dkg_wire.encode_deal(dealt).hex()
            store.save(period, doc)
        return [DkgDeal(period, bytes.fromhex(doc["deal"]))]
    box = box_private_of(key)
    for dealer, dealt in sorted(deals.items()):
        if str(dealer) not in doc["opened"]:
            share = open_share(config, index, box, dealt)
            doc["opened"][str(dealer)] = None if share is None else bls.scalar_bytes(share).hex()
    store.save(period, doc)
    complained = {(d, r) for d, r in run["complaints"]}
    if window is DkgWindow.COMPLAINT:
        return [
            DkgComplaint(period, int(dealer))
            for dealer, share in sorted(doc["opened"].items(), key=lambda kv: int(kv[0]))
            if share is None and (int(dealer), index) not in complained
        ]
    if window is DkgWindow.JUSTIFY and doc["polynomial"] is not None:
        answered = {(d, r) for d, r, _ in run["justifications"]}
        secret = DealerSecret(index, tuple(int(c, 16) for c in doc["polynomial"]))
        return [
            DkgJustify(period, receiver, answer_.share)
            for dealer, receiver in sorted(complained)
            if dealer == index and (dealer, receiver) not in answered
            for answer_ in [justify(secret, Complaint(receiver, dealer))]
        ]
    result = run.get("result")
    if result and "key" in result:
        _finish(period, index, config, result, run, doc, store)
    return []


def _finish(
    period: int,
    index: int,
    config: DkgConfig,
    result: dict[str, Any],
    run: dict[str, Any],
    doc: dict[str, Any],
    store: CreditShareStore,
) -> None:
    address = run["receivers"][index - 1][0]
    revealed = {(d, r): int(s, 16) for d, r, s in run["justifications"]}
    outcome = DkgResult(
        qualified=tuple(result["qualified"]),
        commitments=tuple(bytes.fromhex(c) for c in result["commitments"]),
        public_shares={index: bytes.fromhex(result["public_shares"][address])},
        revealed=revealed,
        threshold=int(result["threshold"]),
    )
    opened = {int(d): int(s, 16) for d, s in doc["opened"].items() if s is not None}
    try:
        share = final_share(config, outcome, index, opened)
    except DkgError as error:
        log.error("credit key period %d: this validator holds no share: %s", period, error.reason)
        doc["share_error"] = error.reason
        store.save(period, doc)
        return
    store.save(
        period,
        {
            "index": index,
            "polynomial": None,
            "opened": {},
            "share": bls.scalar_bytes(share).hex(),
            "public_share": result["public_shares"][address],
            "key": result["key"],
        },
    )
    log.info("credit key period %d: share formed (index %d)", period, index)


def next_may_act(now: dict[str, Any], period: int, store: CreditShareStore) -> bool:
    """Whether `plan` could send anything for `period` (after the period of `now`, a checked
    current-period answer): False while the chain has not recorded its run's config yet (the
    run is null until the end of block `dkg_config_height`) and once this validator's share of
    it is stored (`plan` returns nothing then)."""
    schedule = KeySchedule(int(now["key_period_blocks"]), int(now["dkg_phase_blocks"]))
    if int(now["committed_height"]) < schedule.dkg_config_height(period):
        return False
    doc = store.load(period)
    return not (doc is not None and doc.get("share"))


@dataclass
class CreditDkgDriver:
    committee: Committee
    key: SigningKey  # the consensus key: signs the txs, its Curve25519 form opens the shares
    store: CreditShareStore
    refused: int = 0  # `/credit_period` answers refused since start (each logged by name)
    committed_height: int | None = None  # of this pass's checked answer (None: not read)

    @classmethod
    def of_validator(cls, committee: Committee, key: SigningKey, home: Path) -> CreditDkgDriver:
        return cls(committee, key, CreditShareStore(home / CREDIT_SHARES_DIR))

    async def step(self) -> list[DkgBody]:
        """One pass over the current key period and the next; returns what it sent. A period
        whose answer is refused (`checked_answer`) is skipped this pass, logged by name."""
        self.committed_height = None
        now = await self._read(None)
        if now is not None:
            self.committed_height = int(now["committed_height"])  # the other steps' height
        if now is None or (not now["run"] and now["committed_height"] == 0):
            return []
        sent: list[DkgBody] = []
        current = now["current_period"]
        for period in (current, current + 1):
            if period != now["period"] and not next_may_act(now, period, self.store):
                continue  # no run configured yet, or its share formed: nothing to send
            answer = now if period == now["period"] else await self._read(period)
            if answer is None:
                continue
            for body in plan(answer, self.key, self.store):
                code, text = await self.committee.send(body)
                if code != 0:
                    raise DkgTxRefused(body.TYPE, period, code, text)
                sent.append(body)
        return sent

    async def _read(self, period: int | None) -> dict[str, Any] | None:
        """The checked `/credit_period` answer (the current period's without `period`), or
        None when it is refused: logged as an error naming the field, counted in `refused`."""
        params = {} if period is None else {"period": period}
        answer = await self.committee.query("/credit_period", **params)
        try:
            return checked_answer(answer, period)
        except PeriodAnswerError as error:
            self.refused += 1
            log.error(
                "credit key period %s: /credit_period answer refused code=%s: %s",
                "current" if period is None else period,
                error.code,
                error.message,
            )
            return None
