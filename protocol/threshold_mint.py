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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol import bls
from protocol.credit_periods import KeySchedule
from protocol.errors import ProtocolError

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


@dataclass(frozen=True)
class PeriodKey:
    """A key period's formed key, as `/credit_period` answers it."""

    period: int
    key: bls.G2
    threshold: int
    public_shares: Mapping[int, bytes]  # receiver index → X_i (compressed G2)
    index_of: Mapping[str, int]  # validator address → index

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> PeriodKey:
        run = answer.get("run") or {}
        result = run.get("result") or {}
        if "key" not in result:
            raise NoPeriodKey(
                f"key period {answer.get('period')} has no committee key yet",
                hint="the validators form each period's key in its first blocks: try again",
            )
        index_of = {address: i for i, (address, _) in enumerate(run["receivers"], start=1)}
        return cls(
            period=int(answer["period"]),
            key=bls.parse_g2(bytes.fromhex(result["key"]), "committee key"),
            threshold=int(result["threshold"]),
            public_shares={
                index_of[address]: bytes.fromhex(share)
                for address, share in result["public_shares"].items()
            },
            index_of=index_of,
        )
