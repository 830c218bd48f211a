"""Committee tx vocabulary: canonical encoding, signatures, typed decode errors."""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Callable

import pytest

from abci_app.app import CommitteeApp
from abci_app.codes import Code
from abci_app.proto import abci_pb
from protocol.canonical import canonical_json
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.envelope import SIGN_DOMAIN, SignedTx, TxSignatureError, decode, sign
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    Leave,
    RegisterNode,
    recover_registration,
    sign_registration,
)
from protocol.committee.verification import VerdictVote
from protocol.eip712 import address_of
from protocol.errors import ProtocolError
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

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


def test_committee_tx_trailing_newline_in_hex_field_rejected() -> None:
    with pytest.raises(TxDecodeError):
        AttestStake.from_json({"node": NODE + "\n", "amount": "1"})
    with pytest.raises(TxDecodeError):
        CommitmentRecord.from_json(
            {"session": H32 + "\n", "step": 1, "shard": 0, "commitment": H32}
        )


# --- fuzz: hostile bytes at the chain's door -----------------------------------------------------
# CheckTx and FinalizeBlock run on bytes anyone can broadcast. An exception escaping the app
# becomes a ResponseException, which stops that validator's CometBFT node: one crafted tx would
# take validators down. Every mutation of a valid tx of every type must end in a typed
# `ProtocolError` (decode) or a named non-OK result code, with a log protobuf can serialise.
# Mutations come from a seeded generator, so a failure reproduces exactly.

MUTATIONS_PER_TX = 300

# Values a hostile sender would try in place of any JSON value.
NASTY_VALUES: list[object] = [
    None,
    True,
    -1,
    0,
    2**63,
    2**64,
    2**256,
    10**400,
    1.5,
    "",
    "\ud800",
    "\u2028",
    "\x00",
    "0x" + "zz" * 32,
    "9" * 100,
    [],
    [1] * 3,
    {},
    {"a": 1},
]


def _flip_byte(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _drop_slice(raw: bytes, rng: random.Random) -> bytes:
    start = rng.randrange(len(raw))
    return raw[:start] + raw[start + rng.randrange(1, 16) :]


def _insert_bytes(raw: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(raw) + 1)
    junk = rng.choice([b"\\ud800", b"\\u0000", b'"', b"\\", b"\xff", b"\xc3", b",", b"{}", b" "])
    return raw[:at] + junk + raw[at:]


def _paths(doc: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += _paths(value, (*prefix, index))
    return found


def _replace_value(raw: bytes, rng: random.Random) -> bytes:
    """Swap one JSON value (anywhere in the tree) for a nasty one, canonically re-encoded."""
    doc = json.loads(raw)
    path = rng.choice(_paths(doc)[1:])
    target = doc
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    target[path[-1]] = rng.choice(NASTY_VALUES)  # type: ignore[index]
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


MUTATORS: list[Callable[[bytes, random.Random], bytes]] = [
    _flip_byte,
    _drop_slice,
    _insert_bytes,
    _replace_value,
]


def _mutants(raw: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.choice(MUTATORS)(raw, rng) for _ in range(MUTATIONS_PER_TX)]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.TYPE)
def test_committee_tx_fuzz_decode_raises_only_protocol_errors(body: object) -> None:
    raw = sign(body, KEY, 3).encode()
    refused = 0
    for index, mutant in enumerate(_mutants(raw, seed=zlib.crc32(body.TYPE.encode()))):  # type: ignore[attr-defined]
        try:
            decode(mutant).verify()
        except ProtocolError as error:
            error.message.encode("utf-8")  # the log must be serialisable
            refused += 1
        except Exception as error:  # the point of the test
            pytest.fail(f"mutant {index} {mutant[:200]!r} raised {type(error).__name__}: {error}")
    # a mutation may be harmless (e.g. replacing a value by an equal one), but not many are
    assert refused >= MUTATIONS_PER_TX * 0.9


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b.TYPE)
def test_committee_tx_fuzz_check_tx_and_finalize_answer_with_codes(body: object) -> None:
    chain = Chain()
    app = CommitteeApp(chain.machine)
    pb = abci_pb()
    raw = sign(body, KEY, 3).encode()
    mutants = _mutants(raw, seed=7 + len(body.TYPE))  # type: ignore[attr-defined]
    for mutant in mutants:
        response = app.handle(pb.Request(check_tx=pb.RequestCheckTx(tx=mutant)))
        response.SerializeToString()  # valid UTF-8 log, well-formed message
        assert response.check_tx.code != Code.OK or decode(mutant).encode() == mutant
    # a byzantine proposer could put them straight into a block: ProcessProposal answers (it
    # does not raise), and FinalizeBlock gives each a named code
    machine = chain.machine
    height = chain.state.height + 1
    ok, reason = machine.process_proposal(height, mutants[:50])
    assert isinstance(ok, bool) and isinstance(reason, str)
    machine.begin_block(height, bytes(32))
    codes = [machine.deliver_tx(mutant, i).code for i, mutant in enumerate(mutants[:50])]
    machine.end_block()
    assert all(code in set(Code) for code in codes)
