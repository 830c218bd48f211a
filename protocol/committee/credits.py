"""Credit txs: a validator's epoch key, a payer's mint, a node's redemption.

    credit_key{epoch, key}          a validator publishes its RSA blind-signing key of `epoch`
                                    (DER SubjectPublicKeyInfo, hex)
    mint{payer, epoch, blinded, amount, expiry, signature}
                                    buy `count` credits of `epoch`: `blinded` is
                                    `[[validator address, [blinded hex × count]], ...]`;
                                    `signature` is the payer's EIP-712 `CreditPurchase` over
                                    `mint_id(payer, epoch, blinded)`
    fund_mint{mint}                 a validator vouches that the mint's payer can cover it: its
                                    own EVM read of the payer's prepaid balance at the escrow,
                                    less the payer's mints not yet debited there (node.watcher.
                                    funding); a mint is signed for only once vouched for by
                                    ≥ 2/3 of the power
    redeem{model, shard, credits}   a compute node presents credits it was paid with for work
                                    on (model, shard); each credit `[epoch, prepared hex,
                                    [[validator address, signature hex], ...]]`

The chain's rules: `abci_app/credits.py`; what a credit is: `protocol.credits`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import blindrsa
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
from protocol.credits import PREPARED_BYTES, Credit

MAX_MINT = 64  # blinded messages per mint (2048-bit: 512 hex chars each)
MAX_REDEEM = 64  # credits per redemption (the 64 KiB tx limit binds first)
MAX_SIGNERS = 128  # signatures listed on one credit
MAX_KEY_HEX = 2 * blindrsa.MAX_KEY_DER_BYTES
_MAX_MODULUS_HEX = 2 * (blindrsa.MAX_MODULUS_BITS // 8)
_HEX = re.compile(r"(?:[0-9a-f]{2})+\Z")
_VALIDATOR = re.compile(r"[0-9A-F]{40}\Z")
_PREPARED = re.compile(f"[0-9a-f]{{{2 * PREPARED_BYTES}}}\\Z")


def _hex(value: Any, where: str, max_len: int) -> bytes:
    return bytes.fromhex(check.text(value, where, _HEX, max_len))


@dataclass(frozen=True, slots=True)
class CreditKey:
    """A validator's RSA public key for blind-signing the credits of `epoch`."""

    epoch: int
    key: bytes  # DER SubjectPublicKeyInfo

    TYPE: ClassVar[str] = "credit_key"

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "key": self.key.hex()}

    @classmethod
    def from_json(cls, body: Any) -> CreditKey:
        b = check.exact_object(body, "body", {"epoch", "key"})
        return cls(
            epoch=check.integer(b["epoch"], "body.epoch", 1, U64),
            key=_hex(b["key"], "body.key", MAX_KEY_HEX),
        )


@dataclass(frozen=True, slots=True)
class Mint:
    """Buy `count` credits of `epoch` (the block's epoch), paid from `payer`'s prepaid balance:
    `blinded` maps each validator address to its `count` blinded messages (one per credit, under
    that validator's key of `epoch`)."""

    payer: str
    epoch: int
    blinded: Mapping[str, tuple[bytes, ...]]
    amount: int
    expiry: int
    signature: str

    TYPE: ClassVar[str] = "mint"

    @property
    def count(self) -> int:
        return len(next(iter(self.blinded.values())))

    def to_json(self) -> dict[str, Any]:
        return {
            "amount": str(self.amount),
            "blinded": [
                [address, [message.hex() for message in self.blinded[address]]]
                for address in sorted(self.blinded)
            ],
            "epoch": self.epoch,
            "expiry": self.expiry,
            "payer": self.payer,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, body: Any) -> Mint:
        b = check.exact_object(
            body, "body", {"amount", "blinded", "epoch", "expiry", "payer", "signature"}
        )
        rows = check.rows(b["blinded"], "body.blinded", 2, MAX_SIGNERS)
        if not rows:
            raise TxDecodeError("body.blinded: expected at least one validator")
        blinded: dict[str, tuple[bytes, ...]] = {}
        for address, messages in rows:
            address = check.text(address, "body.blinded[].validator", _VALIDATOR)
            items = check.items(messages, "body.blinded[].messages", MAX_MINT)
            blinded[address] = tuple(
                _hex(m, "body.blinded[].messages[]", _MAX_MODULUS_HEX) for m in items
            )
            if len(set(blinded[address])) != len(items):
                raise TxDecodeError("body.blinded: a blinded message is listed twice")
        addresses = [address for address, _ in rows]
        if addresses != sorted(set(addresses)):
            raise TxDecodeError("body.blinded: must be strictly ascending by validator address")
        if len({len(messages) for messages in blinded.values()}) != 1:
            raise TxDecodeError("body.blinded: every validator needs the same number of messages")
        return cls(
            payer=check.text(b["payer"], "body.payer", ADDRESS_LOWER),
            epoch=check.integer(b["epoch"], "body.epoch", 1, U64),
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


def parse_credit(item: Any, where: str = "body.credits[]") -> Credit:
    """One credit `[epoch, prepared hex, [[validator, signature hex], ...]]` from a peer, typed
    (sizes and shapes only: `protocol.credits.check_credit` verifies it), or TxDecodeError."""
    if not isinstance(item, list) or len(item) != 3:
        raise TxDecodeError(f"{where}: expected [epoch, prepared, signatures]")
    signatures = []
    for pair in check.rows(item[2], f"{where}.signatures", 2, MAX_SIGNERS):
        address = check.text(pair[0], f"{where}.signatures[].validator", _VALIDATOR)
        signatures.append((address, _hex(pair[1], f"{where}.signatures[].sig", _MAX_MODULUS_HEX)))
    if not signatures:
        raise TxDecodeError(f"{where}.signatures: expected at least one")
    return Credit(
        epoch=check.integer(item[0], f"{where}.epoch", 1, U64),
        prepared=bytes.fromhex(check.text(item[1], f"{where}.prepared", _PREPARED, 512)),
        signatures=tuple(signatures),
    )


@dataclass(frozen=True, slots=True)
class Redeem:
    """A compute node cashes credits it was paid with for work on (`model`, `shard`)."""

    model: str
    shard: int
    credits: tuple[Credit, ...]

    TYPE: ClassVar[str] = "redeem"

    def to_json(self) -> dict[str, Any]:
        return {
            "credits": [credit.to_json() for credit in self.credits],
            "model": self.model,
            "shard": self.shard,
        }

    @classmethod
    def from_json(cls, body: Any) -> Redeem:
        b = check.exact_object(body, "body", {"credits", "model", "shard"})
        credits = tuple(
            parse_credit(item) for item in check.items(b["credits"], "body.credits", MAX_REDEEM)
        )
        return cls(
            model=check.text(b["model"], "body.model", NAME),
            shard=check.integer(b["shard"], "body.shard", 0, 65535),
            credits=credits,
        )
