"""protocol.blind_bls: threshold blind BLS credits under one committee key (issue 42, attack 1).

The committee is a real 4-validator DKG (`tests.threshold_committee`), t = 3.
"""

from __future__ import annotations

import itertools
import secrets
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import blind_bls, bls, shamir
from protocol.blind_bls import ThresholdCredit
from tests.threshold_committee import Committee, run_dkg

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def committee() -> Committee:
    return run_dkg(4)


def nonces(count: int) -> list[bytes]:
    return [secrets.token_bytes(blind_bls.NONCE_BYTES) for _ in range(count)]


def sign(c: Committee, signers: tuple[int, ...], blinded: bytes) -> dict[int, bytes]:
    return {i: blind_bls.partial_sign(c.shares[i], blinded) for i in signers}


signer_sets = st.sets(st.integers(1, 4), min_size=3, max_size=4).map(lambda s: tuple(sorted(s)))


@SETTINGS
@given(count=st.integers(1, 4), assignment=st.lists(signer_sets, min_size=4, max_size=4))
def test_a_mint_of_n_yields_exactly_n_credits(
    count: int, assignment: list[tuple[int, ...]]
) -> None:
    """Every validator signs the mint's one list of N blinded messages; whichever validators'
    partials the client combines for which message, it gets N valid credits and no more."""
    c = committee()
    blindings = [blind_bls.blind(9, nonce) for nonce in nonces(count)]
    valid: set[bytes] = set()
    for blinding, answered in zip(blindings, assignment, strict=False):
        partials = sign(c, answered, blinding.blinded)
        for index, partial in partials.items():
            blind_bls.verify_partial(c.public_share(index), blinding.blinded, partial)
        # every t-subset of the validators that answered gives the same, valid credit
        for subset in itertools.combinations(answered, c.threshold):
            blind_sig = blind_bls.combine({i: partials[i] for i in subset}, c.threshold)
            credit = blind_bls.unblind(blinding, blind_sig, c.group_key)
            valid.add(credit.to_bytes())
    assert len(valid) == count
    blind_bls.verify_credits(c.group_key, [ThresholdCredit.from_bytes(v) for v in valid])


@SETTINGS
@given(split=st.integers(1, 2), signers=signer_sets)
def test_partials_over_different_messages_never_combine(
    split: int, signers: tuple[int, ...]
) -> None:
    """t partials, some on message a's blinding and the rest on b's, verify for neither."""
    c = committee()
    a, b = (blind_bls.blind(9, nonce) for nonce in nonces(2))
    chosen = signers[: c.threshold]
    mixed = {
        i: blind_bls.partial_sign(c.shares[i], (a if k < split else b).blinded)
        for k, i in enumerate(chosen)
    }
    blind_sig = blind_bls.combine(mixed, c.threshold)
    for blinding in (a, b):
        with pytest.raises(blind_bls.CreditSignatureError):
            blind_bls.unblind(blinding, blind_sig, c.group_key)
    # and a partial made for b does not pass as one for a
    with pytest.raises(blind_bls.PartialInvalidError):
        blind_bls.verify_partial(
            c.public_share(chosen[-1]),
            a.blinded,
            blind_bls.partial_sign(c.shares[chosen[-1]], b.blinded),
        )


@SETTINGS
@given(signers=st.sets(st.integers(1, 4), min_size=1, max_size=2).map(sorted))
def test_fewer_than_t_partials_never_make_a_credit(signers: list[int]) -> None:
    c = committee()
    blinding = blind_bls.blind(9, nonces(1)[0])
    partials = sign(c, tuple(signers), blinding.blinded)
    with pytest.raises(blind_bls.NotEnoughPartialsError):
        blind_bls.combine(partials, c.threshold)
    # interpolating the few partials as if the threshold were theirs gives no valid credit
    forced = blind_bls.combine(partials, len(partials))
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.unblind(blinding, forced, c.group_key)


@SETTINGS
@given(period=st.integers(0, 2**64 - 1), other_period=st.integers(0, 2**64 - 1))
def test_a_signature_verifies_only_for_its_message(period: int, other_period: int) -> None:
    c = committee()
    nonce, other_nonce = nonces(2)
    blinding = blind_bls.blind(period, nonce)
    credit = blind_bls.unblind(
        blinding, blind_bls.combine(sign(c, (1, 2, 3), blinding.blinded), 3), c.group_key
    )
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.verify_credit(c.group_key, ThresholdCredit(period, other_nonce, credit.signature))
    if other_period != period:
        with pytest.raises(blind_bls.CreditSignatureError):
            blind_bls.verify_credit(
                c.group_key, ThresholdCredit(other_period, nonce, credit.signature)
            )
    other_key = run_dkg_key_cached()
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.verify_credit(other_key, credit)


@cache
def run_dkg_key_cached() -> bls.G2:
    return run_dkg(4).group_key


@SETTINGS
@given(signers=signer_sets, period=st.integers(0, 2**64 - 1))
def test_unblinding_gives_the_plain_bls_signature_whatever_signed_it(
    signers: tuple[int, ...], period: int
) -> None:
    """σ = x · H(m) exactly: the credit's bytes are a function of (period, nonce) alone, not of
    the blinding factor or of which validators signed — it carries nothing finer than its key
    period (x reconstructed here from t shares, which only a test can do)."""
    c = committee()
    nonce = nonces(1)[0]
    chosen = signers[: c.threshold]
    lagrange = shamir.lagrange_at_zero(chosen)
    x = sum(lagrange[i] * c.shares[i] for i in chosen) % bls.ORDER
    expected = bls.g1_bytes(bls.g1_mul(blind_bls.credit_point(period, nonce), x))
    credits = set()
    for _ in range(2):  # two independent blindings
        blinding = blind_bls.blind(period, nonce)
        credit = blind_bls.unblind(
            blinding, blind_bls.combine(sign(c, chosen, blinding.blinded), c.threshold), c.group_key
        )
        assert credit.signature == expected
        credits.add(credit.to_bytes())
    (encoded,) = credits
    assert len(encoded) == blind_bls.CREDIT_BYTES == 8 + 32 + 48
    assert ThresholdCredit.from_bytes(encoded) == ThresholdCredit(period, nonce, expected)


def test_the_blinded_message_hides_the_credit() -> None:
    """The same credit blinded twice gives unrelated points; neither is H(m)."""
    nonce = nonces(1)[0]
    first, second = blind_bls.blind(1, nonce), blind_bls.blind(1, nonce)
    hashed = bls.g1_bytes(blind_bls.credit_point(1, nonce))
    assert len({first.blinded, second.blinded, hashed}) == 3


def test_batch_verification_refuses_a_batch_with_any_bad_credit() -> None:
    c = committee()
    credits = []
    for nonce in nonces(3):
        blinding = blind_bls.blind(2, nonce)
        credits.append(
            blind_bls.unblind(
                blinding, blind_bls.combine(sign(c, (2, 3, 4), blinding.blinded), 3), c.group_key
            )
        )
    blind_bls.verify_credits(c.group_key, credits)
    blind_bls.verify_credits(c.group_key, [])
    # σ_0 + δ and σ_1 - δ: each invalid, their plain sum still valid; the batch must refuse
    delta = bls.g1_mul(bls.g1_generator(), 12345)
    s0 = bls.parse_g1(credits[0].signature) + delta
    s1 = bls.parse_g1(credits[1].signature) + (-delta)
    tampered = [
        ThresholdCredit(2, credits[0].nonce, bls.g1_bytes(s0)),
        ThresholdCredit(2, credits[1].nonce, bls.g1_bytes(s1)),
        credits[2],
    ]
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.verify_credits(c.group_key, tampered)
    swapped = [ThresholdCredit(2, credits[0].nonce, credits[1].signature), *credits[1:]]
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.verify_credits(c.group_key, swapped)


def test_malformed_inputs_are_refused_by_name() -> None:
    c = committee()
    identity = bls.g1_bytes(bls.g1_identity())
    with pytest.raises(bls.IdentityError):
        blind_bls.partial_sign(c.shares[1], identity)
    with pytest.raises(bls.EncodingError):
        blind_bls.partial_sign(c.shares[1], b"\x00" * 48)
    with pytest.raises(blind_bls.ThresholdCreditError):
        blind_bls.blind(1, b"short")
    with pytest.raises(blind_bls.ThresholdCreditError):
        blind_bls.blind(-1, nonces(1)[0])
    with pytest.raises(blind_bls.ThresholdCreditError):
        ThresholdCredit.from_bytes(b"\x00" * 87)
    with pytest.raises(bls.IdentityError):
        ThresholdCredit.from_bytes(bytes(40) + identity)
    blinding = blind_bls.blind(1, nonces(1)[0])
    with pytest.raises(bls.IdentityError):
        blind_bls.verify_partial(c.public_share(1), blinding.blinded, identity)
    with pytest.raises(blind_bls.NotEnoughPartialsError):
        blind_bls.combine(
            {0: blind_bls.partial_sign(c.shares[1], blinding.blinded), 1: b"", 2: b""}, 3
        )


def test_unblind_all_verifies_the_lot_and_refuses_it_with_one_wrong_signature() -> None:
    """`unblind_all` returns the credits `unblind` gives one by one, after one batch check;
    one blind signature of another message (a bad partial combined in) spoils the lot."""
    c = committee()
    blindings = [blind_bls.blind(9, nonce) for nonce in nonces(3)]
    signed = [blind_bls.combine(sign(c, (1, 2, 3), b.blinded), c.threshold) for b in blindings]
    credits = blind_bls.unblind_all(blindings, signed, c.group_key)
    assert credits == [
        blind_bls.unblind(b, s, c.group_key) for b, s in zip(blindings, signed, strict=True)
    ]
    wrong = blind_bls.combine(sign(c, (1, 2, 3), blindings[0].blinded), c.threshold)
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.unblind_all(blindings, [signed[0], wrong, signed[2]], c.group_key)
    with pytest.raises(blind_bls.ThresholdCreditError):
        blind_bls.unblind_all(blindings, signed[:2], c.group_key)
