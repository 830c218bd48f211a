"""RSA blind signatures (protocol.blindrsa): RFC 9474's vectors step by step, refusals by name,
interop with a standard RSA-PSS verifier, and blind→sign→finalize→verify as a property."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import blindrsa
from protocol.blindrsa import (
    DEFAULT_VARIANT,
    MAX_MESSAGE_BYTES,
    PSS_DETERMINISTIC,
    PSS_RANDOMIZED,
    PSSZERO_DETERMINISTIC,
    PSSZERO_RANDOMIZED,
    BlindRsaError,
    InvalidInputError,
    KeySizeError,
    MessageOutOfRangeError,
    MessageTooLongError,
    RsaPrivateKey,
    RsaPublicKey,
    SigningError,
    Variant,
    VerificationError,
    blind,
    blind_sign,
    blind_with,
    emsa_pss_encode,
    finalize,
    is_valid,
    message_of,
    prepare,
    prepare_with,
    variant_named,
    verify,
)
from protocol.errors import PlanetError, ProtocolError

pytestmark = pytest.mark.unit

VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "rfc9474.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text())["vectors"]
ALL_VARIANTS = (PSS_RANDOMIZED, PSSZERO_RANDOMIZED, PSS_DETERMINISTIC, PSSZERO_DETERMINISTIC)


def _int(value: str) -> int:
    return int(value, 16)


def _bytes(value: str) -> bytes:
    return bytes.fromhex(value)


def _vector_keys(vector: dict[str, Any]) -> tuple[RsaPublicKey, RsaPrivateKey]:
    public = RsaPublicKey(n=_int(vector["n"]), e=_int(vector["e"]))
    private = RsaPrivateKey(public, d=_int(vector["d"]), p=_int(vector["p"]), q=_int(vector["q"]))
    return public, private


@pytest.fixture(scope="module")
def key() -> RsaPrivateKey:
    return RsaPrivateKey.generate(2048)


@pytest.fixture(scope="module")
def other_key() -> RsaPrivateKey:
    return RsaPrivateKey.generate(2048)


def _credit(
    private: RsaPrivateKey, msg: bytes, variant: Variant = DEFAULT_VARIANT
) -> tuple[bytes, bytes]:
    """The whole protocol once: (prepared message, signature)."""
    prepared = prepare(msg, variant)
    blinding = blind(private.public, prepared, variant)
    blind_sig = blind_sign(private, blinding.blinded_msg)
    return prepared, finalize(private.public, prepared, blind_sig, blinding.inv, variant)


# --- RFC 9474 Appendix A, every step --------------------------------------------------------------


def test_vectors_cover_every_variant() -> None:
    assert sorted(v["name"] for v in VECTORS) == sorted(v.name for v in ALL_VARIANTS)
    assert all(_int(v["p"]) * _int(v["q"]) == _int(v["n"]) for v in VECTORS)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_blindrsa_rfc9474_vector_each_step_matches(vector: dict[str, Any]) -> None:
    variant = variant_named(vector["name"])
    public, private = _vector_keys(vector)
    assert variant.salt_len == vector["salt_len"] == len(_bytes(vector["salt"]))

    prepared = prepare_with(
        _bytes(vector["msg"]), prefix=_bytes(vector["msg_prefix"]), variant=variant
    )
    assert prepared.hex() == vector["prepared_msg"]
    assert message_of(prepared, variant).hex() == vector["msg"]

    encoded = emsa_pss_encode(prepared, public.modulus_bits - 1, _bytes(vector["salt"]))
    if "encoded_msg" in vector:
        assert encoded.hex() == vector["encoded_msg"]
    # The encoding the RFC's blinded_msg carries: blinded = encoded · r^e, r = inv^-1 mod n.
    n, e, inv = public.n, public.e, _int(vector["inv"])
    assert int.from_bytes(encoded, "big") == _int(vector["blinded_msg"]) * pow(inv, e, n) % n

    blinding = blind_with(public, prepared, salt=_bytes(vector["salt"]), inv=inv, variant=variant)
    assert blinding.blinded_msg.hex() == vector["blinded_msg"]
    assert blinding.inv == inv

    blind_sig = blind_sign(private, blinding.blinded_msg)
    assert blind_sig.hex() == vector["blind_sig"]

    sig = finalize(public, prepared, blind_sig, blinding.inv, variant)
    assert sig.hex() == vector["sig"]
    verify(public, prepared, sig, variant)
    assert is_valid(public, prepared, sig, variant)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["name"])
def test_blindrsa_rfc9474_signature_is_standard_rsa_pss(vector: dict[str, Any]) -> None:
    """The RFC's signature verifies under OpenSSL's RSASSA-PSS (SHA-384, MGF1-SHA-384)."""
    public, private = _vector_keys(vector)
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=vector["salt_len"])
    public.to_cryptography().verify(
        _bytes(vector["sig"]), _bytes(vector["prepared_msg"]), pss, hashes.SHA384()
    )
    # and the private numbers are a consistent key to OpenSSL as well
    assert private.to_cryptography().public_key().public_numbers().n == public.n


# --- the refusals, by name ------------------------------------------------------------------------


def test_blindrsa_altered_message_fails_verification(key: RsaPrivateKey) -> None:
    prepared, sig = _credit(key, b"credit: 1 chunk")
    altered = bytearray(prepared)
    altered[-1] ^= 0x01
    with pytest.raises(VerificationError):
        verify(key.public, bytes(altered), sig)
    with pytest.raises(VerificationError):
        verify(key.public, prepared + b"\x00", sig)
    # another prefix over the same message is another message
    with pytest.raises(VerificationError):
        verify(key.public, bytes(32) + message_of(prepared), sig)
    assert not is_valid(key.public, bytes(altered), sig)


def test_blindrsa_forged_signature_fails_verification(key: RsaPrivateKey) -> None:
    prepared, sig = _credit(key, b"credit")
    k = key.public.modulus_len
    flipped = bytearray(sig)
    flipped[k // 2] ^= 0x80
    forgeries = [
        bytes(flipped),
        bytes(k),
        (1).to_bytes(k, "big"),
        (key.public.n - 1).to_bytes(k, "big"),
    ]
    for forged in forgeries:
        with pytest.raises(VerificationError):
            verify(key.public, prepared, forged)


def _sign_raw(key: RsaPrivateKey, em: bytes) -> bytes:
    """The key's RSASP1 over any encoded message (blind_sign is exactly that)."""
    return blind_sign(key, em.rjust(key.public.modulus_len, b"\x00"))


def _mask(em: bytes, index: int, bits: int) -> bytes:
    out = bytearray(em)
    out[index] ^= bits
    return bytes(out)


def test_blindrsa_malformed_pss_encoding_signed_by_the_key_fails(key: RsaPrivateKey) -> None:
    """Signatures the key really made, over encodings that break one EMSA-PSS rule each."""
    prepared = prepare(b"credit")
    # a salt whose encoding stays below n with its (always clear) top bit set: n > 1.125 · 2^2047
    # for cryptography's keys, so one in eight salts or more qualifies
    for i in range(512):
        em = emsa_pss_encode(prepared, key.public.modulus_bits - 1, i.to_bytes(48, "big"))
        if int.from_bytes(_mask(em, 0, 0x80), "big") < key.public.n:
            break
    else:
        pytest.fail("no salt keeps the top-bit encoding below n")
    verify(key.public, prepared, _sign_raw(key, em))  # the well-formed one passes
    db_len = len(em) - 48 - 1
    broken = {
        "trailer": _mask(em, -1, 0x01),
        "padding": _mask(em, 5, 0x01),  # a PS byte (XOR of the mask flips DB the same way)
        "separator": _mask(em, db_len - 48 - 1, 0x03),  # 0x01 becomes 0x02
        "top bit": _mask(em, 0, 0x80),
        "hash": _mask(em, db_len + 3, 0x01),
    }
    for rule, bad in broken.items():
        sig = _sign_raw(key, bad)
        with pytest.raises(VerificationError):
            verify(key.public, prepared, sig)
        assert not is_valid(key.public, prepared, sig), rule


def test_blindrsa_encoding_not_coprime_with_n_refused(
    key: RsaPrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RFC 9474 Blind's is_coprime check (a message sharing a prime with n would leak it)."""
    k = key.public.modulus_len
    monkeypatch.setattr(blindrsa, "emsa_pss_encode", lambda *_: key.p.to_bytes(k, "big"))
    with pytest.raises(InvalidInputError):
        blind(key.public, prepare(b"credit"))


def test_blindrsa_signature_out_of_range_or_wrong_length_refused(key: RsaPrivateKey) -> None:
    prepared, sig = _credit(key, b"credit")
    k = key.public.modulus_len
    # RFC 8017 RSASSA-PSS-VERIFY 2b: a representative ≥ n is an invalid signature (the same
    # answer a signature made under another, larger modulus gets)
    for value in (key.public.n, 256**k - 1):
        with pytest.raises(VerificationError):
            verify(key.public, prepared, value.to_bytes(k, "big"))
    with pytest.raises(InvalidInputError):
        verify(key.public, prepared, sig[1:])
    with pytest.raises(InvalidInputError):
        verify(key.public, prepared, sig + b"\x00")
    with pytest.raises(InvalidInputError):
        verify(key.public, prepared, sig.hex())  # type: ignore[arg-type]


def test_blindrsa_signature_by_another_key_fails(
    key: RsaPrivateKey, other_key: RsaPrivateKey
) -> None:
    prepared, sig = _credit(other_key, b"credit")
    verify(other_key.public, prepared, sig)
    with pytest.raises(VerificationError):
        verify(key.public, prepared, sig)


def test_blindrsa_variant_mismatch_fails(key: RsaPrivateKey) -> None:
    prepared, sig = _credit(key, b"credit", PSS_RANDOMIZED)
    with pytest.raises(VerificationError):
        verify(key.public, prepared, sig, PSSZERO_RANDOMIZED)


def test_blindrsa_blinded_message_not_below_n_refused(key: RsaPrivateKey) -> None:
    n, k = key.public.n, key.public.modulus_len
    for value in (n, n + 1, 256**k - 1):
        with pytest.raises(MessageOutOfRangeError) as caught:
            blind_sign(key, value.to_bytes(k, "big"))
        assert caught.value.code == "blind_rsa_out_of_range"
    with pytest.raises(InvalidInputError):
        blind_sign(key, bytes(k - 1))
    with pytest.raises(InvalidInputError):
        blind_sign(key, bytes(k + 1))


def test_blindrsa_wrong_inverse_fails_verification(key: RsaPrivateKey) -> None:
    prepared = prepare(b"credit")
    blinding = blind(key.public, prepared)
    blind_sig = blind_sign(key, blinding.blinded_msg)
    other = blind(key.public, prepared)  # another blinding of the same message
    for wrong in (blinding.inv + 1, other.inv, 1):
        with pytest.raises(VerificationError):
            finalize(key.public, prepared, blind_sig, wrong)
    with pytest.raises(InvalidInputError):
        finalize(key.public, prepared, blind_sig, 0)
    with pytest.raises(InvalidInputError):
        finalize(key.public, prepared, blind_sig, key.public.n)
    assert finalize(key.public, prepared, blind_sig, blinding.inv)


def test_blindrsa_finalize_refuses_a_malformed_blind_signature(key: RsaPrivateKey) -> None:
    prepared = prepare(b"credit")
    blinding = blind(key.public, prepared)
    k = key.public.modulus_len
    with pytest.raises(InvalidInputError):
        finalize(key.public, prepared, bytes(k - 1), blinding.inv)
    with pytest.raises(MessageOutOfRangeError):
        finalize(key.public, prepared, key.public.n.to_bytes(k, "big"), blinding.inv)


def test_blindrsa_signer_fault_is_caught_before_answering(key: RsaPrivateKey) -> None:
    corrupt = RsaPrivateKey(key.public, d=key.d + 2, p=key.p, q=key.q)
    blinding = blind(key.public, prepare(b"credit"))
    with pytest.raises(SigningError) as caught:
        blind_sign(corrupt, blinding.blinded_msg)
    assert caught.value.http_status == 500


def test_blindrsa_key_size_bounds(key: RsaPrivateKey) -> None:
    small = (1 << 1023) + 1
    with pytest.raises(KeySizeError) as caught:
        RsaPublicKey(n=small, e=65537)
    assert caught.value.bits == 1024
    with pytest.raises(KeySizeError):
        RsaPublicKey(n=(1 << 4096) + 1, e=65537)
    with pytest.raises(KeySizeError):
        RsaPrivateKey.generate(1024)
    for e in (1, 2, 65536, 2**32 + 1):
        with pytest.raises(InvalidInputError):
            RsaPublicKey(n=key.public.n, e=e)
    with pytest.raises(InvalidInputError):
        RsaPublicKey(n=key.public.n + 1, e=65537)  # even modulus
    with pytest.raises(InvalidInputError):
        RsaPrivateKey(key.public, d=key.d, p=key.p, q=key.q + 2)


def test_blindrsa_message_too_long_refused(key: RsaPrivateKey) -> None:
    longest = bytes(MAX_MESSAGE_BYTES - 32)
    prepare(longest)
    with pytest.raises(MessageTooLongError) as caught:
        prepare(longest + b"\x00")
    assert caught.value.length == MAX_MESSAGE_BYTES + 1
    with pytest.raises(MessageTooLongError):
        blind(key.public, bytes(MAX_MESSAGE_BYTES + 1))
    with pytest.raises(MessageTooLongError):
        verify(key.public, bytes(MAX_MESSAGE_BYTES + 1), bytes(key.public.modulus_len))


def test_blindrsa_explicit_randomness_checked(key: RsaPrivateKey) -> None:
    prepared = prepare(b"credit")
    with pytest.raises(InvalidInputError):
        prepare_with(b"credit", prefix=bytes(31))
    with pytest.raises(InvalidInputError):
        prepare_with(b"credit", prefix=bytes(32), variant=PSS_DETERMINISTIC)
    with pytest.raises(InvalidInputError):
        blind_with(key.public, prepared, salt=bytes(47), inv=3)
    with pytest.raises(InvalidInputError):
        blind_with(key.public, prepared, salt=bytes(48), inv=0)
    with pytest.raises(InvalidInputError):
        blind_with(key.public, prepared, salt=bytes(48), inv=key.p)  # shares a prime with n
    with pytest.raises(InvalidInputError):
        message_of(bytes(31))
    with pytest.raises(InvalidInputError):
        variant_named("RSABSSA-SHA256-PSS-Randomized")


def test_blindrsa_errors_are_protocol_errors_with_codes() -> None:
    for cls in (
        MessageTooLongError,
        InvalidInputError,
        MessageOutOfRangeError,
        KeySizeError,
        SigningError,
        VerificationError,
    ):
        assert issubclass(cls, BlindRsaError)
        assert issubclass(cls, ProtocolError)
        assert issubclass(cls, PlanetError)
    codes = {
        cls.code
        for cls in (
            BlindRsaError,
            MessageTooLongError,
            InvalidInputError,
            MessageOutOfRangeError,
            KeySizeError,
            SigningError,
            VerificationError,
        )
    }
    assert len(codes) == 7
    assert VerificationError().to_json()["code"] == "blind_rsa_invalid_signature"


# --- keys on the wire, secrets kept out of reprs --------------------------------------------------


def test_blindrsa_public_key_der_round_trip(key: RsaPrivateKey) -> None:
    der = key.public.to_der()
    assert RsaPublicKey.from_der(der) == key.public
    with pytest.raises(InvalidInputError):
        RsaPublicKey.from_der(der[:-1])
    with pytest.raises(InvalidInputError):
        RsaPublicKey.from_der(b"\x00" * 2000)
    ec_der = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(InvalidInputError):
        RsaPublicKey.from_der(ec_der)


def test_blindrsa_secrets_stay_out_of_repr(key: RsaPrivateKey) -> None:
    blinding = blind(key.public, prepare(b"credit"))
    assert str(key.d) not in repr(key) and str(key.p) not in repr(key)
    assert str(blinding.inv) not in repr(blinding)


# --- properties -----------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(
    derandomize=True,
    database=None,
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY_SETTINGS
@given(msg=st.binary(max_size=256), variant=st.sampled_from(ALL_VARIANTS))
def test_blindrsa_round_trip_verifies(key: RsaPrivateKey, msg: bytes, variant: Variant) -> None:
    prepared, sig = _credit(key, msg, variant)
    verify(key.public, prepared, sig, variant)
    assert message_of(prepared, variant) == msg
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=variant.salt_len)
    key.public.to_cryptography().verify(sig, prepared, pss, hashes.SHA384())


@PROPERTY_SETTINGS
@given(msg=st.binary(max_size=64))
def test_blindrsa_blinded_messages_unlinkable(key: RsaPrivateKey, msg: bytes) -> None:
    """Two blindings of one prepared message look unrelated, and neither is the signature's
    message representative: what the signer saw does not identify what gets spent."""
    prepared = prepare(msg, PSSZERO_DETERMINISTIC)  # even with no prefix and no salt
    first = blind(key.public, prepared, PSSZERO_DETERMINISTIC)
    second = blind(key.public, prepared, PSSZERO_DETERMINISTIC)
    assert first.blinded_msg != second.blinded_msg
    sig_1 = finalize(
        key.public, prepared, blind_sign(key, first.blinded_msg), first.inv, PSSZERO_DETERMINISTIC
    )
    sig_2 = finalize(
        key.public, prepared, blind_sign(key, second.blinded_msg), second.inv, PSSZERO_DETERMINISTIC
    )
    assert sig_1 == sig_2  # the deterministic variant: one signature per message
    encoded = emsa_pss_encode(prepared, key.public.modulus_bits - 1, b"")
    assert {first.blinded_msg, second.blinded_msg}.isdisjoint({sig_1, encoded})


def test_blindrsa_randomized_credits_of_one_message_differ(key: RsaPrivateKey) -> None:
    (prepared_1, sig_1), (prepared_2, sig_2) = _credit(key, b"same"), _credit(key, b"same")
    assert prepared_1 != prepared_2 and sig_1 != sig_2
    assert message_of(prepared_1) == message_of(prepared_2) == b"same"
