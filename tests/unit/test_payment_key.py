"""protocol/payment.py payment keys: the EIP-712 type, the `planet-key-v1` API key and its one
parser (hypothesis: round trips, and hostile text from the key's own grammar only ever raises
`KeyFormatError`), binding to gateway / model / escrow / chain, revocations, key-paid receipts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from protocol.payment import (
    MAX_EXPIRY,
    MAX_KEY_CAP,
    KeyFormatError,
    KeyRevocation,
    KeyUse,
    PaymentKey,
    PaymentKeyError,
    PaymentKeyProof,
    Receipt,
    VoucherKeyError,
    VoucherProof,
    circuit_hash,
    parse_bearer,
    parse_payment_key,
    payment_domain,
    payment_key_text,
    receipt_json,
    sign_key_revocation,
    sign_payment_key,
    verify_key_receipt_json,
)

pytestmark = pytest.mark.unit

PAYER = bytes.fromhex("11" * 32)
GATEWAY_KEY = bytes.fromhex("22" * 32)
GATEWAY = address_of(GATEWAY_KEY)
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = payment_domain(31337, ESCROW)
KEY_ID = bytes.fromhex("ab" * 32)
MODEL = bytes.fromhex("cd" * 32)
NODES = ["aa" * 32, "bb" * 32]
EXPIRY = 1_767_225_600


def payment_key(cap: int = 10**16, expiry: int = EXPIRY, key_id: bytes = KEY_ID) -> PaymentKey:
    return PaymentKey(GATEWAY, key_id, MODEL, cap, expiry, ESCROW)


def test_payment_key_type_strings_are_the_documented_ones() -> None:
    assert PaymentKey.type_string() == (
        "PaymentKey(address gateway,bytes32 keyId,bytes32 modelId,uint256 cap,uint64 expiry,"
        "address consumer)"
    )
    assert KeyRevocation.type_string() == "KeyRevocation(address gateway,bytes32 keyId)"


def test_payment_key_round_trip_recovers_the_payer() -> None:
    text = sign_payment_key(PAYER, payment_key(), DOMAIN)
    assert text.startswith("planet-key-v1." + KEY_ID.hex() + f".{10**16}.{EXPIRY}.")
    proof = parse_payment_key(text)
    assert (proof.key_id, proof.cap, proof.expiry) == (KEY_ID, 10**16, EXPIRY)
    assert proof.payer(MODEL, GATEWAY, DOMAIN) == address_of(PAYER)
    assert parse_bearer(text) == proof


@pytest.mark.parametrize(
    "model,gateway,domain",
    [
        (bytes(32), GATEWAY, DOMAIN),  # another model
        (MODEL, address_of(PAYER), DOMAIN),  # another gateway
        (MODEL, GATEWAY, payment_domain(1, ESCROW)),  # another chain
        (MODEL, GATEWAY, payment_domain(31337, GATEWAY)),  # another escrow (consumer)
    ],
)
def test_payment_key_bound_to_model_gateway_chain_and_escrow(
    model: bytes, gateway: str, domain: object
) -> None:
    proof = parse_payment_key(sign_payment_key(PAYER, payment_key(), DOMAIN))
    assert proof.payer(model, gateway, domain) != address_of(PAYER)  # type: ignore[arg-type]


def test_sign_payment_key_consumer_must_be_the_domain_escrow() -> None:
    with pytest.raises(ProtocolError, match="consumer"):
        sign_payment_key(PAYER, PaymentKey(GATEWAY, KEY_ID, MODEL, 1, EXPIRY, GATEWAY), DOMAIN)


def test_a_key_and_a_voucher_with_the_same_numbers_never_verify_as_each_other() -> None:
    """Different EIP-712 types: a signed voucher cannot be replayed as a key, nor back."""
    text = sign_payment_key(PAYER, payment_key(), DOMAIN)
    proof = parse_payment_key(text)
    as_voucher = VoucherProof(KEY_ID, proof.cap, proof.expiry, proof.signature)
    assert as_voucher.payer(MODEL, GATEWAY, DOMAIN) != address_of(PAYER)


def test_parse_bearer_picks_the_kind_by_prefix() -> None:
    with pytest.raises(KeyFormatError) as caught:
        parse_bearer("planet-key-v1.00")
    assert caught.value.code == "key_malformed"
    assert isinstance(caught.value, PaymentKeyError)  # the gateway's 402 path handles it
    assert not isinstance(caught.value, VoucherKeyError)


def test_revocation_recovers_the_payer_for_this_gateway_only() -> None:
    signature = bytes.fromhex(
        sign_key_revocation(PAYER, KeyRevocation(GATEWAY, KEY_ID), DOMAIN)[2:]
    )
    assert KeyRevocation(GATEWAY, KEY_ID).recover(signature, DOMAIN) == address_of(PAYER)
    assert KeyRevocation(address_of(PAYER), KEY_ID).recover(signature, DOMAIN) != address_of(PAYER)


# --- hostile grammar -----------------------------------------------------------------------------

GOOD = payment_key_text(payment_key(cap=5, expiry=77), b"\x01" * 65)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "planet-key-v1",
        "planet-key-v1.",
        GOOD + "\n",
        GOOD + "0",
        " " + GOOD,
        GOOD.upper(),
        GOOD.replace("planet-key-v1", "planet-key-v2"),
        GOOD.replace(".5.", ".05."),
        GOOD.replace(".5.", ".0."),
        GOOD.replace(".5.", ".+5."),
        GOOD.replace(".5.", f".{MAX_KEY_CAP + 1}."),
        GOOD.replace(".5.", ".1" + "0" * 39 + "."),  # 40 digits
        GOOD.replace(".77.", ".077."),
        GOOD.replace(".77.", f".{MAX_EXPIRY + 1}."),
        GOOD.replace(".77.", ".7\u00a07."),
        GOOD.replace(".77.", ".\u0667\u0667."),  # Arabic-Indic digits
        GOOD.replace("ab" * 32, "AB" * 32),
        GOOD.replace("ab" * 32, "ab" * 31),
        GOOD[:-2],
        GOOD[:-2] + "zz",
        "planet-key-v1." + "a" * 400,
        None,
        7,
        b"planet-key-v1.",
    ],
)
def test_parse_payment_key_refuses_malformed(text: object) -> None:
    with pytest.raises(KeyFormatError) as caught:
        parse_payment_key(text)
    assert caught.value.code == "key_malformed"


hex_field = st.text(alphabet="0123456789abcdefABCDEFx", min_size=0, max_size=140)
decimal_field = st.one_of(
    st.integers(min_value=-5, max_value=2**140).map(str),
    st.text(alphabet="0123456789-+ \u0660\u0665", min_size=0, max_size=45),
)
separator = st.sampled_from([".", "..", "", ":", ". "])


@st.composite
def hostile_keys(draw: st.DrawFn) -> str:
    """Texts built from the key's own pieces: right prefix, fields of the right alphabet but any
    length or value, wrong or doubled separators, stray suffixes."""
    parts = [
        draw(st.sampled_from(["planet-key-v1", "planet-key-v0", "PLANET-KEY-V1", "planet-key"])),
        draw(hex_field),
        draw(decimal_field),
        draw(decimal_field),
        draw(hex_field),
    ]
    text = parts[0]
    for part in parts[1:]:
        text += draw(separator) + part
    return text + draw(st.sampled_from(["", "\n", ".", "0"]))


@settings(max_examples=400, deadline=None)
@given(text=hostile_keys())
def test_parse_payment_key_hostile_grammar_only_named_errors(text: str) -> None:
    try:
        proof = parse_bearer(text)
    except PaymentKeyError:
        return
    assert isinstance(proof, PaymentKeyProof)
    assert len(proof.key_id) == 32 and len(proof.signature) == 65
    assert 0 < proof.cap <= MAX_KEY_CAP and 0 < proof.expiry <= MAX_EXPIRY
    assert payment_key_text(proof.payment_key(MODEL, GATEWAY, ESCROW), proof.signature) == text


@settings(max_examples=50, deadline=None)
@given(
    cap=st.integers(1, MAX_KEY_CAP),
    expiry=st.integers(1, MAX_EXPIRY),
    key_id=st.binary(min_size=32, max_size=32),
)
def test_payment_key_round_trip_any_valid_values(cap: int, expiry: int, key_id: bytes) -> None:
    proof = parse_payment_key(payment_key_text(payment_key(cap, expiry, key_id), b"\x02" * 65))
    assert proof == PaymentKeyProof(key_id, cap, expiry, b"\x02" * 65)


# --- key-paid receipts ---------------------------------------------------------------------------


def key_receipt(fee: int = 7, total: int = 20, cap: int = 30) -> dict:
    proof = parse_payment_key(sign_payment_key(PAYER, payment_key(cap=cap), DOMAIN))
    receipt = Receipt(bytes(32), GATEWAY, MODEL, 3, 4, fee, circuit_hash(NODES))
    use = KeyUse(address_of(PAYER), proof, total)
    return receipt_json(receipt, receipt.sign(GATEWAY_KEY, DOMAIN), NODES, key=use)


def test_key_receipt_carries_what_the_committee_charges() -> None:
    doc = key_receipt()
    assert doc["payer"] == address_of(PAYER)
    assert doc["key"]["key_id"] == "0x" + KEY_ID.hex()
    assert (doc["key"]["cap_wei"], doc["key"]["total_wei"]) == ("30", "20")
    charge = verify_key_receipt_json(doc, DOMAIN)
    assert (charge.payer, charge.gateway_signer, charge.total) == (address_of(PAYER), GATEWAY, 20)
    assert charge.key.key_id == KEY_ID and charge.key.expiry == EXPIRY


@pytest.mark.parametrize(
    "fee,total,cap",
    [(8, 7, 30), (7, 31, 30)],  # fee above the running total; total above the cap
)
def test_key_receipt_amounts_out_of_order_refused(fee: int, total: int, cap: int) -> None:
    with pytest.raises(ProtocolError, match="cap"):
        verify_key_receipt_json(key_receipt(fee, total, cap), DOMAIN)


def test_key_receipt_signed_by_someone_else_refused() -> None:
    doc = key_receipt()
    doc["payer"] = GATEWAY
    with pytest.raises(ProtocolError, match="not signed by its payer"):
        verify_key_receipt_json(doc, DOMAIN)
