"""Paying a gateway for one question: the payment proof a user signs and the receipt a gateway
signs back. Both are EIP-712 structs under one domain bound to the chain and the QueryEscrow that
holds the deposit.

    payment_domain(chain_id, escrow)   "Planet Query Payment" v1, verifyingContract = QueryEscrow

    QueryPayment(bytes32 queryId,bytes32 modelId,address gateway,uint256 feeCap)
        signed by the depositor of `queryId`: "gateway may charge this deposit at most feeCap
        wei for one answer of model modelId". A query id alone can be squatted (anyone can read
        it from the chain); the signature proves the requester is the one who paid.
    Receipt(bytes32 queryId,address gateway,bytes32 modelId,uint32 promptTokens,
            uint32 completionTokens,uint256 fee,bytes32 circuitHash)
        signed by the gateway wallet: what it served and what it charges (fee <= feeCap <=
        deposit); circuitHash = keccak256 of the circuit's node keys (32 bytes each, in order).

The API key (what an unmodified OpenAI client sends as `Authorization: Bearer <key>`) carries the
proof as text:

    planet-pay-v1.<queryId: 64 hex>.<feeCap: decimal wei>.<signature: 130 hex>

`parse_api_key` is the one parser of that text (strict grammar, bounded lengths); it raises
`PaymentKeyError` (a `ProtocolError`) with the rule that failed.

Import-light: eth-abi / eth-utils / coincurve through `protocol.eip712`; no web3 provider.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from eth_utils import keccak

from protocol.eip712 import (
    DOMAIN_VERSION,
    Domain,
    TypedStruct,
    as_bytes32,
    recover_digest,
    sign_digest,
)
from protocol.errors import ProtocolError

PAYMENT_DOMAIN_NAME = "Planet Query Payment"
API_KEY_PREFIX = "planet-pay-v1"
MAX_FEE_CAP = (1 << 64) - 1  # QueryEscrow stores a deposit in a uint64
MAX_TOKENS_FIELD = (1 << 32) - 1

_API_KEY = re.compile(
    r"planet-pay-v1\.(?P<query>[0-9a-f]{64})\.(?P<cap>[1-9][0-9]{0,19})\.(?P<sig>[0-9a-f]{130})\Z"
)


class PaymentKeyError(ProtocolError):
    """The API key is not a well-formed payment proof; `reason` names the rule."""

    code = "payment_malformed"

    def __init__(self, reason: str) -> None:
        super().__init__(f"the API key is not a Planet payment proof: {reason}")
        self.reason = reason


def payment_domain(chain_id: int, escrow: str) -> Domain:
    """Domain of payment proofs and receipts: this chain, this QueryEscrow."""
    return Domain(PAYMENT_DOMAIN_NAME, DOMAIN_VERSION, chain_id, escrow)


@dataclass(frozen=True, slots=True)
class QueryPayment(TypedStruct):
    """The depositor allows `gateway` to charge deposit `query_id` at most `fee_cap` wei."""

    query_id: bytes
    model_id: bytes
    gateway: str
    fee_cap: int

    PRIMARY_TYPE: ClassVar[str] = "QueryPayment"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("queryId", "query_id", "bytes32"),
        ("modelId", "model_id", "bytes32"),
        ("gateway", "gateway", "address"),
        ("feeCap", "fee_cap", "uint256"),
    )


@dataclass(frozen=True, slots=True)
class Receipt(TypedStruct):
    """What a gateway served for `query_id` and the fee it charges."""

    query_id: bytes
    gateway: str
    model_id: bytes
    prompt_tokens: int
    completion_tokens: int
    fee: int
    circuit_hash: bytes

    PRIMARY_TYPE: ClassVar[str] = "Receipt"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("queryId", "query_id", "bytes32"),
        ("gateway", "gateway", "address"),
        ("modelId", "model_id", "bytes32"),
        ("promptTokens", "prompt_tokens", "uint32"),
        ("completionTokens", "completion_tokens", "uint32"),
        ("fee", "fee", "uint256"),
        ("circuitHash", "circuit_hash", "bytes32"),
    )


def circuit_hash(node_keys: Sequence[str]) -> bytes:
    """keccak256 of the circuit's ed25519 node keys (32 bytes each, circuit order)."""
    return keccak(b"".join(as_bytes32(key, "node key") for key in node_keys))


@dataclass(frozen=True, slots=True)
class PaymentProof:
    """A parsed API key: which deposit, the fee cap, and the depositor's signature."""

    query_id: bytes
    fee_cap: int
    signature: bytes

    def payment(self, model_id: bytes, gateway: str) -> QueryPayment:
        return QueryPayment(self.query_id, model_id, gateway, self.fee_cap)

    def signer(self, model_id: bytes, gateway: str, domain: Domain) -> str:
        """Who signed this proof for (model, gateway) under `domain`; a signature over other
        values recovers some other address, so callers compare with the depositor."""
        return recover_digest(self.payment(model_id, gateway).digest(domain), self.signature)


def api_key(payment: QueryPayment, signature: bytes) -> str:
    """The API key text for a signed payment."""
    return f"{API_KEY_PREFIX}.{payment.query_id.hex()}.{payment.fee_cap}.{bytes(signature).hex()}"


def sign_payment(private_key: bytes | str, payment: QueryPayment, domain: Domain) -> str:
    """Sign `payment` with the depositor's key and return the API key text."""
    return api_key(payment, sign_digest(private_key, payment.digest(domain)))


def parse_api_key(text: Any) -> PaymentProof:
    """The one parser of the API key text; raises `PaymentKeyError`."""
    if not isinstance(text, str):
        raise PaymentKeyError("not text")
    if len(text) > 256:
        raise PaymentKeyError(f"{len(text)} characters, longer than any proof")
    if not text.startswith(API_KEY_PREFIX + "."):
        raise PaymentKeyError(f"it does not start with {API_KEY_PREFIX!r}")
    match = _API_KEY.match(text)
    if match is None:
        raise PaymentKeyError(
            "expected planet-pay-v1.<64 hex query id>.<fee cap in wei>.<130 hex signature>"
        )
    fee_cap = int(match["cap"])
    if fee_cap > MAX_FEE_CAP:
        raise PaymentKeyError(f"fee cap {fee_cap} exceeds the largest deposit {MAX_FEE_CAP}")
    return PaymentProof(
        query_id=bytes.fromhex(match["query"]),
        fee_cap=fee_cap,
        signature=bytes.fromhex(match["sig"]),
    )


def receipt_json(receipt: Receipt, signature: bytes, node_keys: Sequence[str]) -> dict[str, Any]:
    """The receipt as served (`planet_receipt`): the signed fields, the signature, the nodes."""
    return {
        "query_id": "0x" + receipt.query_id.hex(),
        "gateway": receipt.gateway,
        "model_id": "0x" + receipt.model_id.hex(),
        "prompt_tokens": receipt.prompt_tokens,
        "completion_tokens": receipt.completion_tokens,
        "fee_wei": str(receipt.fee),
        "circuit_hash": "0x" + receipt.circuit_hash.hex(),
        "nodes": list(node_keys),
        "signature": "0x" + bytes(signature).hex(),
    }


def verify_receipt_json(doc: Any, domain: Domain) -> tuple[Receipt, str]:
    """Parse a served receipt, check its circuit hash, and return it with its signer."""
    if not isinstance(doc, dict):
        raise ProtocolError("receipt: expected an object")
    try:
        nodes = doc["nodes"]
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise ProtocolError("receipt.nodes: expected a list of node keys")
        fee = doc["fee_wei"]
        if not isinstance(fee, str) or not fee.isdigit():
            raise ProtocolError("receipt.fee_wei: expected a decimal string")
        receipt = Receipt(
            query_id=as_bytes32(doc["query_id"], "query_id"),
            gateway=doc["gateway"],
            model_id=as_bytes32(doc["model_id"], "model_id"),
            prompt_tokens=doc["prompt_tokens"],
            completion_tokens=doc["completion_tokens"],
            fee=int(fee),
            circuit_hash=as_bytes32(doc["circuit_hash"], "circuit_hash"),
        )
        signature = doc["signature"]
        if not isinstance(signature, str) or not re.fullmatch(r"0x[0-9a-f]{130}", signature):
            raise ProtocolError("receipt.signature: expected 0x + 130 hex")
    except KeyError as error:
        raise ProtocolError(f"receipt: missing field {error}") from None
    if circuit_hash(nodes) != receipt.circuit_hash:
        raise ProtocolError("receipt: circuit_hash does not match its nodes")
    return receipt, recover_digest(receipt.digest(domain), bytes.fromhex(signature[2:]))
