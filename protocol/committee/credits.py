"""Credit txs: a payer's mint, a validator's vouch for it, a node's redemption.

    credit_mint{payer, period, blinded, amount, expiry, signature}
                                  buy len(blinded) credits of key period `period` (the
                                  block's): `blinded` is ONE list of distinct 48-byte
                                  compressed G1 points (hex) that every validator signs;
                                  `signature` is the payer's EIP-712 `CreditPurchase` over
                                  `threshold_mint_id(payer, period, blinded)`
    fund_mint{mint}               a validator vouches that the mint's payer can cover it: its
                                  own EVM read of the payer's prepaid balance at the escrow,
                                  less the payer's mints not yet debited there (node.watcher.
                                  funding); a mint is signed for only once vouched for by
                                  ≥ 2/3 of the power
    mint_partials{mint, partials}  a validator posts its partial signatures s_i = x_i · B for
                                  every blinded point of a funded mint, in the mint's order
                                  (48-byte compressed G1 points, hex), under its share of the
                                  mint's key period: the client combines t posted sets
    credit_redeem{model, shard, credits[, assignments]}
                                  a compute node cashes credits it was paid with (each 88
                                  bytes hex: period ‖ nonce ‖ σ, `protocol.blind_bls.
                                  ThresholdCredit`) for work on (model, shard); `assignments`
                                  (holder-bound credits, `protocol.committee.credit_holder`): each
                                  credit's holder's assignment of it to this node on (model,
                                  shard), 128 lowercase hex, one per credit in their order

The chain's rules: `abci_app/credits.py`. The per-validator RSA `mint` and `redeem` of before
are no tx kinds any more: the envelope refuses them as unknown, like any other name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import parse_assignment
from protocol.committee.grammar import (
    ADDRESS_LOWER,
    HEX32_0X,
    NAME,
    SIG65,
    U64,
    TxDecodeError,
    check,
    uint256_decimal,
)

MAX_MINT = 128  # blinded points per mint (a 128-point credit_mint: ~14 KB, ~14 ms of FinalizeBlock)
MAX_REDEEM = 64  # credits per redemption
_POINT = re.compile(f"[0-9a-f]{{{2 * bls.G1_BYTES}}}\\Z")
_CREDIT = re.compile(f"[0-9a-f]{{{2 * blind_bls.CREDIT_BYTES}}}\\Z")


@dataclass(frozen=True, slots=True)
class CreditMint:
    """Buy `count` credits of key period `period`, paid from `payer`'s prepaid balance."""

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
    def from_json(cls, body: Any) -> CreditMint:
        b = check.exact_object(
            body, "body", {"amount", "blinded", "expiry", "payer", "period", "signature"}
        )
        items = check.items(b["blinded"], "body.blinded", MAX_MINT)
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


@dataclass(frozen=True, slots=True)
class FundMint:
    """A validator vouches that mint `mint` (its id, 0x hex) is covered by its payer's balance."""

    mint: str

    TYPE: ClassVar[str] = "fund_mint"

    def to_json(self) -> dict[str, Any]:
        return {"mint": self.mint}

    @classmethod
    def from_json(cls, body: Any) -> FundMint:
        b = check.exact_object(body, "body", {"mint"})
        return cls(mint=check.text(b["mint"], "body.mint", HEX32_0X))


@dataclass(frozen=True, slots=True)
class MintPartials:
    """A validator's partial signatures for funded mint `mint`, one per blinded point."""

    mint: str
    partials: tuple[bytes, ...]

    TYPE: ClassVar[str] = "mint_partials"

    def to_json(self) -> dict[str, Any]:
        return {"mint": self.mint, "partials": [p.hex() for p in self.partials]}

    @classmethod
    def from_json(cls, body: Any) -> MintPartials:
        b = check.exact_object(body, "body", {"mint", "partials"})
        items = check.items(b["partials"], "body.partials", MAX_MINT)
        if not items:
            raise TxDecodeError("body.partials: expected at least one partial signature")
        return cls(
            mint=check.text(b["mint"], "body.mint", HEX32_0X),
            partials=tuple(
                bytes.fromhex(check.text(p, "body.partials[]", _POINT, 2 * bls.G1_BYTES))
                for p in items
            ),
        )


def parse_credit(item: Any, where: str = "body.credits[]") -> ThresholdCredit:
    """One credit (176 hex chars) from a peer, typed: strict point parsing of σ (its validity
    under the period's key is the chain's or the node's check), or TxDecodeError."""
    raw = bytes.fromhex(check.text(item, where, _CREDIT, 2 * blind_bls.CREDIT_BYTES))
    try:
        return ThresholdCredit.from_bytes(raw)
    except (bls.BlsError, blind_bls.ThresholdCreditError) as error:
        raise TxDecodeError(f"{where}: {error.message}") from None


@dataclass(frozen=True, slots=True)
class CreditRedeem:
    """A compute node cashes credits it was paid with for work on (`model`, `shard`)."""

    model: str
    shard: int
    credits: tuple[ThresholdCredit, ...]
    assignments: tuple[bytes, ...] = ()  # one per credit (holder-bound credits), or none

    TYPE: ClassVar[str] = "credit_redeem"

    def to_json(self) -> dict[str, Any]:
        return {
            **assignments_json(self.assignments),
            "credits": [credit.to_bytes().hex() for credit in self.credits],
            "model": self.model,
            "shard": self.shard,
        }

    @classmethod
    def from_json(cls, body: Any) -> CreditRedeem:
        keys = {"credits", "model", "shard"}
        b = check.exact_object(body, "body", keys | ({"assignments"} & set(_keys(body))))
        items = check.items(b["credits"], "body.credits", MAX_REDEEM)
        return cls(
            model=check.text(b["model"], "body.model", NAME),
            shard=check.integer(b["shard"], "body.shard", 0, 65535),
            credits=tuple(parse_credit(item) for item in items),
            assignments=parse_assignments(b.get("assignments"), len(items)),
        )


def _keys(body: Any) -> list[str]:
    return list(body) if isinstance(body, dict) else []


def assignments_json(assignments: tuple[bytes, ...]) -> dict[str, Any]:
    """The `assignments` field of a redemption (absent when it carries none)."""
    return {"assignments": [a.hex() for a in assignments]} if assignments else {}


def parse_assignments(value: Any, count: int) -> tuple[bytes, ...]:
    """A redemption's `assignments` (None: the field is absent): exactly one per credit."""
    if value is None:
        return ()
    items = check.items(value, "body.assignments", MAX_REDEEM)
    if len(items) != count:
        raise TxDecodeError(f"body.assignments: {len(items)} for {count} credits, one each")
    return tuple(parse_assignment(item, "body.assignments[]") for item in items)
