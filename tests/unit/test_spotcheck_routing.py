"""Computational-randomness routing (protocol/routing.py): the next node is a function of the
previous node's committed output; every deviation is a named error; fraud pairs are named."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from protocol.eip712 import Commitment, Reveal, address_of, fraud_proofs_domain
from protocol.fingerprint import encode_block
from protocol.routing import (
    ROUTE_STEP,
    RevealMismatchError,
    RouteCandidatesError,
    RouteFingerprintError,
    RouteMismatchError,
    RouteSaltError,
    RouteSignatureError,
    RouteSlotError,
    RouteStep,
    check_step,
    fraud_proof_for,
    next_node,
    output_hash,
    route_commitment,
    route_salt,
    sign_step,
)

DOMAIN = fraud_proofs_domain(31337, "0x" + "12" * 20)
KEY = "0x" + "41" * 32
OTHER_KEY = "0x" + "42" * 32
SESSION = hashlib.sha256(b"hop tag").digest()
CANDIDATES = [hashlib.sha256(bytes([i])).hexdigest() for i in range(5)]
MANIFEST = b"\x05" * 32
INPUT = b"\x06" * 32


def _fp(value: int) -> bytes:
    return encode_block([[(1, value), (2, 0x4000), (3, 0x4200), (4, 0x4400)]] * 32)


def _step(fp: bytes | None = None, key: str = KEY) -> RouteStep:
    return sign_step(
        key,
        DOMAIN,
        SESSION,
        0,
        fp or _fp(0x3C00),
        manifest_hash=MANIFEST,
        input_hash=INPUT,
        signed_at=1_700_000_000,
    )


def test_route_next_node_deterministic_and_order_free() -> None:
    _, _, value = route_commitment(SESSION, 0, _fp(0x3C00))
    chosen = next_node(value, 1, CANDIDATES)
    assert chosen in CANDIDATES
    assert chosen == next_node(value, 1, list(reversed(CANDIDATES)) + CANDIDATES[:2])


def test_route_spreads_over_candidates() -> None:
    counts = Counter(
        next_node(route_commitment(SESSION, 0, _fp(v))[2], 1, CANDIDATES)
        for v in range(0x3000, 0x3000 + 1000)
    )
    assert set(counts) == set(CANDIDATES)
    assert all(140 < c < 260 for c in counts.values()), counts


def test_route_depends_on_output_shard_and_candidates() -> None:
    values = [route_commitment(SESSION, 0, _fp(v))[2] for v in range(0x3000, 0x3040)]
    picks = {next_node(v, 1, CANDIDATES) for v in values}
    assert len(picks) > 1  # different outputs, different successors
    value = values[0]
    digests = {next_node(value, shard, CANDIDATES) for shard in range(1, 30)}
    assert len(digests) > 1
    assert next_node(value, 1, CANDIDATES[:1]) == CANDIDATES[0]


@pytest.mark.parametrize("bad", [[], ["XY" * 32], ["ab" * 31]])
def test_route_bad_candidates_named_error(bad: list[str]) -> None:
    with pytest.raises(RouteCandidatesError):
        next_node(b"\x00" * 32, 1, bad)


def test_route_check_honest_step_returns_signer_and_derives_next() -> None:
    step = _step()
    expected = next_node(step.commitment.commitment, 1, CANDIDATES)
    signer = check_step(
        step,
        DOMAIN,
        node_address=address_of(KEY),
        next_shard=1,
        candidates=CANDIDATES,
        next_key=expected,
    )
    assert signer == address_of(KEY)
    assert step.commitment.step == ROUTE_STEP


def test_route_check_wrong_next_node_mismatch() -> None:
    step = _step()
    expected = next_node(step.commitment.commitment, 1, CANDIDATES)
    wrong = next(c for c in CANDIDATES if c != expected)
    with pytest.raises(RouteMismatchError) as caught:
        check_step(step, DOMAIN, next_shard=1, candidates=CANDIDATES, next_key=wrong)
    assert caught.value.expected == expected and caught.value.got == wrong


def _resign(step: RouteStep, commitment: Commitment, reveal: Reveal, key: str = KEY) -> RouteStep:
    return RouteStep(
        commitment, commitment.sign(key, DOMAIN), reveal, reveal.sign(key, DOMAIN), step.fingerprint
    )


def test_route_check_ground_salt_is_refused() -> None:
    step = _step()
    r = step.reveal
    salt = b"\x99" * 32  # a salt of the node's choosing: steering
    reveal = Reveal(r.session, r.step, r.shard, MANIFEST, INPUT, r.output_hash, salt, r.signed_at)
    commitment = Commitment(r.session, r.step, r.shard, reveal.commitment_value(), r.signed_at)
    with pytest.raises(RouteSaltError):
        check_step(_resign(step, commitment, reveal), DOMAIN)


def test_route_check_reveal_not_opening_commitment_is_mismatch_and_provable() -> None:
    step = _step()
    r = step.reveal
    other_out = output_hash(_fp(0x3C01))
    reveal = Reveal(
        r.session,
        r.step,
        r.shard,
        MANIFEST,
        INPUT,
        other_out,
        route_salt(r.session, r.shard, other_out),
        r.signed_at,
    )
    lying = _resign(step, step.commitment, reveal)
    with pytest.raises(RevealMismatchError):
        check_step(lying, DOMAIN)
    pair = ((lying.commitment, lying.commitment_sig), (lying.reveal, lying.reveal_sig))
    assert fraud_proof_for(*pair) == "reveal_mismatch"
    assert fraud_proof_for((step.commitment, b""), (step.reveal, b"")) is None


def test_route_two_commitments_for_one_slot_are_equivocation() -> None:
    one, two = _step(_fp(0x3C00)), _step(_fp(0x3C01))
    assert fraud_proof_for((one.commitment, b""), (two.commitment, b"")) == "equivocation"
    assert fraud_proof_for((one.commitment, b""), (one.commitment, b"")) is None
    moved = Commitment(SESSION, 3, 0, one.commitment.commitment, 1)
    assert fraud_proof_for((one.commitment, b""), (moved, b"")) is None


def test_route_check_fingerprint_must_hash_to_output() -> None:
    step = _step()
    swapped = RouteStep(
        step.commitment, step.commitment_sig, step.reveal, step.reveal_sig, _fp(0x3C05)
    )
    with pytest.raises(RouteFingerprintError):
        check_step(swapped, DOMAIN)
    garbage = RouteStep(step.commitment, step.commitment_sig, step.reveal, step.reveal_sig, b"\x01")
    with pytest.raises(RouteFingerprintError):
        check_step(garbage, DOMAIN)


def test_route_check_signatures() -> None:
    step = _step()
    with pytest.raises(RouteSignatureError):
        check_step(step, DOMAIN, node_address=address_of(OTHER_KEY))
    mixed = RouteStep(
        step.commitment,
        step.commitment_sig,
        step.reveal,
        step.reveal.sign(OTHER_KEY, DOMAIN),
        step.fingerprint,
    )
    with pytest.raises(RouteSignatureError):
        check_step(mixed, DOMAIN)
    other_domain = fraud_proofs_domain(1, "0x" + "12" * 20)
    with pytest.raises(RouteSignatureError):
        check_step(step, other_domain, node_address=address_of(KEY))
    broken = RouteStep(
        step.commitment, b"\x00" * 65, step.reveal, step.reveal_sig, step.fingerprint
    )
    with pytest.raises(RouteSignatureError):
        check_step(broken, DOMAIN)


def test_route_check_slot_rules() -> None:
    step = _step()
    r = step.reveal
    c = Commitment(r.session, 7, r.shard, step.commitment.commitment, r.signed_at)
    with pytest.raises(RouteSlotError):
        check_step(_resign(step, c, r), DOMAIN)
    with pytest.raises(RouteSlotError):
        check_step(step, DOMAIN, next_shard=2, candidates=CANDIDATES)
