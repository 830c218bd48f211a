"""protocol.dkg: joint-Feldman DKG with complaints, and resharing under the same key.

Each run ends with a credit signed by t of the resulting shares and verified under the key.
"""

from __future__ import annotations

import secrets

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.public import PrivateKey

from protocol import blind_bls, bls, dkg, dkg_wire
from tests.threshold_committee import Committee, reshare, run_dkg

pytestmark = pytest.mark.unit


def mint_one(c: Committee, signers: tuple[int, ...]) -> blind_bls.ThresholdCredit:
    blinding = blind_bls.blind(3, secrets.token_bytes(32))
    partials = {}
    for i in signers:
        partials[i] = blind_bls.partial_sign(c.shares[i], blinding.blinded)
        blind_bls.verify_partial(c.public_share(i), blinding.blinded, partials[i])
    return blind_bls.unblind(blinding, blind_bls.combine(partials, c.threshold), c.group_key)


def test_threshold_is_more_than_two_thirds() -> None:
    assert [dkg.threshold_for(n) for n in (1, 2, 3, 4, 7, 16, 100)] == [1, 2, 3, 3, 5, 11, 67]
    for n in range(1, 200):
        t = dkg.threshold_for(n)
        assert 3 * t > 2 * n and 3 * (t - 1) <= 2 * n


@pytest.mark.parametrize("size", [4, 16])
def test_honest_dkg_forms_one_key_that_any_t_can_sign_for(size: int) -> None:
    c = run_dkg(size)
    assert c.result.qualified == tuple(range(1, size + 1))
    assert c.threshold == dkg.threshold_for(size)
    assert len(c.result.commitments) == c.threshold
    for j, share in c.shares.items():
        assert bls.g2_bytes(bls.g2_mul(bls.g2_generator(), share)) == c.result.public_shares[j]
    first = mint_one(c, tuple(range(1, c.threshold + 1)))
    last = mint_one(c, tuple(range(size - c.threshold + 1, size + 1)))
    blind_bls.verify_credits(c.group_key, [first, last])


@pytest.mark.parametrize("answer", ["none", "wrong"])
def test_a_dealer_of_a_bad_share_is_excluded_and_the_key_still_forms(answer: str) -> None:
    c = run_dkg(4, bad_shares={2: {3}}, answer=answer)  # type: ignore[arg-type]
    assert c.state.complaints == {2: {3}}
    assert c.result.qualified == (1, 3, 4)
    assert 2 in c.state.excluded
    # the key is the sum of the qualified dealers' constants only
    total = bls.g2_sum([c.state.deals[d][0] for d in (1, 3, 4)])
    assert c.result.group_key == bls.g2_bytes(total)
    credit = mint_one(c, (1, 2, 3))  # receiver 2's share (dealer 2 excluded) still signs
    blind_bls.verify_credit(c.group_key, credit)


def test_a_dealer_that_answers_a_complaint_with_the_right_share_stays() -> None:
    c = run_dkg(4, bad_shares={2: {3}}, answer="right")
    assert c.result.qualified == (1, 2, 3, 4)
    assert (2, 3) in c.result.revealed
    blind_bls.verify_credit(c.group_key, mint_one(c, (2, 3, 4)))


def test_a_dealer_with_t_complaints_is_excluded_without_an_answer() -> None:
    c = run_dkg(4, bad_shares={1: {2, 3, 4}}, answer="right")
    assert c.result.qualified == (2, 3, 4)
    assert c.state.answered == {}


def test_one_participant_offline() -> None:
    c = run_dkg(4, offline={4})
    assert c.result.qualified == (1, 2, 3)
    assert set(c.shares) == {1, 2, 3}
    blind_bls.verify_credit(c.group_key, mint_one(c, (1, 2, 3)))


def test_too_few_qualified_dealers_fail_the_run() -> None:
    with pytest.raises(dkg.DkgFailedError):
        run_dkg(4, offline={3, 4})


def test_resharing_to_a_new_set_keeps_the_key_and_old_credits() -> None:
    old = run_dkg(4)
    credit = mint_one(old, (1, 2, 3))
    # validator 4 leaves (does not deal), the new committee has 5 members
    new = reshare(old, new_size=5, dealers=(1, 2, 3))
    assert new.result.group_key == old.result.group_key
    assert new.threshold == 4
    blind_bls.verify_credit(new.group_key, credit)
    fresh = mint_one(new, (2, 3, 4, 5))
    blind_bls.verify_credits(old.group_key, [credit, fresh])
    # and down to 4 again, dealt by the new set, one dealer cheating and excluded
    again = reshare(new, new_size=4, dealers=(1, 2, 3, 4, 5), bad_shares={5: {1}})
    assert 5 not in again.result.qualified
    assert again.result.group_key == old.result.group_key
    blind_bls.verify_credit(again.group_key, mint_one(again, (1, 3, 4)))
    # old shares no longer combine with new ones (different polynomials)
    blinding = blind_bls.blind(3, secrets.token_bytes(32))
    mixed = {
        1: blind_bls.partial_sign(old.shares[1], blinding.blinded),
        2: blind_bls.partial_sign(again.shares[2], blinding.blinded),
        3: blind_bls.partial_sign(again.shares[3], blinding.blinded),
    }
    with pytest.raises(blind_bls.CreditSignatureError):
        blind_bls.unblind(blinding, blind_bls.combine(mixed, 3), old.group_key)


def _fresh_config(size: int = 4) -> tuple[dkg.DkgConfig, list[PrivateKey]]:
    keys = [PrivateKey.generate() for _ in range(size)]
    receivers = tuple(dkg.Receiver(i + 1, bytes(k.public_key)) for i, k in enumerate(keys))
    config = dkg.DkgConfig(
        secrets.token_bytes(32), tuple(range(1, size + 1)), receivers, dkg.threshold_for(size)
    )
    return config, keys


def test_a_reshare_must_deal_the_dealers_old_share() -> None:
    old = run_dkg(4)
    keys = [PrivateKey.generate() for _ in range(4)]
    config = dkg.DkgConfig(
        secrets.token_bytes(32),
        (1, 2, 3, 4),
        tuple(dkg.Receiver(i + 1, bytes(k.public_key)) for i, k in enumerate(keys)),
        3,
        dkg.PreviousKey(old.threshold, old.result.commitments),
    )
    state = dkg.DkgState(config)
    forged, _ = dkg.deal(config, 1, old_share=old.shares[1] + 1)
    with pytest.raises(dkg.DkgMessageError):
        state.submit_deal(forged)
    honest, _ = dkg.deal(config, 1, old_share=old.shares[1])
    state.submit_deal(honest)


def test_the_state_machine_refuses_messages_out_of_turn_or_malformed() -> None:
    config, _keys = _fresh_config()
    state = dkg.DkgState(config)
    good, secret = dkg.deal(config, 1)
    for bad in (
        dkg.Deal(5, good.commitments, good.ciphertexts),
        dkg.Deal(1, good.commitments[:2], good.ciphertexts),
        dkg.Deal(1, good.commitments, good.ciphertexts[:3]),
        dkg.Deal(1, good.commitments, (b"x" * 5, *good.ciphertexts[1:])),
        dkg.Deal(1, (bls.g2_bytes(bls.g2_identity()), *good.commitments[1:]), good.ciphertexts),
        dkg.Deal(1, (b"\x00" * 96, *good.commitments[1:]), good.ciphertexts),
    ):
        with pytest.raises((dkg.DkgMessageError, bls.BlsError)):
            state.submit_deal(bad)
    state.submit_deal(good)
    with pytest.raises(dkg.DkgMessageError):
        state.submit_deal(good)
    with pytest.raises(dkg.DkgPhaseError):
        state.submit_complaint(dkg.Complaint(2, 1))
    state.close_deals()
    with pytest.raises(dkg.DkgPhaseError):
        state.submit_deal(dkg.deal(config, 2)[0])
    with pytest.raises(dkg.DkgMessageError):
        state.submit_complaint(dkg.Complaint(2, 3))  # dealer 3 did not deal
    with pytest.raises(dkg.DkgMessageError):
        state.submit_complaint(dkg.Complaint(9, 1))
    state.submit_complaint(dkg.Complaint(2, 1))
    with pytest.raises(dkg.DkgMessageError):
        state.submit_complaint(dkg.Complaint(2, 1))
    state.close_complaints()
    with pytest.raises(dkg.DkgMessageError):
        state.submit_justification(dkg.justify(secret, dkg.Complaint(3, 1)))  # nobody complained
    with pytest.raises(bls.ScalarError):
        state.submit_justification(dkg.Justification(1, 2, bls.ORDER.to_bytes(32, "big")))
    state.submit_justification(dkg.justify(secret, dkg.Complaint(2, 1)))
    state.close_justifications()
    with pytest.raises(dkg.DkgFailedError):  # one qualified dealer of 3 needed
        state.finish()


def test_a_share_sealed_for_another_session_or_receiver_is_complained_about() -> None:
    config, keys = _fresh_config()
    deal, _ = dkg.deal(config, 1)
    assert dkg.open_share(config, 2, keys[1], deal) is not None
    # receiver 2's ciphertext moved to receiver 3's slot: 3 cannot open it
    moved = dkg.Deal(
        1,
        deal.commitments,
        (deal.ciphertexts[0], deal.ciphertexts[1], deal.ciphertexts[1], deal.ciphertexts[3]),
    )
    assert dkg.open_share(config, 3, keys[2], moved) is None
    # the same deal replayed in another session is refused by every receiver
    other = dkg.DkgConfig(
        secrets.token_bytes(32), config.dealers, config.receivers, config.threshold
    )
    assert dkg.open_share(other, 2, keys[1], deal) is None


def test_configs_state_their_threshold() -> None:
    config, _ = _fresh_config()
    with pytest.raises(dkg.DkgMessageError):
        dkg.DkgConfig(config.session, config.dealers, config.receivers, 2)
    with pytest.raises(dkg.DkgMessageError):
        dkg.DkgConfig(b"short", config.dealers, config.receivers, 3)
    with pytest.raises(dkg.DkgMessageError):
        dkg.DkgConfig(config.session, (1, 2), config.receivers, 3)


def test_messages_have_one_canonical_encoding() -> None:
    config, keys = _fresh_config()
    deal, secret = dkg.deal(config, 2)
    encoded = dkg_wire.encode_deal(deal)
    assert len(encoded) == 6 + 3 * 96 + 4 * dkg.CIPHERTEXT_BYTES
    assert dkg_wire.decode_deal(encoded) == deal
    for bad in (encoded[:-1], encoded + b"\x00", encoded[:100], b"", b"\x00" * 5):
        with pytest.raises(dkg.DkgMessageError):
            dkg_wire.decode_deal(bad)
    decoded = dkg_wire.decode_deal(encoded)
    assert dkg.open_share(config, 3, keys[2], decoded) is not None
    complaint = dkg.Complaint(3, 2)
    assert dkg_wire.decode_complaint(dkg_wire.encode_complaint(complaint)) == complaint
    answer = dkg.justify(secret, complaint)
    assert dkg_wire.decode_justification(dkg_wire.encode_justification(answer)) == answer
    with pytest.raises(dkg.DkgMessageError):
        dkg_wire.decode_complaint(b"\x00" * 5)
    with pytest.raises(dkg.DkgMessageError):
        dkg_wire.decode_justification(dkg_wire.encode_justification(answer)[:-1])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.sampled_from([4, 7]),
    data=st.data(),
)
def test_the_key_forms_with_any_tolerable_set_of_faulty_participants(
    size: int, data: st.DataObject
) -> None:
    """Up to n - t participants misbehave (offline, or dealing bad shares and answering with
    nothing, a wrong or the right share): the key forms from the rest, each dealer of a bad
    share is excluded unless it answered rightly, and any t online shares sign."""
    t = dkg.threshold_for(size)
    everyone = list(range(1, size + 1))
    faulty = data.draw(st.sets(st.sampled_from(everyone), max_size=size - t))
    offline = data.draw(
        st.sets(st.sampled_from(sorted(faulty)), max_size=len(faulty)) if faulty else st.just(set())
    )
    honest_targets = [j for j in everyone if j not in offline]
    cheats = sorted(faulty - offline)
    bad = {
        d: data.draw(st.sets(st.sampled_from(honest_targets), min_size=1, max_size=2))
        for d in cheats
    }
    answer = data.draw(st.sampled_from(["none", "wrong", "right"]))
    c = run_dkg(size, bad_shares=bad, answer=answer, offline=offline)
    excluded = set(offline) | (set(cheats) if answer != "right" else set())
    assert set(c.result.qualified) == set(everyone) - excluded
    signers = tuple(sorted(c.shares)[-t:])
    blind_bls.verify_credit(c.group_key, mint_one(c, signers))
