"""`MintSigner`: this validator posts its partial signatures for every funded mint, on chain.

A funded mint must gather t validators' partial signature sets on the chain by its signing
deadline, or its price goes back to its payer (abci_app/mint_partials.py). Each pass reads the
funded mints still short of t (`/mints?signing=true`, every page, by deadline) and, for each one
this validator has not signed yet (`signers`), signs the mint's one list of blinded points with
its key share of the mint's period (`<home>/credit_shares/`, written by the DKG driver,
node/watcher/credit_dkg.py): s_i = x_i · B per point (`blind_bls.partial_sign`, off the event
loop), sent as one `mint_partials` tx. The chain verifies the set before it keeps it.

A mint this validator holds no share for (a period before it joined) is skipped; a refused tx
is logged and the mint is tried again next pass unless the chain said it is done with it
(`PARTIALS_REPLAYED`, `MINT_SIGNING_CLOSED`). Each answer is checked at the boundary
(`signable`): a row that does not parse is refused by name and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from node.chain.committee_pages import read_pages
from node.watcher.payouts import Committee
from protocol import blind_bls, bls
from protocol.committee.credits import MAX_MINT, MintPartials
from protocol.credit_shares import CreditShareStore
from protocol.errors import PlanetError
from protocol.fields import Fields

log = logging.getLogger(__name__)

SIGNING_PAGE = 100  # mints a page: a row carries its points (up to 128 × 96 hex characters)
SIGNING_PAGES = 640  # pages a pass reads: 64,000 funded mints short of t (each one was paid for)
PARTIALS_REPLAYED = 88  # abci_app/codes.py: this validator's set is on the chain already
MINT_SIGNING_CLOSED = 89  # abci_app/codes.py: past the deadline, refunded
DONE_CODES = frozenset({PARTIALS_REPLAYED, MINT_SIGNING_CLOSED})
_MINT_ID = re.compile(r"0x[0-9a-f]{64}\Z")
_POINT = re.compile(rf"[0-9a-f]{{{2 * bls.G1_BYTES}}}\Z")
_ADDRESS = re.compile(r"[0-9A-F]{40}\Z")


class SigningAnswerError(PlanetError):
    """A `/mints?signing=true` row or `/credit_period` answer that does not parse."""

    code = "mint_signing_answer_invalid"


@dataclass(frozen=True)
class Signable:
    mint: str
    period: int
    points: tuple[bytes, ...]
    signers: frozenset[str]


def signable(row: Any) -> Signable:
    """One row of `/mints?signing=true`, typed (SigningAnswerError naming the field)."""
    check = Fields(SigningAnswerError)
    if not isinstance(row, dict):
        raise SigningAnswerError("/mints row: expected an object")
    mint = check.text(row.get("id"), "/mints id", _MINT_ID, 66)
    period = check.integer(row.get("period"), "/mints period", 0, (1 << 63) - 1)
    points = row.get("points")
    if not isinstance(points, list) or not 1 <= len(points) <= MAX_MINT:
        raise SigningAnswerError(f"/mints points: expected 1 to {MAX_MINT} points")
    parsed = tuple(
        bytes.fromhex(check.text(p, "/mints points[]", _POINT, 2 * bls.G1_BYTES)) for p in points
    )
    signers = row.get("signers")
    if not isinstance(signers, list):
        raise SigningAnswerError("/mints signers: expected a list")
    return Signable(
        mint,
        period,
        parsed,
        frozenset(check.text(s, "/mints signers[]", _ADDRESS, 40) for s in signers),
    )


def sign_set(share: int, points: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """s_i = x_i · B for every point, in the mint's order."""
    return tuple(blind_bls.partial_sign(share, point) for point in points)


@dataclass
class MintSigner:
    committee: Committee
    store: CreditShareStore
    addresses: dict[int, str] = field(default_factory=dict)  # period → this validator's address
    refused: int = 0  # rows refused at the boundary since start

    async def _address(self, period: int, index: int) -> str:
        known = self.addresses.get(period)
        if known is not None:
            return known
        answer = await self.committee.query("/credit_period", period=period)
        receivers = ((answer or {}).get("run") or {}).get("receivers")
        if not isinstance(receivers, list) or not 1 <= index <= len(receivers):
            raise SigningAnswerError(f"/credit_period {period}: no receiver {index}")
        address = receivers[index - 1][0] if isinstance(receivers[index - 1], list) else None
        if not isinstance(address, str) or not _ADDRESS.match(address):
            raise SigningAnswerError(f"/credit_period {period} receivers[{index - 1}]: no address")
        self.addresses[period] = address
        return address

    async def step(self) -> list[str]:
        """One pass; returns the ids of the mints whose partials it posted."""
        rows, whole = await read_pages(
            self.committee.query,
            "/mints",
            "mints",
            max_pages=SIGNING_PAGES,
            signing="true",
            limit=SIGNING_PAGE,
        )
        if not whole:
            log.warning("over %d funded mints wait for partials: the rest waits a pass", len(rows))
        posted: list[str] = []
        for row in rows:
            try:
                mint = signable(row)
            except SigningAnswerError as error:
                self.refused += 1
                log.error("mint row refused: %s", error.message)
                continue
            held = self.store.share(mint.period)
            if held is None:
                continue  # no share of that period here: the others sign it
            index, share = held
            address = await self._address(mint.period, index)
            if address in mint.signers:
                continue
            partials = await asyncio.to_thread(sign_set, share, mint.points)
            code, text = await self.committee.send(MintPartials(mint.mint, partials))
            if code != 0:
                if code not in DONE_CODES:
                    log.warning(
                        "mint_partials refused mint=%s code=%d %s", mint.mint[:18], code, text
                    )
                continue
            posted.append(mint.mint)
            log.info("posted partials mint=%s points=%d", mint.mint[:18], len(partials))
        return posted
