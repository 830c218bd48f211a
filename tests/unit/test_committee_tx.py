"""Committee tx vocabulary: canonical encoding, signatures, typed decode errors."""

from __future__ import annotations

import json

import pytest

from abci_app.testing import seeded_evm_key, seeded_key
from protocol.canonical import canonical_json
from protocol.committee import (
    SIGN_DOMAIN,
    AttestStake,
    CommitBatch,
    CommitmentRecord,
    Heartbeat,
    Leave,
    RegisterNode,
    RevealBatch,
    RevealRecord,
    ShareBlockTx,
    SignedTx,
    TxDecodeError,
    TxSignatureError,
    VerdictVote,
    decode,
    recover_registration,
    sign,
    sign_registration,
)
from protocol.eip712 import address_of
from shares.block import GENESIS_PREV_HASH, ShareBlock, ShareBlockError

pytestmark = pytest.mark.unit

KEY = seeded_key("node-a")
NODE = KEY.verify_key.encode().hex()
EVM = seeded_evm_key("node-a")
H32 = "0x" + "11" * 32


def register_body() -> RegisterNode:
    return RegisterNode(
        evm_address=address_of(EVM),
        evm_signature=sign_registration(EVM, NODE),
        role="compute",
        model="smollm2-135m",
        shards=(0, 1),
        endpoint="http://127.0.0.1:8100",
        capacity=4,
    )


BODIES = [
    register_body(),
    Heartbeat(),
    Leave(),
    AttestStake(node=NODE, amount=10**18),
    CommitBatch((CommitmentRecord(H32, 1, 0, H32), CommitmentRecord(H32, 2, 0, H32))),
    RevealBatch((RevealRecord(H32, 1, 0, H32, H32),)),
    ShareBlockTx(ShareBlock(GENESIS_PREV_HASH, 1, 3, ((NODE, 12),))),
    VerdictVote(address_of(EVM), 3, H32, address_of(EVM), 7, "0x" + "ab" * 65),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.TYPE)
def test_committee_tx_roundtrip_signed_decodes_equal(body: object) -> None:
    tx = sign(body, KEY, 5)
    raw = tx.encode()
    decoded = decode(raw)
    assert decoded == tx
    assert decoded.type == body.TYPE  # type: ignore[attr-defined]
    decoded.verify()
    assert raw == decoded.encode()
    # the fast path (dropping "sig" from the raw bytes) equals re-encoding the unsigned envelope
    assert decoded.sign_bytes() == SIGN_DOMAIN + canonical_json(decoded.unsigned_json())


def test_committee_tx_sign_bytes_are_domain_plus_canonical_json() -> None:
    tx = sign(Heartbeat(), KEY, 1)
    expected = b'{"body":{},"nonce":1,"signer":"' + NODE.encode() + b'","type":"heartbeat"}'
    assert tx.sign_bytes() == SIGN_DOMAIN + expected


def test_committee_tx_tampered_body_fails_signature() -> None:
    tx = sign(AttestStake(node=NODE, amount=5), KEY, 1)
    doc = json.loads(tx.encode())
    doc["body"]["amount"] = "6"
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(TxSignatureError):
        decode(raw).verify()


def test_committee_tx_non_canonical_bytes_rejected() -> None:
    raw = sign(Heartbeat(), KEY, 1).encode()
    spaced = json.dumps(json.loads(raw), sort_keys=True).encode()  # with spaces
    with pytest.raises(TxDecodeError, match="canonical"):
        decode(spaced)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "not a JSON object"),
        (b"[1]", "not a JSON object"),
        (b"{not json", "invalid JSON"),
        (b'{"type":"x"}', "expected keys"),
        (b"{" + b" " * 70_000 + b"}", "limit"),
    ],
)
def test_committee_tx_malformed_bytes_raise_typed_error(raw: bytes, reason: str) -> None:
    with pytest.raises(TxDecodeError, match=reason):
        decode(raw)


def test_committee_tx_unknown_type_rejected() -> None:
    doc = json.loads(sign(Heartbeat(), KEY, 1).encode())
    doc["type"] = "mint_money"
    with pytest.raises(TxDecodeError, match="unknown tx type"):
        decode(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("role", "miner"),
        ("shards", [1, 0]),
        ("shards", []),
        ("capacity", 0),
        ("evm_address", "0x1234"),
        ("model", "bad model name"),
    ],
)
def test_committee_tx_register_bad_field_rejected(field: str, value: object) -> None:
    doc = register_body().to_json()
    doc[field] = value
    with pytest.raises(TxDecodeError):
        RegisterNode.from_json(doc)


def test_committee_tx_batch_duplicates_rejected() -> None:
    item = CommitmentRecord(H32, 1, 0, H32).to_json()
    with pytest.raises(TxDecodeError, match="duplicate"):
        CommitBatch.from_json({"commitments": [item, item]})


def test_committee_tx_amount_must_be_decimal_string() -> None:
    with pytest.raises(TxDecodeError):
        AttestStake.from_json({"node": NODE, "amount": 5})
    with pytest.raises(TxDecodeError, match="leading zeros"):
        AttestStake.from_json({"node": NODE, "amount": "05"})


def test_committee_tx_nonce_zero_rejected() -> None:
    with pytest.raises(TxDecodeError):
        sign(Heartbeat(), KEY, 0)


def test_committee_tx_unsigned_cannot_encode() -> None:
    with pytest.raises(Exception, match="not signed"):
        SignedTx(body=Heartbeat(), signer=NODE, nonce=1).encode()


def test_committee_registration_eip191_recovers_evm_address() -> None:
    signature = sign_registration(EVM, NODE)
    assert recover_registration(NODE, signature) == address_of(EVM)
    other = seeded_key("node-b").verify_key.encode().hex()
    assert recover_registration(other, signature) != address_of(EVM)


def test_share_block_hash_is_sha256_of_canonical_json() -> None:
    block = ShareBlock(GENESIS_PREV_HASH, 1, 3, (("aa" * 32, 2), ("bb" * 32, 5)))
    assert block.encode() == (
        b'{"committee_height":3,"contributions":[["'
        + b"aa" * 32
        + b'",2],["'
        + b"bb" * 32
        + b'",5]],"height":1,"prev_hash":"'
        + GENESIS_PREV_HASH.encode()
        + b'"}'
    )
    assert block.hash().startswith("sha256:")
    assert ShareBlock.from_json(block.to_json()) == block
    assert block.total_operations() == 7


@pytest.mark.parametrize(
    "contributions",
    [(("bb" * 32, 1), ("aa" * 32, 1)), (("aa" * 32, 0),), (("xyz", 1),)],
)
def test_share_block_bad_contributions_rejected(contributions: tuple) -> None:
    with pytest.raises(ShareBlockError):
        ShareBlock(GENESIS_PREV_HASH, 1, 0, contributions)


def test_committee_tx_trailing_newline_in_hex_field_rejected() -> None:
    with pytest.raises(TxDecodeError):
        AttestStake.from_json({"node": NODE + "\n", "amount": "1"})
    with pytest.raises(TxDecodeError):
        CommitmentRecord.from_json(
            {"session": H32 + "\n", "step": 1, "shard": 0, "commitment": H32}
        )
    with pytest.raises(ShareBlockError):
        ShareBlock(GENESIS_PREV_HASH + "\n", 1, 0, ())
