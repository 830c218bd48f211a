"""ZK ticket encoding (protocol/zkticket.py): the golden vector shared with the Hardhat tests,
field encoding of signed fixed-point values, and the fault-proof blob's parse step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.zkticket import (
    FIELD_MODULUS,
    FaultProof,
    ZkTicketError,
    from_field,
    tensor_hash,
    to_field,
    words,
)

VECTOR = json.loads((Path(__file__).parents[1] / "vectors" / "zk_ticket.json").read_text())


def _ints(values: list[str]) -> list[int]:
    return [int(v) for v in values]


def test_zkticket_golden_vector_matches_words_hashes_and_blob() -> None:
    inputs, outputs = _ints(VECTOR["inputs"]), _ints(VECTOR["outputs"])
    assert int(VECTOR["field_modulus"]) == FIELD_MODULUS
    assert "0x" + words(inputs).hex() == VECTOR["input_words"]
    assert "0x" + words(outputs).hex() == VECTOR["output_words"]
    assert "0x" + tensor_hash(inputs).hex() == VECTOR["input_hash"]
    assert "0x" + tensor_hash(outputs).hex() == VECTOR["output_hash"]
    proof = FaultProof(tuple(inputs), tuple(outputs), bytes.fromhex(VECTOR["proof_bytes"][2:]))
    assert "0x" + proof.encode().hex() == VECTOR["fault_proof"]


def test_zkticket_negative_values_wrap_and_round_trip() -> None:
    assert to_field(-1) == FIELD_MODULUS - 1
    for value in (0, 1, -1, 585, -98, 2**127, -(2**127)):
        assert from_field(to_field(value)) == value


@pytest.mark.parametrize("bad", [2**128, -(2**128), True, 1.0])
def test_zkticket_to_field_non_fixed_point_is_refused(bad: object) -> None:
    with pytest.raises(ZkTicketError):
        to_field(bad)  # type: ignore[arg-type]


def test_zkticket_from_field_non_canonical_or_huge_is_refused() -> None:
    with pytest.raises(ZkTicketError, match="canonical"):
        from_field(FIELD_MODULUS)
    with pytest.raises(ZkTicketError, match="not a fixed-point"):
        from_field(FIELD_MODULUS // 3)


def test_zkticket_decode_round_trips_and_refuses_bad_shapes() -> None:
    proof = FaultProof((3, -4, 5), (-6,), b"\x01" * 40)
    blob = proof.encode()
    assert FaultProof.decode(blob, 3, 1) == proof
    with pytest.raises(ZkTicketError, match="bytes"):
        FaultProof.decode(blob[: 4 * 32], 3, 1)  # no proof bytes after the instances
    with pytest.raises(ZkTicketError, match="canonical"):
        non_canonical = (to_field(-6) + FIELD_MODULUS).to_bytes(32, "big")
        FaultProof.decode(blob[: 3 * 32] + non_canonical + blob[4 * 32 :], 3, 1)
    with pytest.raises(ZkTicketError):
        FaultProof.decode("00", 3, 1)  # type: ignore[arg-type]


def test_zkticket_empty_or_oversized_parts_are_refused() -> None:
    with pytest.raises(ZkTicketError):
        words([])
    with pytest.raises(ZkTicketError):
        FaultProof((1,), (2,), b"").encode()
