"""Compact binary commit/reveal batches: round trips, and a hostile grammar in which every
malformed input gets a named `TxDecodeError` subclass, never another exception."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import commit_batch as cb
from protocol.committee.commitments import CommitBatch, CommitmentRecord, RevealBatch, RevealRecord
from protocol.committee.envelope import MAX_TX_BYTES, TxSignatureError, sign
from protocol.committee.grammar import MAX_NONCE, TxDecodeError
from protocol.committee.registry import Heartbeat
from protocol.errors import ProtocolError
from tests.committee_chain import seeded_key

pytestmark = pytest.mark.unit

KEY = seeded_key("batch-node")
NODE = KEY.verify_key.encode().hex()
SESSION = bytes(range(32))
SETTINGS = settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def commit_raw(count: int = 3, nonce: int = 7) -> bytes:
    rows = [(step, 1, bytes([step % 256]) * 32) for step in range(count)]
    return cb.encode_batch(cb.KIND_COMMIT, SESSION, rows, KEY, nonce)


def reveal_raw(count: int = 3) -> bytes:
    rows = [(step, 2, b"\x11" * 32, bytes([step]) * 32) for step in range(count)]
    return cb.encode_batch(cb.KIND_REVEAL, SESSION, rows, KEY, 9)


def resign(unsigned: bytes) -> bytes:
    """Bytes with a valid signature: decoding errors must come from the format, not the sig."""
    return unsigned + KEY.sign(cb.BINARY_SIGN_DOMAIN + unsigned).signature


# --- round trips --------------------------------------------------------------------------------

keys32 = st.binary(min_size=32, max_size=32)
steps = st.integers(0, (1 << 64) - 1)
shards = st.integers(0, (1 << 32) - 1)


@SETTINGS
@given(
    session=keys32,
    nonce=st.integers(1, MAX_NONCE),
    records=st.dictionaries(st.tuples(steps, shards), keys32, min_size=1, max_size=40),
)
def test_commit_batch_roundtrip_any_records_decode_equal(
    session: bytes, nonce: int, records: dict[tuple[int, int], bytes]
) -> None:
    rows = [(step, shard, value) for (step, shard), value in records.items()]
    raw = cb.encode_batch(cb.KIND_COMMIT, session, rows, KEY, nonce)
    tx = cb.decode_batch(raw)
    tx.verify()
    assert tx.type == "commit" and tx.signer == NODE and tx.nonce == nonce
    assert len(raw) == cb.HEADER_BYTES + 44 * len(rows) + 64
    expected = sorted(rows)
    assert [(c.step, c.shard, c.commitment) for c in tx.body.commitments] == [
        (step, shard, "0x" + value.hex()) for step, shard, value in expected
    ]
    assert {c.session for c in tx.body.commitments} == {"0x" + session.hex()}
    # one set of records has one encoding, whatever order it was given in
    assert cb.encode_batch(cb.KIND_COMMIT, session, reversed(rows), KEY, nonce) == raw
    assert cb.sign_batch(tx.body, KEY, nonce).raw == raw


@SETTINGS
@given(
    session=keys32,
    records=st.dictionaries(
        st.tuples(steps, shards), st.tuples(keys32, keys32), min_size=1, max_size=20
    ),
)
def test_reveal_batch_roundtrip_any_records_decode_equal(
    session: bytes, records: dict[tuple[int, int], tuple[bytes, bytes]]
) -> None:
    rows = [(step, shard, out, salt) for (step, shard), (out, salt) in records.items()]
    raw = cb.encode_batch(cb.KIND_REVEAL, session, rows, KEY, 3)
    tx = cb.decode_batch(raw)
    tx.verify()
    assert tx.type == "reveal"
    assert [(r.step, r.shard, r.output_hash, r.salt) for r in tx.body.reveals] == [
        (step, shard, "0x" + out.hex(), "0x" + salt.hex())
        for step, shard, out, salt in sorted(rows)
    ]


def test_commit_batch_largest_fits_tx_limit() -> None:
    for kind in (cb.KIND_COMMIT, cb.KIND_REVEAL):
        size = cb.HEADER_BYTES + cb.MAX_RECORDS[kind] * cb.RECORD_BYTES[kind] + cb.SIG_BYTES
        assert size <= MAX_TX_BYTES


def test_commit_batch_sign_batch_matches_json_body() -> None:
    session = "0x" + SESSION.hex()
    body = CommitBatch(
        (
            CommitmentRecord(session, 5, 0, "0x" + "aa" * 32),
            CommitmentRecord(session, 2, 0, "0x" + "bb" * 32),
        )
    )
    tx = cb.sign_batch(body, KEY, 4)
    assert [c.step for c in tx.body.commitments] == [2, 5]
    assert set(tx.body.commitments) == set(body.commitments)
    reveal = RevealBatch((RevealRecord(session, 2, 0, "0x" + "cc" * 32, "0x" + "dd" * 32),))
    assert cb.sign_batch(reveal, KEY, 5).body == reveal


def test_commit_batch_decode_tx_dispatches_json_and_binary() -> None:
    raw = commit_raw()
    assert isinstance(cb.decode_tx(raw), cb.BatchTx)
    heartbeat = sign(Heartbeat(), KEY, 1).encode()
    assert cb.decode_tx(heartbeat).type == "heartbeat"


# --- signatures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0 + 5, 40, 50, 77, 80, -1])
def test_commit_batch_any_changed_byte_fails_signature(offset: int) -> None:
    raw = bytearray(commit_raw())
    raw[offset] ^= 0x01
    try:
        tx = cb.decode_batch(bytes(raw))
    except TxDecodeError:
        return  # the change broke the format first (e.g. the order): also refused
    with pytest.raises(TxSignatureError):
        tx.verify()


def test_commit_batch_json_domain_signature_refused() -> None:
    unsigned = commit_raw()[: -cb.SIG_BYTES]
    wrong = unsigned + KEY.sign(b"planet-committee-tx/v1\n" + unsigned).signature
    with pytest.raises(TxSignatureError):
        cb.decode_batch(wrong).verify()


def test_commit_batch_other_signer_refused() -> None:
    raw = bytearray(commit_raw())
    raw[5:37] = seeded_key("someone-else").verify_key.encode()
    with pytest.raises(TxSignatureError):
        cb.decode_batch(bytes(raw)).verify()


# --- the hostile grammar: each class of malformed bytes has its own named error -----------------


def _header(raw: bytes, **fields: int | bytes) -> bytes:
    magic, kind, signer, nonce, session, count = cb.HEADER.unpack_from(raw)
    values = {"magic": magic, "kind": kind, "signer": signer, "nonce": nonce}
    values.update({"session": session, "count": count})
    values.update(fields)
    return cb.HEADER.pack(*values.values()) + raw[cb.HEADER_BYTES :]


def _records(raw: bytes) -> list[bytes]:
    body = raw[cb.HEADER_BYTES : -cb.SIG_BYTES]
    return [body[i : i + 44] for i in range(0, len(body), 44)]


def _with_records(raw: bytes, records: list[bytes]) -> bytes:
    head = _header(raw, count=len(records))[: cb.HEADER_BYTES]
    return resign(head + b"".join(records))


HOSTILE: list[tuple[str, bytes, type[TxDecodeError]]] = [
    ("empty", b"", cb.BatchTruncatedError),
    ("magic only", cb.MAGIC, cb.BatchTruncatedError),
    ("wrong magic", b"\x01PCX" + commit_raw()[4:], cb.BatchMagicError),
    ("json-looking", b"\x01{}", cb.BatchMagicError),
    ("unknown kind", _header(commit_raw(), kind=3), cb.BatchKindError),
    ("kind zero", _header(commit_raw(), kind=0), cb.BatchKindError),
    ("count zero", _header(commit_raw(), count=0), cb.BatchCountError),
    ("count over limit", _header(commit_raw(), count=1025), cb.BatchCountError),
    ("reveal count over limit", _header(reveal_raw(), count=801), cb.BatchCountError),
    ("count max uint16", _header(commit_raw(), count=0xFFFF), cb.BatchCountError),
    ("nonce zero", _header(commit_raw(), nonce=0), cb.BatchNonceError),
    ("nonce 2^63", _header(commit_raw(), nonce=1 << 63), cb.BatchNonceError),
    ("count says more", _header(commit_raw(), count=4), cb.BatchTruncatedError),
    ("count says fewer", _header(commit_raw(), count=2), cb.BatchTrailingBytesError),
    ("no signature", commit_raw()[: -cb.SIG_BYTES], cb.BatchTruncatedError),
    ("half signature", commit_raw()[:-32], cb.BatchTruncatedError),
    ("one byte short", commit_raw()[:-1], cb.BatchTruncatedError),
    ("trailing byte", commit_raw() + b"\x00", cb.BatchTrailingBytesError),
    ("over the size limit", cb.MAGIC + b"\x00" * MAX_TX_BYTES, cb.BatchSizeError),
    (
        "records swapped",
        _with_records(commit_raw(), list(reversed(_records(commit_raw())))),
        cb.BatchOrderError,
    ),
    (
        "duplicate record",
        _with_records(commit_raw(), [_records(commit_raw())[0]] * 2),
        cb.BatchDuplicateError,
    ),
    (
        "same step and shard, other value",
        _with_records(
            commit_raw(),
            [_records(commit_raw())[0], _records(commit_raw())[0][:12] + b"\xee" * 32],
        ),
        cb.BatchDuplicateError,
    ),
    (
        "shard order within a step",
        _with_records(
            commit_raw(),
            [struct.pack(">QI32s", 1, 5, b"\x00" * 32), struct.pack(">QI32s", 1, 4, b"\x00" * 32)],
        ),
        cb.BatchOrderError,
    ),
]


@pytest.mark.parametrize(("name", "raw", "error"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_commit_batch_hostile_input_named_error(
    name: str, raw: bytes, error: type[TxDecodeError]
) -> None:
    with pytest.raises(error):
        cb.decode_batch(raw)
    with pytest.raises(TxDecodeError):  # what the ABCI app calls (JSON or binary)
        cb.decode_tx(raw)


@pytest.mark.parametrize("cut", range(0, 79 + 3 * 44 + 64))
def test_commit_batch_every_truncation_named_error(cut: int) -> None:
    raw = commit_raw()
    with pytest.raises((cb.BatchTruncatedError, cb.BatchMagicError)):
        cb.decode_batch(raw[:cut])


@SETTINGS
@given(st.binary(max_size=600))
def test_commit_batch_random_bytes_after_magic_decode_or_named_error(tail: bytes) -> None:
    for raw in (cb.MAGIC + tail, cb.MAGIC + b"\x01" + tail, tail):
        try:
            tx = cb.decode_batch(raw)
        except TxDecodeError:
            continue
        with contextlib.suppress(TxSignatureError):
            tx.verify()


@SETTINGS
@given(st.data())
def test_commit_batch_mutated_valid_batch_decodes_or_named_error(data: st.DataObject) -> None:
    raw = bytearray(commit_raw(count=data.draw(st.integers(1, 5))))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    with contextlib.suppress(TxDecodeError, TxSignatureError):
        cb.decode_batch(bytes(raw)).verify()


def test_commit_batch_encode_refuses_what_the_format_cannot_carry() -> None:
    with pytest.raises(ProtocolError):
        cb.encode_batch(cb.KIND_COMMIT, SESSION, [], KEY, 1)
    with pytest.raises(ProtocolError):
        cb.encode_batch(cb.KIND_COMMIT, SESSION, [(1, 1, b"\x00" * 32)] * 2, KEY, 1)
    with pytest.raises(ProtocolError):
        cb.encode_batch(cb.KIND_COMMIT, SESSION, [(1 << 64, 1, b"\x00" * 32)], KEY, 1)
    with pytest.raises(ProtocolError):
        cb.encode_batch(cb.KIND_COMMIT, SESSION, [(1, 1, b"\x00" * 31)], KEY, 1)
    with pytest.raises(ProtocolError):
        cb.encode_batch(cb.KIND_COMMIT, SESSION, [(1, 1, b"\x00" * 32)], KEY, 0)
    with pytest.raises(ProtocolError):
        cb.encode_batch(9, SESSION, [(1, 1, b"\x00" * 32)], KEY, 1)
    mixed = CommitBatch(
        (
            CommitmentRecord("0x" + "11" * 32, 1, 0, "0x" + "aa" * 32),
            CommitmentRecord("0x" + "22" * 32, 1, 0, "0x" + "aa" * 32),
        )
    )
    with pytest.raises(ProtocolError, match="one session"):
        cb.sign_batch(mixed, KEY, 1)


@SETTINGS
@given(session=keys32, step=steps, shard=shards, output=keys32, salt=keys32)
def test_commitment_value_packed_equals_eth_abi_encoding(
    session: bytes, step: int, shard: int, output: bytes, salt: bytes
) -> None:
    from eth_abi import encode as abi_encode
    from eth_utils import keccak

    from protocol.eip712 import commitment_value

    types = ["bytes32", "uint64", "uint32", "bytes32", "bytes32"]
    expected = keccak(abi_encode(types, [session, step, shard, output, salt]))
    assert commitment_value(session, step, shard, output, salt) == expected
    assert (
        commitment_value("0x" + session.hex(), step, shard, output, "0x" + salt.hex()) == expected
    )
