"""What a threshold-BLS mint binds, and where a key period's credits sit in epoch time.

    mint id = 0x sha256(THRESHOLD_MINT_DOMAIN ‖ payer (lowercase) ‖ period (8 bytes) ‖
                        count (2 bytes) ‖ blinded_1 ‖ … ‖ blinded_N)     (each 48 bytes)

ONE list of blinded G1 points per mint: every validator signs that same list, so a mint of N
buys N credits whatever the payer does (`protocol.blind_bls`). The payer's EIP-712
`CreditPurchase` signs this id (a domain of its own, v2: no id of the retired RSA mints,
`planet-mint/v1`, can equal one).

A credit of key period p is redeemable as a credit of its *issue epoch*: the settlement epoch of
the period's last block (`issue_epoch`), for `credits.lifetime_epochs` epochs after it. The
credit pool's accounting (`cissue/<epoch>`, settlement.py) uses that epoch unchanged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol import bls
from protocol.credit_periods import KeySchedule
from protocol.dkg import MAX_PARTICIPANTS
from protocol.errors import ProtocolError
from protocol.fields import Fields

THRESHOLD_MINT_DOMAIN: Final = b"planet-mint/v2\n"


def threshold_mint_id(payer: str, period: int, blinded: Sequence[bytes]) -> str:
    digest = hashlib.sha256(
        THRESHOLD_MINT_DOMAIN
        + payer.lower().encode()
        + period.to_bytes(8, "big")
        + len(blinded).to_bytes(2, "big")
    )
    for point in blinded:
        digest.update(point)
    return "0x" + digest.hexdigest()


def issue_epoch(schedule: KeySchedule, period: int, epoch_length: int) -> int:
    """The settlement epoch a credit of `period` counts in: that of the period's last block
    (epochs are 1-based: heights (e − 1)·L + 1 … e·L are epoch e)."""
    return max(1, (schedule.period_end(period) - 1) // epoch_length + 1)


def period_redeemable(
    schedule: KeySchedule, period: int, epoch_length: int, current_epoch: int, lifetime: int
) -> bool:
    """The chain's window for a credit of `period` in settlement epoch `current_epoch`: its
    period has started (it cannot be otherwise: the key signs only mints of its period) and
    current ≤ issue epoch + lifetime."""
    first = max(1, (schedule.period_start(period) - 1) // epoch_length + 1)
    return first <= current_epoch <= issue_epoch(schedule, period, epoch_length) + lifetime


class NoPeriodKey(ProtocolError):
    """The key period has no committee key (its DKG is running, or failed)."""

    code = "no_period_key"


class PeriodAnswerError(ProtocolError):
    """A `/credit_period` answer that does not parse into a `PeriodKey`: a field missing or of
    the wrong type, a value that is not lowercase hex, or a key that is not a G2 point of the
    subgroup. The message names the field. The validator that answered is at fault, not the
    credit or the purchase: a node does not take the credit (`credit_not_taken`), a client
    stops its purchase by name."""

    code = "credit_period_invalid"


_ADDRESS = re.compile(r"[0-9A-F]{40}\Z")  # a CometBFT validator address (abci_app/state.py)
_G2_HEX = re.compile(rf"[0-9a-f]{{{2 * bls.G2_BYTES}}}\Z")
MAX_PERIOD: Final = (1 << 63) - 1


def _g2(value: Any, where: str) -> bls.G2:
    """A compressed G2 point as the chain writes it (lowercase hex), parsed strictly."""
    if not isinstance(value, str) or not _G2_HEX.match(value):
        raise PeriodAnswerError(f"{where}: expected {2 * bls.G2_BYTES} lowercase hex digits")
    try:
        return bls.parse_g2(bytes.fromhex(value), where)
    except bls.BlsError as error:
        raise PeriodAnswerError(error.message) from None


@dataclass(frozen=True)
class PeriodKey:
    """A key period's formed key, as `/credit_period` answers it."""

    period: int
    key: bls.G2
    threshold: int
    public_shares: Mapping[int, bytes]  # receiver index → X_i (compressed G2, checked)
    index_of: Mapping[str, int]  # validator address → index

    @classmethod
    def from_answer(cls, answer: Any, *, period: int | None = None) -> PeriodKey:
        """The formed key of a `/credit_period` answer (of `period`, when given): NoPeriodKey
        while it is not formed, PeriodAnswerError, naming the field, for an answer that does
        not parse (abci_app/period_queries.py writes it)."""
        check = Fields(PeriodAnswerError)
        if not isinstance(answer, Mapping):
            raise PeriodAnswerError("/credit_period: expected an object")
        number = check.integer(answer.get("period"), "/credit_period period", 0, MAX_PERIOD)
        if period is not None and number != period:
            raise PeriodAnswerError(
                f"/credit_period period: asked for key period {period}, answered {number}"
            )
        run = answer.get("run")
        if run is not None and not isinstance(run, Mapping):
            raise PeriodAnswerError("/credit_period run: expected an object or null")
        result = None if run is None else run.get("result")
        if result is not None and not isinstance(result, Mapping):
            raise PeriodAnswerError("/credit_period run.result: expected an object or null")
        if run is None or result is None or "key" not in result:
            raise NoPeriodKey(
                f"key period {number} has no committee key yet",
                hint="the validators form each period's key in its first blocks: try again",
            )
        receivers = check.rows(
            run.get("receivers"), "/credit_period run.receivers", 2, MAX_PARTICIPANTS
        )
        if not receivers:
            raise PeriodAnswerError("/credit_period run.receivers: no receivers under a key")
        index_of: dict[str, int] = {}
        for i, (address, _) in enumerate(receivers, start=1):
            check.text(address, f"/credit_period run.receivers[{i - 1}]", _ADDRESS, 40)
            if address in index_of:
                raise PeriodAnswerError(f"/credit_period run.receivers: {address} listed twice")
            index_of[address] = i
        threshold = check.integer(
            result.get("threshold"),
            "/credit_period run.result.threshold",
            1,
            len(receivers),
        )
        shares = result.get("public_shares")
        if not isinstance(shares, Mapping):
            raise PeriodAnswerError("/credit_period run.result.public_shares: expected an object")
        public_shares: dict[int, bytes] = {}
        for address, share in shares.items():
            where = f"/credit_period run.result.public_shares[{ascii(address)[:48]}]"
            if address not in index_of:
                raise PeriodAnswerError(f"{where}: not a receiver of the run")
            public_shares[index_of[address]] = bls.g2_bytes(_g2(share, where))
        return cls(
            period=number,
            key=_g2(result.get("key"), "/credit_period run.result.key"),
            threshold=threshold,
            public_shares=public_shares,
            index_of=index_of,
        )
