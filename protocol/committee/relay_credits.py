"""The relay's redemption: a registered relay cashes the credits users' clients paid it with for
cloves that arrived (docs/overlay.md "Relays are paid"; issue 43).

    relay_redeem{credits[, assignments]}
                                  a relay (role `relay`, not LEFT) redeems credits (each 88
                                  bytes hex: period ‖ nonce ‖ σ), at most MAX_REDEEM, no credit
                                  twice; `assignments` (holder-bound credits,
                                  committee/credit_holder.py): each credit's holder's
                                  assignment of it to this relay's registered X25519 key, one
                                  per credit

The chain's rules: `abci_app/relay_credits.py`. The tx carries no clove count and no served
positions: a relay is paid only after the path's exit acknowledged its cloves (the client
checks that before it pays), so the chain checks the credits alone — one spent set for nodes
and relays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import (
    MAX_REDEEM,
    assignments_json,
    parse_assignments,
    parse_credit,
)
from protocol.committee.grammar import check


@dataclass(frozen=True, slots=True)
class RelayRedeem:
    """A relay cashes `credits` it was paid with for carrying cloves."""

    credits: tuple[ThresholdCredit, ...]
    assignments: tuple[bytes, ...] = ()  # one per credit (holder-bound credits), or none

    TYPE: ClassVar[str] = "relay_redeem"

    def to_json(self) -> dict[str, Any]:
        return {
            **assignments_json(self.assignments),
            "credits": [credit.to_bytes().hex() for credit in self.credits],
        }

    @classmethod
    def from_json(cls, body: Any) -> RelayRedeem:
        keys = {"credits"} | ({"assignments"} & set(body if isinstance(body, dict) else ()))
        b = check.exact_object(body, "body", keys)
        items = check.items(b["credits"], "body.credits", MAX_REDEEM)  # 1..MAX_REDEEM
        return cls(
            credits=tuple(parse_credit(item) for item in items),
            assignments=parse_assignments(b.get("assignments"), len(items)),
        )
