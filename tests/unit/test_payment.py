"""protocol/payment.py: payment proofs in the API key, receipts, and their one parser."""

from __future__ import annotations

import random

import pytest

from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from protocol.payment import (
    MAX_FEE_CAP,
    PaymentKeyError,
    QueryPayment,
    Receipt,
    api_key,
    circuit_hash,
    parse_api_key,
    payment_domain,
    receipt_json,
    sign_payment,
    verify_receipt_json,
)

pytestmark = pytest.mark.unit

USER = bytes.fromhex("11" * 32)
GATEWAY_KEY = bytes.fromhex("22" * 32)
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = payment_domain(31337, ESCROW)
QUERY = bytes.fromhex("ab" * 32)
MODEL = bytes.fromhex("cd" * 32)
NODES = ["aa" * 32, "bb" * 32]


def test_payment_type_strings_are_the_documented_ones() -> None:
    assert QueryPayment.type_string() == (
        "QueryPayment(bytes32 queryId,bytes32 modelId,address gateway,uint256 feeCap)"
    )
    assert Receipt.type_string() == (
        "Receipt(bytes32 queryId,address gateway,bytes32 modelId,uint32 promptTokens,"
        "uint32 completionTokens,uint256 fee,bytes32 circuitHash)"
    )
    assert DOMAIN.to_json()["name"] == "Planet Query Payment"


def test_payment_api_key_round_trip_recovers_the_depositor() -> None:
    payment = QueryPayment(QUERY, MODEL, address_of(GATEWAY_KEY), 10**15)
    key = sign_payment(USER, payment, DOMAIN)
    proof = parse_api_key(key)
    assert (proof.query_id, proof.fee_cap) == (QUERY, 10**15)
    assert proof.signer(MODEL, address_of(GATEWAY_KEY), DOMAIN) == address_of(USER)


@pytest.mark.parametrize(
    "change",
    [
        {"model": bytes(32)},  # another model
        {"gateway": address_of(USER)},  # another gateway
        {"domain": payment_domain(1, ESCROW)},  # another chain
    ],
)
def test_payment_proof_bound_to_model_gateway_and_chain(change: dict) -> None:
    payment = QueryPayment(QUERY, MODEL, address_of(GATEWAY_KEY), 10**15)
    proof = parse_api_key(sign_payment(USER, payment, DOMAIN))
    signer = proof.signer(
        change.get("model", MODEL),
        change.get("gateway", address_of(GATEWAY_KEY)),
        change.get("domain", DOMAIN),
    )
    assert signer != address_of(USER)


GOOD = api_key(QueryPayment(QUERY, MODEL, address_of(GATEWAY_KEY), 5), b"\x01" * 65)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sk-proj-abc",
        GOOD + "\n",
        GOOD + "0",
        GOOD.upper(),
        GOOD.replace(".5.", ".05."),
        GOOD.replace(".5.", ".0."),
        GOOD.replace(".5.", ".-5."),
        GOOD.replace(".5.", f".{MAX_FEE_CAP + 1}."),
        GOOD.replace(".5.", ".5.5."),
        GOOD[:-2],
        "planet-pay-v1." + "a" * 300,
        None,
        42,
        b"planet-pay-v1",
    ],
)
def test_payment_parse_api_key_refuses_malformed(text: object) -> None:
    with pytest.raises(PaymentKeyError) as caught:
        parse_api_key(text)
    assert caught.value.code == "payment_malformed"


def test_payment_parse_api_key_fuzz_never_raises_anything_else() -> None:
    rng = random.Random(14)
    alphabet = "0123456789abcdefABCDEF.-_ \n\t\u00e9x"
    for _ in range(500):
        cut = rng.randrange(len(GOOD) + 1)
        noise = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6)))
        text = GOOD[:cut] + noise + GOOD[cut + rng.randrange(0, 4) :]
        try:
            proof = parse_api_key(text)
        except PaymentKeyError:
            continue
        assert len(proof.query_id) == 32 and 0 < proof.fee_cap <= MAX_FEE_CAP
        assert len(proof.signature) == 65


def _receipt(fee: int = 7) -> tuple[Receipt, dict]:
    receipt = Receipt(QUERY, address_of(GATEWAY_KEY), MODEL, 10, 5, fee, circuit_hash(NODES))
    signature = receipt.sign(GATEWAY_KEY, DOMAIN)
    return receipt, receipt_json(receipt, signature, NODES)


def test_payment_receipt_json_verifies_and_tampering_is_caught() -> None:
    receipt, doc = _receipt()
    parsed, signer = verify_receipt_json(doc, DOMAIN)
    assert parsed == receipt and signer == address_of(GATEWAY_KEY)
    assert verify_receipt_json({**doc, "fee_wei": "1"}, DOMAIN)[1] != address_of(GATEWAY_KEY)
    with pytest.raises(ProtocolError, match="circuit_hash"):
        verify_receipt_json({**doc, "nodes": list(reversed(NODES))}, DOMAIN)
    with pytest.raises(ProtocolError):
        verify_receipt_json({**doc, "fee_wei": 7}, DOMAIN)
    with pytest.raises(ProtocolError):
        verify_receipt_json({k: v for k, v in doc.items() if k != "signature"}, DOMAIN)
