"""The `gateway` tx: a gateway's committee key bound to (or released from) the EVM address it is
paid at, with that address's consent.

    gateway{address, bound, nonce, signature}   signer: the gateway's ed25519 committee key

`signature` is the address's EIP-712 signature over `protocol.eip712.GatewayBinding(gatewayKey =
the tx signer, gateway = address, bound, nonce, chain = keccak256(CometBFT chain id))` under the
committee domain (genesis `evm.chain_id`, `evm.committee_address`). The chain's rules:
`abci_app/gateway_bindings.py`; docs/committee.md, *Gateway bindings*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.committee.grammar import ADDRESS_LOWER, SIG65, U64, TxDecodeError, check
from protocol.eip712 import (
    GatewayBinding,
    address_of,
    committee_chain_hash,
    committee_domain,
)


@dataclass(frozen=True, slots=True)
class GatewayBind:
    """Bind (`bound` true) or release (`bound` false) the signer key's payee `address` (lowercase),
    under the address's signature; `nonce` ≥ 1, above every nonce the address used before."""

    address: str
    bound: bool
    nonce: int
    signature: str

    TYPE: ClassVar[str] = "gateway"

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "bound": self.bound,
            "nonce": self.nonce,
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, body: Any) -> GatewayBind:
        b = check.exact_object(body, "body", {"address", "bound", "nonce", "signature"})
        bound = b["bound"]
        if not isinstance(bound, bool):
            raise TxDecodeError("body.bound: expected true or false")
        return cls(
            address=check.text(b["address"], "body.address", ADDRESS_LOWER),
            bound=bound,
            nonce=check.integer(b["nonce"], "body.nonce", 1, U64),
            signature=check.text(b["signature"], "body.signature", SIG65),
        )


def sign_binding(
    evm_key: bytes | str,
    gateway_key: str,
    *,
    bound: bool,
    nonce: int,
    chain_id: str,
    evm_chain_id: int,
    committee_address: str,
) -> GatewayBind:
    """The `gateway` tx body binding (or, `bound` false, releasing) the ed25519 committee key
    `gateway_key` (64 hex: the tx's signer) to the address of `evm_key`, signed by that key for
    the committee chain `chain_id` and the committee domain (`evm_chain_id`,
    `committee_address`)."""
    address = address_of(evm_key).lower()
    binding = GatewayBinding(
        gateway_key=bytes.fromhex(gateway_key),
        gateway=address,
        bound=bound,
        nonce=nonce,
        chain=committee_chain_hash(chain_id),
    )
    signature = binding.sign(evm_key, committee_domain(evm_chain_id, committee_address))
    return GatewayBind(address=address, bound=bound, nonce=nonce, signature="0x" + signature.hex())
