"""protocol/payment.py vouchers: the EIP-712 type, the `planet-voucher-v1` key and its one parser
(hypothesis: round trips, and hostile text from the key's own grammar only ever raises
`VoucherKeyError`), binding to gateway / model / escrow / chain, and prepaid receipts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from protocol.payment import (
    MAX_EXPIRY,
    MAX_VOUCHER_CAP,
    PaymentKeyError,
    PaymentProof,
    Receipt,
    Voucher,
    VoucherKeyError,
    VoucherProof,
    circuit_hash,
    parse_bearer,
    parse_voucher_key,
    payment_domain,
    receipt_json,
    sign_voucher,
    verify_prepaid_receipt_json,
    voucher_key,
)

pytestmark = pytest.mark.unit

PAYER = bytes.fromhex("11" * 32)
GATEWAY_KEY = bytes.fromhex("22" * 32)
GATEWAY = address_of(GATEWAY_KEY)
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = payment_domain(31337, ESCROW)
QUERY = bytes.fromhex("ab" * 32)
MODEL = bytes.fromhex("cd" * 32)
NODES = ["aa" * 32, "bb" * 32]
EXPIRY = 1_767_225_600


def voucher(cap: int = 10**15, expiry: int = EXPIRY, query: bytes = QUERY) -> Voucher:
    return Voucher(GATEWAY, query, MODEL, cap, expiry, ESCROW)


def test_voucher_type_string_is_the_documented_one() -> None:
    assert Voucher.type_string() == (
        "Voucher(address gateway,bytes32 queryId,bytes32 modelId,uint256 feeCap,uint64 expiry,"
        "address consumer)"
    )


def test_voucher_key_round_trip_recovers_the_payer() -> None:
    key = sign_voucher(PAYER, voucher(), DOMAIN)
    assert key.startswith("planet-voucher-v1.")
    proof = parse_voucher_key(key)
    assert (proof.query_id, proof.fee_cap, proof.expiry) == (QUERY, 10**15, EXPIRY)
    assert proof.payer(MODEL, GATEWAY, DOMAIN) == address_of(PAYER)
    assert parse_bearer(key) == proof


@pytest.mark.parametrize(
    "model,gateway,domain",
    [
        (bytes(32), GATEWAY, DOMAIN),  # another model
        (MODEL, address_of(PAYER), DOMAIN),  # another gateway
        (MODEL, GATEWAY, payment_domain(1, ESCROW)),  # another chain
        (MODEL, GATEWAY, payment_domain(31337, GATEWAY)),  # another escrow (consumer)
    ],
)
def test_voucher_bound_to_model_gateway_chain_and_escrow(
    model: bytes, gateway: str, domain: object
) -> None:
    proof = parse_voucher_key(sign_voucher(PAYER, voucher(), DOMAIN))
    assert proof.payer(model, gateway, domain) != address_of(PAYER)  # type: ignore[arg-type]


def test_sign_voucher_consumer_must_be_the_domain_escrow() -> None:
    with pytest.raises(ProtocolError, match="consumer"):
        sign_voucher(PAYER, Voucher(GATEWAY, QUERY, MODEL, 1, EXPIRY, GATEWAY), DOMAIN)


def test_parse_bearer_keeps_the_per_query_path() -> None:
    key = "planet-pay-v1." + "ab" * 32 + ".5." + "01" * 65
    assert isinstance(parse_bearer(key), PaymentProof)
    with pytest.raises(PaymentKeyError) as caught:
        parse_bearer("sk-proj-123")
    assert not isinstance(caught.value, VoucherKeyError)


# --- hostile grammar -----------------------------------------------------------------------------

GOOD = voucher_key(voucher(cap=5, expiry=77), b"\x01" * 65)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "planet-voucher-v1",
        GOOD + "\n",
        GOOD + "0",
        GOOD.upper(),
        GOOD.replace(".5.", ".05."),
        GOOD.replace(".5.", ".0."),
        GOOD.replace(".5.", ".-5."),
        GOOD.replace(".5.", f".{MAX_VOUCHER_CAP + 1}."),
        GOOD.replace(".77.", ".077."),
        GOOD.replace(".77.", f".{MAX_EXPIRY + 1}."),
        GOOD.replace(".77.", ".7 7."),
        GOOD.replace(".77.", "."),
        GOOD.replace(".5.", ".\u0665."),  # an Arabic-Indic digit
        GOOD[:-2],
        "planet-voucher-v1." + "a" * 400,
        None,
        7,
        b"planet-voucher-v1.",
    ],
)
def test_parse_voucher_key_refuses_malformed(text: object) -> None:
    with pytest.raises(VoucherKeyError) as caught:
        parse_voucher_key(text)
    assert caught.value.code == "voucher_malformed"
    assert isinstance(caught.value, PaymentKeyError)  # the gateway's 402 path handles both


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
        draw(st.sampled_from(["planet-voucher-v1", "planet-voucher-v2", "PLANET-VOUCHER-V1"])),
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
def test_parse_voucher_key_hostile_grammar_only_named_errors(text: str) -> None:
    try:
        proof = parse_voucher_key(text)
    except VoucherKeyError:
        return
    assert len(proof.query_id) == 32 and len(proof.signature) == 65
    assert 0 < proof.fee_cap <= MAX_VOUCHER_CAP and 0 < proof.expiry <= MAX_EXPIRY
    assert voucher_key(proof.voucher(MODEL, GATEWAY, ESCROW), proof.signature) == text


@settings(max_examples=50, deadline=None)
@given(
    cap=st.integers(1, MAX_VOUCHER_CAP),
    expiry=st.integers(1, MAX_EXPIRY),
    query=st.binary(min_size=32, max_size=32),
)
def test_voucher_key_round_trip_any_valid_values(cap: int, expiry: int, query: bytes) -> None:
    signed = voucher(cap, expiry, query)
    proof = parse_voucher_key(voucher_key(signed, b"\x02" * 65))
    assert proof == VoucherProof(query, cap, expiry, b"\x02" * 65)


# --- prepaid receipts ----------------------------------------------------------------------------


def prepaid_receipt(fee: int = 7, cap: int = 10) -> dict:
    key = sign_voucher(PAYER, voucher(cap=cap), DOMAIN)
    proof = parse_voucher_key(key)
    receipt = Receipt(QUERY, GATEWAY, MODEL, 3, 4, fee, circuit_hash(NODES))
    return receipt_json(
        receipt, receipt.sign(GATEWAY_KEY, DOMAIN), NODES, (address_of(PAYER), proof)
    )


def test_prepaid_receipt_verifies_payer_and_gateway() -> None:
    charge = verify_prepaid_receipt_json(prepaid_receipt(), DOMAIN)
    assert charge.payer == address_of(PAYER)
    assert charge.gateway_signer == GATEWAY
    assert (charge.receipt.fee, charge.voucher.fee_cap) == (7, 10)


def test_prepaid_receipt_fee_above_cap_refused() -> None:
    with pytest.raises(ProtocolError, match="cap"):
        verify_prepaid_receipt_json(prepaid_receipt(fee=11, cap=10), DOMAIN)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: {**d, "payer": GATEWAY},  # someone else's balance
        lambda d: {**d, "voucher": {**d["voucher"], "fee_cap_wei": "1000"}},  # raised cap
        lambda d: {**d, "voucher": {**d["voucher"], "expiry": EXPIRY + 1}},
        lambda d: {**d, "voucher": {**d["voucher"], "fee_cap_wei": "1e3"}},
        lambda d: {**d, "voucher": {**d["voucher"], "expiry": True}},
        lambda d: {**d, "voucher": {**d["voucher"], "signature": "0x12"}},
        lambda d: {k: v for k, v in d.items() if k != "voucher"},
    ],
)
def test_prepaid_receipt_tampering_refused(tamper: object) -> None:
    with pytest.raises(ProtocolError):
        verify_prepaid_receipt_json(tamper(prepaid_receipt()), DOMAIN)  # type: ignore[operator]
