"""Validator set change txs: a validator proposes a change of the committee chain's validator
set, validators approve it; it applies at an epoch boundary once ≥ 2/3 of the power approved.

    validator_change{action: "add", pub_key, power, operator}
                                add a validator: its ed25519 consensus key (64 hex), its
                                power (1 … MAX_POWER) and its operator's EVM address
                                (lowercase 0x + 40 hex: its verdict and payout signatures)
    validator_change{action: "power", pub_key, power}
                                set a validator's power
    validator_change{action: "remove", pub_key}
                                remove a validator
    validator_approve{change}   approve the pending change `change` (its id, `change_id`)

The proposal counts as its proposer's approval. The chain's rules (who may, when it applies,
the refusals): `abci_app/validator_set.py`, docs/committee.md *Validator set changes*.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from protocol.canonical import canonical_json
from protocol.committee.grammar import ADDRESS_LOWER, HEX32_0X, HEX64, TxDecodeError, check

CHANGE_DOMAIN: Final = b"planet-validator-change/v1\n"
MAX_POWER: Final = 10**12  # far below CometBFT's MaxTotalVotingPower (2^63 / 8)
ADD, POWER, REMOVE = "add", "power", "remove"
_KEYS: Final = {
    ADD: {"action", "operator", "power", "pub_key"},
    POWER: {"action", "power", "pub_key"},
    REMOVE: {"action", "pub_key"},
}


@dataclass(frozen=True, slots=True)
class ValidatorChange:
    """One change of the validator set (module docstring); `power` is 0 and `operator` "" for
    a removal, `operator` "" for a power change."""

    action: str
    pub_key: str
    power: int = 0
    operator: str = ""

    TYPE: ClassVar[str] = "validator_change"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"action": self.action, "pub_key": self.pub_key}
        if self.action != REMOVE:
            body["power"] = self.power
        if self.action == ADD:
            body["operator"] = self.operator
        return body

    @classmethod
    def from_json(cls, body: Any) -> ValidatorChange:
        if not isinstance(body, dict):
            raise TxDecodeError("body: expected an object")
        action = body.get("action")
        if not isinstance(action, str) or action not in _KEYS:  # a dict or list is unhashable
            raise TxDecodeError("body.action: expected add, power or remove")
        b = check.exact_object(body, "body", _KEYS[action])
        pub_key = check.text(b["pub_key"], "body.pub_key", HEX64)
        if action == REMOVE:
            return cls(REMOVE, pub_key)
        power = check.integer(b["power"], "body.power", 1, MAX_POWER)
        if action == POWER:
            return cls(POWER, pub_key, power)
        operator = check.text(b["operator"], "body.operator", ADDRESS_LOWER)
        return cls(ADD, pub_key, power, operator)


def change_id(change: ValidatorChange, height: int) -> str:
    """0x sha256(CHANGE_DOMAIN ‖ canonical JSON of the change ‖ uint64_be(height proposed)):
    the same change proposed again after it expired has another id."""
    digest = hashlib.sha256(
        CHANGE_DOMAIN + canonical_json(change.to_json()) + height.to_bytes(8, "big")
    )
    return "0x" + digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ValidatorApprove:
    """A validator's approval of the pending validator set change `change` (its id)."""

    change: str

    TYPE: ClassVar[str] = "validator_approve"

    def to_json(self) -> dict[str, Any]:
        return {"change": self.change}

    @classmethod
    def from_json(cls, body: Any) -> ValidatorApprove:
        b = check.exact_object(body, "body", {"change"})
        return cls(change=check.text(b["change"], "body.change", HEX32_0X))
