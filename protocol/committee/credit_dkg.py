"""Credit DKG txs: one validator's message of the on-chain key generation of a key period.

    dkg_deal{period, deal}               the signer's `protocol.dkg.Deal` (canonical bytes of
                                         `protocol.dkg_wire.encode_deal`, hex); its dealer index
                                         must be the signer's index in the period's run
    dkg_complaint{period, dealer}        the signer (a receiver) complains about `dealer`'s share
    dkg_justify{period, receiver, share} the signer (a dealer) reveals the share it dealt to
                                         `receiver` (32-byte scalar, hex), answering a complaint

Sender fields are not carried: the chain takes the dealer or receiver index from the tx's
signer (a validator's consensus key), so no validator can speak for another.
The chain's rules: `abci_app/credit_dkg.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol import bls
from protocol.committee.grammar import U64, check
from protocol.dkg import MAX_PARTICIPANTS
from protocol.dkg_wire import MAX_DEAL_BYTES

_HEX = re.compile(r"(?:[0-9a-f]{2})+\Z")
_SCALAR_HEX = re.compile(f"[0-9a-f]{{{2 * bls.SCALAR_BYTES}}}\\Z")


@dataclass(frozen=True, slots=True)
class DkgDeal:
    period: int
    deal: bytes  # dkg_wire.encode_deal

    TYPE: ClassVar[str] = "dkg_deal"

    def to_json(self) -> dict[str, Any]:
        return {"deal": self.deal.hex(), "period": self.period}

    @classmethod
    def from_json(cls, body: Any) -> DkgDeal:
        b = check.exact_object(body, "body", {"deal", "period"})
        return cls(
            period=check.integer(b["period"], "body.period", 0, U64),
            deal=bytes.fromhex(check.text(b["deal"], "body.deal", _HEX, 2 * MAX_DEAL_BYTES)),
        )


@dataclass(frozen=True, slots=True)
class DkgComplaint:
    period: int
    dealer: int

    TYPE: ClassVar[str] = "dkg_complaint"

    def to_json(self) -> dict[str, Any]:
        return {"dealer": self.dealer, "period": self.period}

    @classmethod
    def from_json(cls, body: Any) -> DkgComplaint:
        b = check.exact_object(body, "body", {"dealer", "period"})
        return cls(
            period=check.integer(b["period"], "body.period", 0, U64),
            dealer=check.integer(b["dealer"], "body.dealer", 1, MAX_PARTICIPANTS),
        )


@dataclass(frozen=True, slots=True)
class DkgJustify:
    period: int
    receiver: int
    share: bytes  # 32 bytes, big-endian scalar

    TYPE: ClassVar[str] = "dkg_justify"

    def to_json(self) -> dict[str, Any]:
        return {"period": self.period, "receiver": self.receiver, "share": self.share.hex()}

    @classmethod
    def from_json(cls, body: Any) -> DkgJustify:
        b = check.exact_object(body, "body", {"period", "receiver", "share"})
        return cls(
            period=check.integer(b["period"], "body.period", 0, U64),
            receiver=check.integer(b["receiver"], "body.receiver", 1, MAX_PARTICIPANTS),
            share=bytes.fromhex(check.text(b["share"], "body.share", _SCALAR_HEX)),
        )
