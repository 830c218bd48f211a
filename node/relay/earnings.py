"""What a relay was paid (issue 43; docs/overlay.md "Relays are paid"): the credits users'
clients gave it in PAY cells, kept until it redeems them on the committee (node/relay/redeem.py).

Each credit is a file `<dir>/<spent id>.json` ({"credit": 176 hex}, 0600, written atomically)
so a restart redeems what the relay held; without a directory (tests) they are held in memory.
A credit given twice (a replayed note, or a client paying one credit to it again) is refused by
name (`pay_replayed`) and counted once; whether another party holds it too is the chain's call
(one spent set: the first redemption wins).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import parse_assignment
from protocol.errors import ProtocolError
from protocol.paid_credits import AssignedCredit, parse_paid_credit, spent_id, with_assignment

log = logging.getLogger(__name__)

SPOOL_DIR = "relay-credits"  # under the relay's home


class Earnings:
    """The credits a relay holds until redeemed."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self.held: dict[str, ThresholdCredit] = {}  # spent id -> credit
        self.known: set[str] = set()  # every spent id taken while the relay runs
        self.received = 0  # credits taken over the relay's life
        self.refused = 0  # credits given twice
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            for path in sorted(directory.glob("*.json")):
                try:
                    credit = _parse_held(json.loads(path.read_text()))
                except (OSError, ValueError, KeyError, TypeError, ProtocolError) as error:
                    log.warning("relay: %s is not a held credit (%s): left aside", path, error)
                    continue
                self.held[spent_id(credit)] = credit
        self.known.update(self.held)

    def take(self, credits: Sequence[ThresholdCredit]) -> int:
        """Keep `credits` (one PAY note's); how many were new."""
        taken = 0
        for credit in credits:
            identifier = spent_id(credit)
            if identifier in self.known:
                self.refused += 1
                log.info("relay: refused pay_replayed: credit %s… given twice", identifier[:16])
                continue
            self._write(identifier, credit)
            self.held[identifier] = credit
            self.known.add(identifier)
            taken += 1
        self.received += taken
        return taken

    def pending(self) -> list[ThresholdCredit]:
        return list(self.held.values())

    def settle(self, credits: Sequence[ThresholdCredit]) -> None:
        """Forget `credits`: redeemed, or refused by the chain for good. The spent id stays
        known in memory so the same credit is not taken again while the relay runs."""
        for credit in credits:
            identifier = spent_id(credit)
            if self.directory is not None:
                (self.directory / f"{identifier}.json").unlink(missing_ok=True)
            self.held.pop(identifier, None)

    def _write(self, identifier: str, credit: ThresholdCredit) -> None:
        if self.directory is None:
            return
        final = self.directory / f"{identifier}.json"
        partial = self.directory / f".{identifier}.part"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(_held_json(credit), out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)


def _held_json(credit: ThresholdCredit) -> dict[str, str]:
    """A held credit's file: its hex, and its holder's assignment to this relay if it has one."""
    doc = {"credit": credit.to_bytes().hex()}
    if isinstance(credit, AssignedCredit):
        doc["assignment"] = credit.assignment.hex()
    return doc


def _parse_held(doc: Any) -> ThresholdCredit:
    if not isinstance(doc, dict) or not {"credit"} <= set(doc) <= {"assignment", "credit"}:
        raise ValueError("expected {credit[, assignment]}")
    credit = parse_paid_credit(doc["credit"])
    if "assignment" in doc:
        return with_assignment(credit, parse_assignment(doc["assignment"], "assignment"))
    return credit
