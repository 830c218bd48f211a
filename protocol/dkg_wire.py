"""Canonical bytes of the DKG's messages (`protocol.dkg`), for txs once the chain carries them.

    Deal           dealer u16 ‖ t u16 ‖ t × commitment (96) ‖ n u16 ‖ n × sealed share (116)
    Complaint      receiver u16 ‖ dealer u16
    Justification  dealer u16 ‖ receiver u16 ‖ share (32)

Integers are big-endian. A decoder refuses any other length (`DkgMessageError`), so each value
has exactly one encoding. The points and scalars inside are parsed strictly by `DkgState` when
the message is submitted, not here.
"""

from __future__ import annotations

from typing import Final

from protocol import bls
from protocol.dkg import (
    CIPHERTEXT_BYTES,
    MAX_PARTICIPANTS,
    Complaint,
    Deal,
    DkgMessageError,
    Justification,
)

_U16: Final = 2
MAX_DEAL_BYTES: Final = 3 * _U16 + MAX_PARTICIPANTS * (bls.G2_BYTES + CIPHERTEXT_BYTES)


def _u16(value: int) -> bytes:
    if not 0 <= value < 2**16:
        raise DkgMessageError("an index or count is below 2^16")
    return value.to_bytes(_U16, "big")


def _read_u16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + _U16], "big")


def encode_deal(deal: Deal) -> bytes:
    return (
        _u16(deal.dealer)
        + _u16(len(deal.commitments))
        + b"".join(deal.commitments)
        + _u16(len(deal.ciphertexts))
        + b"".join(deal.ciphertexts)
    )


def decode_deal(data: bytes) -> Deal:
    if not isinstance(data, bytes) or not 3 * _U16 <= len(data) <= MAX_DEAL_BYTES:
        raise DkgMessageError("a deal's length is out of range")
    dealer = _read_u16(data, 0)
    count = _read_u16(data, _U16)
    at = 2 * _U16
    end = at + count * bls.G2_BYTES
    if end + _U16 > len(data):
        raise DkgMessageError("a deal ends inside its commitments")
    commitments = tuple(data[i : i + bls.G2_BYTES] for i in range(at, end, bls.G2_BYTES))
    receivers = _read_u16(data, end)
    at = end + _U16
    if len(data) != at + receivers * CIPHERTEXT_BYTES:
        raise DkgMessageError("a deal's length does not match its counts")
    ciphertexts = tuple(
        data[i : i + CIPHERTEXT_BYTES] for i in range(at, len(data), CIPHERTEXT_BYTES)
    )
    return Deal(dealer, commitments, ciphertexts)


def encode_complaint(complaint: Complaint) -> bytes:
    return _u16(complaint.receiver) + _u16(complaint.dealer)


def decode_complaint(data: bytes) -> Complaint:
    if not isinstance(data, bytes) or len(data) != 2 * _U16:
        raise DkgMessageError(f"a complaint is {2 * _U16} bytes")
    return Complaint(_read_u16(data, 0), _read_u16(data, _U16))


def encode_justification(answer: Justification) -> bytes:
    if len(answer.share) != bls.SCALAR_BYTES:
        raise DkgMessageError(f"a revealed share is {bls.SCALAR_BYTES} bytes")
    return _u16(answer.dealer) + _u16(answer.receiver) + answer.share


def decode_justification(data: bytes) -> Justification:
    if not isinstance(data, bytes) or len(data) != 2 * _U16 + bls.SCALAR_BYTES:
        raise DkgMessageError(f"a justification is {2 * _U16 + bls.SCALAR_BYTES} bytes")
    return Justification(_read_u16(data, 0), _read_u16(data, _U16), data[2 * _U16 :])
