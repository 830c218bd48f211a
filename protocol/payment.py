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

    Voucher(address gateway,bytes32 queryId,bytes32 modelId,uint256 feeCap,uint64 expiry,
            address consumer)
        signed by a prepaid payer (`QueryEscrow.depositBalance`): "gateway may charge my balance
        at most feeCap wei for one answer of model modelId, query queryId, until expiry (unix
        seconds)"; consumer = the QueryEscrow holding the balance. The payer is whoever the
        signature recovers to; the committee sums the charged vouchers per payer into the
        epoch's debits (`shares.settlement.prepaid_debits`).
    PaymentKey(address gateway,bytes32 keyId,bytes32 modelId,uint256 cap,uint64 expiry,
               address consumer)
        signed once by a prepaid payer: "gateway may charge my balance in consumer, question by
        question, up to cap wei in all for model modelId, until expiry" (one key for many
        questions: what an OpenAI tool keeps). The committee charges it cumulatively: a report
        item says "the total charged under (payer, gateway, key, keyId) is now T <= cap".
    KeyRevocation(address gateway,bytes32 keyId)
        signed by the payer: "gateway must refuse my key keyId from now on".

The API key (what an unmodified OpenAI client sends as `Authorization: Bearer <key>`) carries the
proof as text, one of:

    planet-pay-v1.<queryId: 64 hex>.<feeCap: decimal wei>.<signature: 130 hex>
    planet-voucher-v1.<queryId: 64 hex>.<feeCap: decimal wei>.<expiry: decimal s>.<sig: 130 hex>
    planet-key-v1.<keyId: 64 hex>.<cap: decimal wei>.<expiry: decimal s>.<sig: 130 hex>

`parse_api_key` / `parse_voucher_key` / `parse_payment_key` are the one parsers of each (strict
grammar: ASCII only, lowercase hex, no leading zeros, bounded lengths); `parse_bearer` picks by
prefix. They raise `PaymentKeyError` / `VoucherKeyError` / `KeyFormatError` (all
`ProtocolError`s, the last two subclasses of the first) with the rule that failed.

Import-light: eth-hash / coincurve through `protocol.eip712`; no web3 provider, no eth-abi.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from protocol.abi_words import keccak
from protocol.eip712 import (
    DOMAIN_VERSION,
    Domain,
    TypedStruct,
    as_address,
    as_bytes32,
    recover_digest,
    sign_digest,
)
from protocol.errors import ProtocolError

PAYMENT_DOMAIN_NAME = "Planet Query Payment"
API_KEY_PREFIX = "planet-pay-v1"
MAX_FEE_CAP = (1 << 64) - 1  # QueryEscrow stores a deposit in a uint64
MAX_TOKENS_FIELD = (1 << 32) - 1

VOUCHER_KEY_PREFIX = "planet-voucher-v1"
MAX_VOUCHER_CAP = (1 << 128) - 1  # QueryEscrow stores a prepaid balance in a uint128
MAX_EXPIRY = (1 << 64) - 1
MAX_VOUCHER_KEY_CHARS = 300

_VOUCHER_KEY = re.compile(
    r"planet-voucher-v1\.(?P<query>[0-9a-f]{64})\.(?P<cap>[1-9][0-9]{0,38})"
    r"\.(?P<expiry>[1-9][0-9]{0,19})\.(?P<sig>[0-9a-f]{130})\Z"
)

PAYMENT_KEY_PREFIX = "planet-key-v1"
MAX_KEY_CAP = MAX_VOUCHER_CAP  # a key never spends more than a balance can hold
MAX_PAYMENT_KEY_CHARS = 300

_PAYMENT_KEY = re.compile(
    r"planet-key-v1\.(?P<key>[0-9a-f]{64})\.(?P<cap>[1-9][0-9]{0,38})"
    r"\.(?P<expiry>[1-9][0-9]{0,19})\.(?P<sig>[0-9a-f]{130})\Z"
)

_API_KEY = re.compile(
    r"planet-pay-v1\.(?P<query>[0-9a-f]{64})\.(?P<cap>[1-9][0-9]{0,19})\.(?P<sig>[0-9a-f]{130})\Z"
)


class PaymentKeyError(ProtocolError):
    """The API key is not a well-formed payment proof; `reason` names the rule."""

    code = "payment_malformed"

    def __init__(self, reason: str) -> None:
        super().__init__(f"the API key is not a Planet payment proof: {reason}")
        self.reason = reason


class VoucherKeyError(PaymentKeyError):
    """The API key is not a well-formed voucher; `reason` names the rule."""

    code = "voucher_malformed"

    def __init__(self, reason: str) -> None:
        ProtocolError.__init__(self, f"the API key is not a Planet voucher: {reason}")
        self.reason = reason


class KeyFormatError(PaymentKeyError):
    """The API key is not a well-formed payment key (`planet-key-v1`); `reason` names the rule."""

    code = "key_malformed"

    def __init__(self, reason: str) -> None:
        ProtocolError.__init__(self, f"the API key is not a Planet payment key: {reason}")
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


@dataclass(frozen=True, slots=True)
class Voucher(TypedStruct):
    """A prepaid payer allows `gateway` to charge its balance in `consumer` at most `fee_cap` wei
    for query `query_id` of model `model_id`, until `expiry` (unix seconds)."""

    gateway: str
    query_id: bytes
    model_id: bytes
    fee_cap: int
    expiry: int
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "Voucher"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("gateway", "gateway", "address"),
        ("queryId", "query_id", "bytes32"),
        ("modelId", "model_id", "bytes32"),
        ("feeCap", "fee_cap", "uint256"),
        ("expiry", "expiry", "uint64"),
        ("consumer", "consumer", "address"),
    )


@dataclass(frozen=True, slots=True)
class PaymentKey(TypedStruct):
    """A prepaid payer allows `gateway` to charge its balance in `consumer` up to `cap` wei in
    all, question by question, for model `model_id`, until `expiry` (unix seconds)."""

    gateway: str
    key_id: bytes
    model_id: bytes
    cap: int
    expiry: int
    consumer: str

    PRIMARY_TYPE: ClassVar[str] = "PaymentKey"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("gateway", "gateway", "address"),
        ("keyId", "key_id", "bytes32"),
        ("modelId", "model_id", "bytes32"),
        ("cap", "cap", "uint256"),
        ("expiry", "expiry", "uint64"),
        ("consumer", "consumer", "address"),
    )


@dataclass(frozen=True, slots=True)
class KeyRevocation(TypedStruct):
    """The payer tells `gateway` to refuse its payment key `key_id` from now on."""

    gateway: str
    key_id: bytes

    PRIMARY_TYPE: ClassVar[str] = "KeyRevocation"
    FIELDS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("gateway", "gateway", "address"),
        ("keyId", "key_id", "bytes32"),
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


@dataclass(frozen=True, slots=True)
class VoucherProof:
    """A parsed voucher key: the query id, fee cap, expiry and the payer's signature. Gateway,
    model and consumer are not in the text: the gateway fills in its own, so a voucher signed
    for another gateway, model or escrow recovers to some other address (no funds)."""

    query_id: bytes
    fee_cap: int
    expiry: int
    signature: bytes

    def voucher(self, model_id: bytes, gateway: str, consumer: str) -> Voucher:
        return Voucher(gateway, self.query_id, model_id, self.fee_cap, self.expiry, consumer)

    def payer(self, model_id: bytes, gateway: str, domain: Domain) -> str:
        """The payer: who signed this voucher for (gateway, model) under `domain` (whose
        verifyingContract is the consumer). Raises `ProtocolError` on an unrecoverable
        signature."""
        voucher = self.voucher(model_id, gateway, domain.verifying_contract)
        return recover_digest(voucher.digest(domain), self.signature)


@dataclass(frozen=True, slots=True)
class PaymentKeyProof:
    """A parsed payment key: key id, cap, expiry and the payer's signature. Like a voucher, the
    gateway, model and consumer are not in the text: the gateway fills in its own, so a key
    signed for another gateway, model or escrow recovers to some other (unfunded) address."""

    key_id: bytes
    cap: int
    expiry: int
    signature: bytes

    def payment_key(self, model_id: bytes, gateway: str, consumer: str) -> PaymentKey:
        return PaymentKey(gateway, self.key_id, model_id, self.cap, self.expiry, consumer)

    def payer(self, model_id: bytes, gateway: str, domain: Domain) -> str:
        """Who signed this key for (gateway, model) under `domain` (its verifyingContract is
        the consumer). Raises `ProtocolError` on an unrecoverable signature."""
        key = self.payment_key(model_id, gateway, domain.verifying_contract)
        return recover_digest(key.digest(domain), self.signature)


def payment_key_text(key: PaymentKey, signature: bytes) -> str:
    """The API key text for a signed payment key."""
    return (
        f"{PAYMENT_KEY_PREFIX}.{key.key_id.hex()}.{key.cap}.{key.expiry}.{bytes(signature).hex()}"
    )


def sign_payment_key(private_key: bytes | str, key: PaymentKey, domain: Domain) -> str:
    """Sign `key` with the payer's key and return the API key text; its consumer must be the
    domain's contract (the escrow holding the balance)."""
    if key.consumer != domain.verifying_contract:
        raise ProtocolError(
            f"payment key consumer {key.consumer} is not the domain's escrow "
            f"{domain.verifying_contract}"
        )
    return payment_key_text(key, sign_digest(private_key, key.digest(domain)))


def parse_payment_key(text: Any) -> PaymentKeyProof:
    """The one parser of the payment key text; raises `KeyFormatError`."""
    if not isinstance(text, str):
        raise KeyFormatError("not text")
    if len(text) > MAX_PAYMENT_KEY_CHARS:
        raise KeyFormatError(f"{len(text)} characters, longer than any payment key")
    if not text.startswith(PAYMENT_KEY_PREFIX + "."):
        raise KeyFormatError(f"it does not start with {PAYMENT_KEY_PREFIX!r}")
    match = _PAYMENT_KEY.match(text)
    if match is None:
        raise KeyFormatError(
            "expected planet-key-v1.<64 hex key id>.<cap in wei>.<expiry in unix seconds>"
            ".<130 hex signature>"
        )
    cap, expiry = int(match["cap"]), int(match["expiry"])
    if cap > MAX_KEY_CAP:
        raise KeyFormatError(f"cap {cap} exceeds the largest balance {MAX_KEY_CAP}")
    if expiry > MAX_EXPIRY:
        raise KeyFormatError(f"expiry {expiry} does not fit uint64")
    return PaymentKeyProof(
        key_id=bytes.fromhex(match["key"]),
        cap=cap,
        expiry=expiry,
        signature=bytes.fromhex(match["sig"]),
    )


def sign_key_revocation(private_key: bytes | str, revocation: KeyRevocation, domain: Domain) -> str:
    """The payer's signature over `revocation`, as 0x + 130 hex."""
    return "0x" + sign_digest(private_key, revocation.digest(domain)).hex()


def voucher_key(voucher: Voucher, signature: bytes) -> str:
    """The API key text for a signed voucher."""
    return (
        f"{VOUCHER_KEY_PREFIX}.{voucher.query_id.hex()}.{voucher.fee_cap}.{voucher.expiry}."
        f"{bytes(signature).hex()}"
    )


def sign_voucher(private_key: bytes | str, voucher: Voucher, domain: Domain) -> str:
    """Sign `voucher` with the payer's key and return the API key text; the voucher's consumer
    must be the domain's contract (the escrow holding the balance)."""
    if voucher.consumer != domain.verifying_contract:
        raise ProtocolError(
            f"voucher consumer {voucher.consumer} is not the domain's escrow "
            f"{domain.verifying_contract}"
        )
    return voucher_key(voucher, sign_digest(private_key, voucher.digest(domain)))


def parse_voucher_key(text: Any) -> VoucherProof:
    """The one parser of the voucher key text; raises `VoucherKeyError`."""
    if not isinstance(text, str):
        raise VoucherKeyError("not text")
    if len(text) > MAX_VOUCHER_KEY_CHARS:
        raise VoucherKeyError(f"{len(text)} characters, longer than any voucher")
    if not text.startswith(VOUCHER_KEY_PREFIX + "."):
        raise VoucherKeyError(f"it does not start with {VOUCHER_KEY_PREFIX!r}")
    match = _VOUCHER_KEY.match(text)
    if match is None:
        raise VoucherKeyError(
            "expected planet-voucher-v1.<64 hex query id>.<fee cap in wei>.<expiry in unix "
            "seconds>.<130 hex signature>"
        )
    fee_cap, expiry = int(match["cap"]), int(match["expiry"])
    if fee_cap > MAX_VOUCHER_CAP:
        raise VoucherKeyError(f"fee cap {fee_cap} exceeds the largest balance {MAX_VOUCHER_CAP}")
    if expiry > MAX_EXPIRY:
        raise VoucherKeyError(f"expiry {expiry} does not fit uint64")
    return VoucherProof(
        query_id=bytes.fromhex(match["query"]),
        fee_cap=fee_cap,
        expiry=expiry,
        signature=bytes.fromhex(match["sig"]),
    )


Proof = PaymentProof | VoucherProof | PaymentKeyProof  # what an API key can carry


def parse_bearer(text: Any) -> Proof:
    """Parse an API key of any kind (chosen by its prefix); raises `PaymentKeyError` (or its
    subclass `VoucherKeyError` / `KeyFormatError` for a key that starts like a voucher / a
    payment key)."""
    if isinstance(text, str) and text.startswith(VOUCHER_KEY_PREFIX + "."):
        return parse_voucher_key(text)
    if isinstance(text, str) and text.startswith(PAYMENT_KEY_PREFIX + "."):
        return parse_payment_key(text)
    return parse_api_key(text)


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


@dataclass(frozen=True, slots=True)
class KeyUse:
    """What a key-paid receipt adds: the payer, the key, and the cumulative total charged under
    (payer, gateway, key id) once this question is counted (the committee charges totals)."""

    payer: str
    proof: PaymentKeyProof
    total: int


def receipt_json(
    receipt: Receipt,
    signature: bytes,
    node_keys: Sequence[str],
    voucher: tuple[str, VoucherProof] | None = None,
    key: KeyUse | None = None,
) -> dict[str, Any]:
    """The receipt as served (`planet_receipt`): the signed fields, the signature, the nodes;
    for a prepaid question also `payer` and the payer-signed `voucher` (cap, expiry,
    signature) or `key` (key id, cap, expiry, signature, cumulative total), which the committee
    needs to debit the payer (nodes never see receipts)."""
    doc = {
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
    if voucher is not None:
        payer, proof = voucher
        doc["payer"] = payer
        doc["voucher"] = {
            "fee_cap_wei": str(proof.fee_cap),
            "expiry": proof.expiry,
            "signature": "0x" + proof.signature.hex(),
        }
    if key is not None:
        doc["payer"] = key.payer
        doc["key"] = {
            "key_id": "0x" + key.proof.key_id.hex(),
            "cap_wei": str(key.proof.cap),
            "expiry": key.proof.expiry,
            "signature": "0x" + key.proof.signature.hex(),
            "total_wei": str(key.total),
        }
    return doc


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


@dataclass(frozen=True, slots=True)
class PrepaidCharge:
    """A verified prepaid receipt: what the committee turns into a per-payer debit."""

    receipt: Receipt
    gateway_signer: str  # who signed the receipt (the committee compares with `receipt.gateway`)
    payer: str  # who signed the voucher
    voucher: Voucher


def verify_prepaid_receipt_json(doc: Any, domain: Domain) -> PrepaidCharge:
    """Parse a prepaid receipt (`payer` + `voucher` present), check both signatures and the
    cap: the voucher must recover to `payer` for the receipt's gateway, query and model under
    `domain` (its escrow is the consumer), and the receipt's fee must not exceed the voucher's
    cap. Raises `ProtocolError`. (Expiry against the chain's time and replay across epochs are
    the committee's checks.)"""
    receipt, gateway_signer = verify_receipt_json(doc, domain)
    payer, voucher_doc = doc.get("payer"), doc.get("voucher")
    if not isinstance(payer, str) or not isinstance(voucher_doc, dict):
        raise ProtocolError("receipt: not a prepaid receipt (no payer / voucher)")
    cap, expiry, signature = (
        voucher_doc.get("fee_cap_wei"),
        voucher_doc.get("expiry"),
        voucher_doc.get("signature"),
    )
    if not isinstance(cap, str) or not re.fullmatch(r"[0-9]{1,39}", cap):
        raise ProtocolError("receipt.voucher.fee_cap_wei: expected a decimal string")
    if isinstance(expiry, bool) or not isinstance(expiry, int):
        raise ProtocolError("receipt.voucher.expiry: expected an integer")
    if not isinstance(signature, str) or not re.fullmatch(r"0x[0-9a-f]{130}", signature):
        raise ProtocolError("receipt.voucher.signature: expected 0x + 130 hex")
    voucher = Voucher(
        receipt.gateway,
        receipt.query_id,
        receipt.model_id,
        int(cap),
        expiry,
        domain.verifying_contract,
    )
    signer = recover_digest(voucher.digest(domain), bytes.fromhex(signature[2:]))
    if signer != as_address(payer, "receipt.payer"):
        raise ProtocolError("receipt: the voucher is not signed by its payer")
    if receipt.fee > voucher.fee_cap:
        raise ProtocolError(
            f"receipt: fee {receipt.fee} exceeds the voucher's cap {voucher.fee_cap}"
        )
    return PrepaidCharge(receipt, gateway_signer, signer, voucher)


@dataclass(frozen=True, slots=True)
class KeyCharge:
    """A verified key-paid receipt: what the committee turns into a cumulative charge item."""

    receipt: Receipt
    gateway_signer: str  # who signed the receipt (the committee compares with `receipt.gateway`)
    payer: str  # who signed the key
    key: PaymentKey
    total: int  # cumulative wei charged under (payer, gateway, key id), this question included


def verify_key_receipt_json(doc: Any, domain: Domain) -> KeyCharge:
    """Parse a key-paid receipt (`payer` + `key` present), check both signatures and the
    amounts: the key must recover to `payer` for the receipt's gateway and model under `domain`
    (its escrow is the consumer), and fee <= total <= cap. Raises `ProtocolError`. (Expiry
    against the chain's time and the running total per key are the committee's checks.)"""
    receipt, gateway_signer = verify_receipt_json(doc, domain)
    payer, key_doc = doc.get("payer"), doc.get("key")
    if not isinstance(payer, str) or not isinstance(key_doc, dict):
        raise ProtocolError("receipt: not a key-paid receipt (no payer / key)")
    cap, total = key_doc.get("cap_wei"), key_doc.get("total_wei")
    expiry, signature = key_doc.get("expiry"), key_doc.get("signature")
    for name, value in (("cap_wei", cap), ("total_wei", total)):
        if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,39}", value):
            raise ProtocolError(f"receipt.key.{name}: expected a decimal string")
    if isinstance(expiry, bool) or not isinstance(expiry, int):
        raise ProtocolError("receipt.key.expiry: expected an integer")
    if not isinstance(signature, str) or not re.fullmatch(r"0x[0-9a-f]{130}", signature):
        raise ProtocolError("receipt.key.signature: expected 0x + 130 hex")
    key = PaymentKey(
        receipt.gateway,
        as_bytes32(key_doc.get("key_id"), "receipt.key.key_id"),
        receipt.model_id,
        int(str(cap)),
        expiry,
        domain.verifying_contract,
    )
    signer = recover_digest(key.digest(domain), bytes.fromhex(signature[2:]))
    if signer != as_address(payer, "receipt.payer"):
        raise ProtocolError("receipt: the payment key is not signed by its payer")
    charged = int(str(total))
    if not receipt.fee <= charged <= key.cap:
        raise ProtocolError(
            f"receipt: fee {receipt.fee} <= total {charged} <= cap {key.cap} does not hold"
        )
    return KeyCharge(receipt, gateway_signer, signer, key, charged)
