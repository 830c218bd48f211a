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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from node.watcher.payouts import Committee
from protocol import bls, dkg_wire
from protocol.committee.credit_dkg import DkgComplaint, DkgDeal, DkgJustify
from protocol.credit_dkg_run import box_private_of, config_of
from protocol.credit_periods import DkgWindow, KeySchedule
from protocol.credit_shares import CREDIT_SHARES_DIR, CreditShareStore
from protocol.dkg import (
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

log = logging.getLogger(__name__)

DkgBody = DkgDeal | DkgComplaint | DkgJustify


class DkgTxRefused(PlanetError):
    code = "dkg_tx_refused"

    def __init__(self, kind: str, period: int, tx_code: int, text: str) -> None:
        super().__init__(f"{kind} of key period {period} refused (code {tx_code}): {text}")


def plan(answer: dict[str, Any], key: SigningKey, store: CreditShareStore) -> list[DkgBody]:
    """What this validator sends next for the run in `answer` (a `/credit_period` answer), with
    the share store updated first (its deal's polynomial, the shares it opened, its final share)."""
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


@dataclass
class CreditDkgDriver:
    committee: Committee
    key: SigningKey  # the consensus key: signs the txs, its Curve25519 form opens the shares
    store: CreditShareStore

    @classmethod
    def of_validator(cls, committee: Committee, key: SigningKey, home: Path) -> CreditDkgDriver:
        return cls(committee, key, CreditShareStore(home / CREDIT_SHARES_DIR))

    async def step(self) -> list[DkgBody]:
        """One pass over the current key period and the next; returns what it sent."""
        now = await self.committee.query("/credit_period")
        if not now["run"] and now["committed_height"] == 0:
            return []
        sent: list[DkgBody] = []
        current = int(now["current_period"])
        for period in (current, current + 1):
            answer = now if period == int(now["period"]) else None
            if answer is None:
                answer = await self.committee.query("/credit_period", period=period)
            for body in plan(answer, self.key, self.store):
                code, text = await self.committee.send(body)
                if code != 0:
                    raise DkgTxRefused(body.TYPE, period, code, text)
                sent.append(body)
        return sent
