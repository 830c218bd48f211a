"""The verifier's side of a spot check: open a ticket, recompute in one prefill, judge.

    result = check_ticket(sealed, request, verifier_key, shard=shard, commitment=value,
                          tolerance=load_calibration().tolerance(quant))
    result.outcome            # Outcome.PASSED / FAILED (→ verdict offence 3, 50 %) / SKIPPED
                              # (the node announces other numerics: not comparable bitwise)
    result.evidence_hash      # what every verifier's verdict vote names (None when passed)
    verdict_for(result, node=evm, challenger=me, nonce=n, consumer=fraud_proofs)  # to sign

`commitment` is the value the node put on the committee chain for the selected slot
(`/commitments?node=&session=`, or the compact batches): the ticket's fingerprint, the hash
chain of its inputs and its salt must open it (`protocol.served.served_output_hash`), so a node
that learns it was selected cannot swap in an honest fingerprint or other inputs, and every
verifier that asks for the same block gets the same ticket. A node
that sends no valid ticket before the deadline is judged with `timeout_result` (offence 4, 5 %).
A ticket that does not open, is not signed by the node for this request, or is malformed is
not an answer (the verifier keeps waiting until the deadline), because anyone can seal bytes
to a verifier; a validly signed ticket that fails is the node's own statement.

The shard is any object with `forward(hidden [1, T, H] torch, positions [T], cache)` and
`new_cache()` (node.model.shard.ShardModel) loaded from the same registered manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from nacl.signing import SigningKey

from node.verifier.fingerprint import Verdict, check, topk_rows
from protocol.eip712 import Verdict as Verdict712
from protocol.eip712 import commitment_value
from protocol.errors import ProtocolError
from protocol.fingerprint import TOPK, BlockFingerprint, Tolerance, compare_block, decode_block
from protocol.numerics import comparable, mismatch_line
from protocol.served import inputs_digests, served_output_hash
from protocol.spotcheck import Outcome, evidence_hash
from protocol.tickets import Ticket, TicketRequest, open_sealed

# A position whose recomputed top-k matches fewer than this many committed values is "bad";
# a block with any bad position fails. The block rule alone (≥ 900 ‰ of values) lets a node
# corrupt up to 3 of 32 positions per block (measured: noise on every 16th position passed every
# block); honest drift (≤ 1 ULP on 999 ‰ of values, docs/verification.md) never loses 3 of 4.
MIN_VALUES_PER_POSITION = TOPK // 2


@dataclass(frozen=True)
class TicketResult:
    outcome: Outcome
    reason: str
    verdict: Verdict | None = None  # the fingerprint comparison, when it ran
    evidence_hash: bytes | None = None  # the verdict's evidenceHash (None when passed)
    bad_positions: tuple[int, ...] = ()  # absolute positions under MIN_VALUES_PER_POSITION
    # the node's signed statement judged (signature ‖ ticket bytes, protocol.tickets.unseal),
    # kept on a FAILED result so the finder can forward it to its peers (node/verifier/findings)
    statement: bytes = field(default=b"", repr=False, compare=False)


def bad_positions(
    fingerprint: bytes, own: torch.Tensor, start: int, tolerance: Tolerance
) -> tuple[int, ...]:
    """Absolute positions of one block where fewer than MIN_VALUES_PER_POSITION of the
    verifier's top-k values match the committed polynomial within `tolerance.max_ulp`."""
    block, _ = decode_block(fingerprint)
    rows = topk_rows(own)
    bad = []
    for index, (poly, row) in enumerate(zip(block.polys, rows, strict=True)):
        single = compare_block(BlockFingerprint((poly,)), [row], tolerance)
        if single.matched < MIN_VALUES_PER_POSITION:
            bad.append(start + index)
    return tuple(bad)


def _result(
    request: TicketRequest,
    outcome: Outcome,
    reason: str,
    verdict: Verdict | None = None,
    bad: tuple[int, ...] = (),
) -> TicketResult:
    evidence = (
        None if outcome.offence is None else evidence_hash(request.seed, request.triple, outcome)
    )
    return TicketResult(outcome, reason, verdict, evidence, bad)


def timeout_result(request: TicketRequest) -> TicketResult:
    """No valid ticket before the deadline: offence 4 (ticket timeout, 5 %)."""
    return _result(request, Outcome.TIMEOUT, "no valid ticket before the deadline")


@torch.inference_mode()
def recompute_ticket(shard: Any, ticket: Ticket) -> torch.Tensor:
    """The shard's outputs for the ticket's positions [0, count), one prefill."""
    inputs = torch.from_numpy(ticket.inputs.copy())
    positions = torch.arange(ticket.count)
    return shard.forward(inputs, positions, shard.new_cache())


def judge_ticket(
    ticket: Ticket,
    request: TicketRequest,
    *,
    shard: Any,
    commitment: bytes,
    tolerance: Tolerance,
    numerics: int | None = None,
) -> TicketResult:
    """Judge an opened, node-signed ticket against the on-chain commitment and a recompute.

    `numerics` is what the node's registration announces (protocol/numerics.py; None:
    unannounced, judged as before). The commitment opening and the inputs' width hold on any
    numerics; the fingerprint comparison is bitwise-calibrated, so a node on other numerics
    than this verifier's is not recomputed: SKIPPED, never a conviction on the fingerprint."""
    triple = request.triple
    session = bytes.fromhex(triple.session[2:])
    digest = inputs_digests(ticket.inputs)[-1]  # the chain over every carried input position
    committed = served_output_hash(ticket.fingerprint, digest)
    opened = commitment_value(session, triple.block, triple.shard, committed, ticket.salt)
    if opened != commitment:
        return _result(request, Outcome.FAILED, "the ticket does not open the node's commitment")
    if ticket.hidden != int(shard.hidden_size):
        return _result(request, Outcome.FAILED, f"inputs of width {ticket.hidden}")
    if not comparable(numerics):
        return _result(request, Outcome.SKIPPED, f"not recomputed: {mismatch_line(numerics)}")
    own = recompute_ticket(shard, ticket)
    try:
        verdict = check(ticket.fingerprint, own[:, ticket.start :], ticket.start, tolerance)
    except ProtocolError as error:  # cannot happen for a parsed ticket; judged, not raised
        return _result(request, Outcome.FAILED, f"fingerprint does not fit: {error.message}")
    mine = own[:, ticket.start :]
    bad = bad_positions(ticket.fingerprint, mine, ticket.start, tolerance)
    if not verdict.passed or bad:
        return _result(
            request,
            Outcome.FAILED,
            f"fingerprint differs from the recomputation ({verdict.match_per_mille} ‰ match, "
            f"{len(bad)} bad positions)",
            verdict,
            bad,
        )
    return _result(request, Outcome.PASSED, "fingerprint matches", verdict)


def verdict_for(
    result: TicketResult, *, node: str, challenger: str, nonce: int, consumer: str
) -> Verdict712 | None:
    """The EIP-712 `Verdict` a validator's operator signs for a spot-check finding (the
    `verdict_vote` tx carries it; `FraudProofs.slashByVerdict` executes it): `node` is the
    offender's EVM address (its registration's `evm_address`), `consumer` the FraudProofs
    address. None for a passed check."""
    offence = result.outcome.offence
    if offence is None or result.evidence_hash is None:
        return None
    return Verdict712(node, offence, result.evidence_hash, challenger, nonce, consumer)


def check_ticket(
    sealed: bytes,
    request: TicketRequest,
    verifier_key: SigningKey,
    *,
    shard: Any,
    commitment: bytes,
    tolerance: Tolerance,
    numerics: int | None = None,
) -> TicketResult:
    """Open `sealed` (raises `TicketError` if it is not a valid answer from the node: keep
    waiting), then `judge_ticket`."""
    ticket = open_sealed(sealed, request, verifier_key)
    return judge_ticket(
        ticket, request, shard=shard, commitment=commitment, tolerance=tolerance, numerics=numerics
    )
