"""The verifier's ticket judge (node/verifier/tickets.py) on a tiny deterministic shard:
commitment opening, the block rule, the per-position rule, outcomes and evidence."""

from __future__ import annotations

import hashlib

import pytest
import torch
from nacl.signing import SigningKey

from node.verifier.fingerprint import fingerprint_bytes
from node.verifier.tickets import (
    MIN_VALUES_PER_POSITION,
    check_ticket,
    judge_ticket,
    timeout_result,
    verdict_for,
)
from protocol.eip712 import commitment_value
from protocol.fingerprint import Tolerance
from protocol.routing import output_hash
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Outcome, Triple, evidence_hash
from protocol.tickets import TicketRequest, TicketSealError, decode_ticket, encode_ticket, seal

pytestmark = pytest.mark.unit

H = 16
NODE = SigningKey(b"\x31" * 32)
VERIFIER = SigningKey(b"\x32" * 32)
SEED = "0x" + hashlib.sha256(b"judge seed").hexdigest()
SESSION = hashlib.sha256(b"judge session").digest()
TOLERANCE = Tolerance(max_ulp=2, min_match_per_mille=900, max_mean_ulp_milli=500)


class TinyShard:
    """forward = a fixed position-independent map (tanh of a fixed linear layer) ×50."""

    hidden_size = H

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.randn(H, H, generator=generator)

    def new_cache(self) -> None:
        return None

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: None) -> torch.Tensor:
        return torch.tanh(hidden @ self.weight) * 50


INPUTS = torch.randn(1, 64, H, generator=torch.Generator().manual_seed(1))


def _request(block: int = 1) -> TicketRequest:
    triple = Triple(NODE.verify_key.encode().hex(), "0x" + SESSION.hex(), block, 2)
    return TicketRequest(triple, SEED, VERIFIER.verify_key.encode().hex()).signed(VERIFIER)


def _ticket(outputs: torch.Tensor, block: int = 1, salt: bytes = b"\x09" * 32):
    start, end = 32 * block, 32 * block + 32
    fingerprint = fingerprint_bytes(outputs[:, start:end], start)
    bound = served_output_hash(fingerprint, inputs_digests(INPUTS[:, :end].numpy())[block])
    commitment = commitment_value(SESSION, block, 2, bound, salt)
    plain = encode_ticket(block, salt, fingerprint, INPUTS[:, :end].numpy())
    return decode_ticket(plain), commitment, plain


def test_judge_honest_block_passes() -> None:
    shard = TinyShard()
    ticket, commitment, _ = _ticket(shard.forward(INPUTS, torch.arange(64), None))
    result = judge_ticket(
        ticket, _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE
    )
    assert result.outcome is Outcome.PASSED and result.evidence_hash is None
    assert (
        verdict_for(
            result,
            node="0x" + "11" * 20,
            challenger="0x" + "22" * 20,
            nonce=1,
            consumer="0x" + "33" * 20,
        )
        is None
    )


def test_judge_one_corrupted_position_fails_by_the_position_rule() -> None:
    shard = TinyShard()
    outputs = shard.forward(INPUTS, torch.arange(64), None).clone()
    outputs[0, 40] = outputs[0, 40] * 0.9  # one position of block 1 (positions 32..63)
    ticket, commitment, _ = _ticket(outputs)
    result = judge_ticket(
        ticket, _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE
    )
    assert result.verdict is not None and result.verdict.passed  # 31/32 positions: block rule ok
    assert result.outcome is Outcome.FAILED and result.bad_positions == (40,)
    assert MIN_VALUES_PER_POSITION == 2
    assert result.evidence_hash == evidence_hash(SEED, _request().triple, Outcome.FAILED)
    verdict = verdict_for(
        result,
        node="0x" + "11" * 20,
        challenger="0x" + "22" * 20,
        nonce=5,
        consumer="0x" + "33" * 20,
    )
    assert verdict is not None and verdict.offence == 3
    assert verdict.evidence_hash == result.evidence_hash


def test_judge_ticket_not_opening_the_commitment_fails() -> None:
    shard = TinyShard()
    ticket, _, _ = _ticket(shard.forward(INPUTS, torch.arange(64), None))
    other = commitment_value(SESSION, 1, 2, output_hash(b"\x01\x01" + b"\x00" * 8), b"\x00" * 32)
    result = judge_ticket(ticket, _request(), shard=shard, commitment=other, tolerance=TOLERANCE)
    assert result.outcome is Outcome.FAILED and "does not open" in result.reason
    assert result.verdict is None  # judged before any recomputation


def test_judge_ticket_with_other_inputs_than_committed_fails() -> None:
    """The commitment binds the inputs: a node that hands over inputs its committed outputs
    recompute from, but not the inputs it committed, fails before any recomputation."""
    shard = TinyShard()
    ticket, commitment, _ = _ticket(shard.forward(INPUTS, torch.arange(64), None))
    other = INPUTS[:, :64].numpy().copy()
    other[0, 3, 0] += 1.0  # one input value of block 0 (the block's context)
    forged = encode_ticket(1, ticket.salt, ticket.fingerprint, other)
    result = judge_ticket(
        decode_ticket(forged), _request(), shard=shard, commitment=commitment, tolerance=TOLERANCE
    )
    assert result.outcome is Outcome.FAILED and "does not open" in result.reason


def test_check_ticket_opens_sealed_and_refuses_strangers() -> None:
    shard = TinyShard()
    _, commitment, plain = _ticket(shard.forward(INPUTS, torch.arange(64), None))
    request = _request()
    result = check_ticket(
        seal(plain, request, NODE),
        request,
        VERIFIER,
        shard=shard,
        commitment=commitment,
        tolerance=TOLERANCE,
    )
    assert result.outcome is Outcome.PASSED
    with pytest.raises(TicketSealError):  # not an answer: the verifier keeps waiting
        check_ticket(
            b"\x00" * 200,
            request,
            VERIFIER,
            shard=shard,
            commitment=commitment,
            tolerance=TOLERANCE,
        )


def test_timeout_result_is_offence_four() -> None:
    result = timeout_result(_request())
    assert result.outcome is Outcome.TIMEOUT and result.outcome.offence == 4
    assert result.evidence_hash == evidence_hash(SEED, _request().triple, Outcome.TIMEOUT)
