"""Threshold-BLS credit txs: a mint with ONE list of blinded points, a redemption of 88-byte
credits (`protocol.blind_bls.ThresholdCredit`).

    credit_mint{payer, period, blinded, amount, expiry, signature}
                                  buy len(blinded) credits of key `period` (the block's):
                                  `blinded` is one list of distinct 48-byte compressed G1 points
                                  (hex); `signature` the payer's EIP-712 `CreditPurchase` over
                                  `threshold_mint_id(payer, period, blinded)`
    credit_redeem{model, shard, credits}
                                  a compute node cashes credits (each 88 bytes hex: period ‖
                                  nonce ‖ σ) for work on (model, shard)

The chain's rules: `abci_app/threshold_credits.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import MAX_REDEEM
from protocol.committee.grammar import (
    ADDRESS_LOWER,
    NAME,
    SIG65,
    U64,
    TxDecodeError,
    check,
    uint256_decimal,
)

MAX_THRESHOLD_MINT = 64  # blinded points per mint
_POINT = re.compile(f"[0-9a-f]{{{2 * bls.G1_BYTES}}}\\Z")
_CREDIT = re.compile(f"[0-9a-f]{{{2 * blind_bls.CREDIT_BYTES}}}\\Z")


@dataclass(frozen=True, slots=True)
class ThresholdMint:
    payer: str
    period: int
    blinded: tuple[bytes, ...]
    amount: int
    expiry: int
    signature: str

    TYPE: ClassVar[str] = "credit_mint"

    @property
    def count(self) -> int:
        return len(self.blinded)

    def to_json(self) -> dict[str, Any]:
        return {
            "amount": str(self.amount),
            "blinded": [point.hex() for point in self.blinded],
            "expiry": self.expiry,
            "payer": self.payer,
            "period": self.period,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, body: Any) -> ThresholdMint:
        b = check.exact_object(
            body, "body", {"amount", "blinded", "expiry", "payer", "period", "signature"}
        )
        items = check.items(b["blinded"], "body.blinded", MAX_THRESHOLD_MINT)
        if not items:
            raise TxDecodeError("body.blinded: expected at least one blinded point")
        blinded = tuple(
            bytes.fromhex(check.text(p, "body.blinded[]", _POINT, 2 * bls.G1_BYTES)) for p in items
        )
        if len(set(blinded)) != len(blinded):
            raise TxDecodeError("body.blinded: a blinded point is listed twice")
        return cls(
            payer=check.text(b["payer"], "body.payer", ADDRESS_LOWER),
            period=check.integer(b["period"], "body.period", 0, U64),
            blinded=blinded,
            amount=uint256_decimal(b["amount"], "body.amount"),
            expiry=check.integer(b["expiry"], "body.expiry", 0, U64),
            signature=check.text(b["signature"], "body.signature", SIG65),
        )


def parse_threshold_credit(item: Any, where: str = "body.credits[]") -> ThresholdCredit:
    """One credit (176 hex chars) from a peer, typed: strict point parsing of σ (its validity
    under the period's key is the chain's or the node's check), or TxDecodeError."""
    raw = bytes.fromhex(check.text(item, where, _CREDIT, 2 * blind_bls.CREDIT_BYTES))
    try:
        return ThresholdCredit.from_bytes(raw)
    except (bls.BlsError, blind_bls.ThresholdCreditError) as error:
        raise TxDecodeError(f"{where}: {error.message}") from None


@dataclass(frozen=True, slots=True)
class ThresholdRedeem:
    model: str
    shard: int
    credits: tuple[ThresholdCredit, ...]

    TYPE: ClassVar[str] = "credit_redeem"

    def to_json(self) -> dict[str, Any]:
        return {
            "credits": [credit.to_bytes().hex() for credit in self.credits],
            "model": self.model,
            "shard": self.shard,
        }

    @classmethod
    def from_json(cls, body: Any) -> ThresholdRedeem:
        b = check.exact_object(body, "body", {"credits", "model", "shard"})
        items = check.items(b["credits"], "body.credits", MAX_REDEEM)
        return cls(
            model=check.text(b["model"], "body.model", NAME),
            shard=check.integer(b["shard"], "body.shard", 0, 65535),
            credits=tuple(parse_threshold_credit(item) for item in items),
        )
