"""Threshold blind BLS credits (Boldyreva 2003) under ONE committee key.

The committee holds a key x, Shamir-shared among its validators (validator i holds x_i = f(i),
its public share X_i = x_i · G2 is public, the committee key is X = x · G2 = f(0) · G2; see
`protocol.dkg`). A credit is a BLS signature σ = x · H(m) on a message the signers never see:

    client                                                    validator i (any t of n)
    m = credit_message(period, nonce)       nonce: 32 random bytes, period: the key period
    r ← random non-zero scalar
    B = r · H(m)                            H: RFC 9380 hash_to_curve into G1, tag CREDIT_DST
                  B  ────────────────────────────────────────►
                                                              s_i = x_i · B   (partial_sign)
                     ◄────────────────────────────────────────  anyone checks
                                                              e(s_i, G2) = e(B, X_i)
    S = Σ λ_i s_i over t partials           Lagrange at 0: S = x · B     (combine)
    σ = r⁻¹ · S = x · H(m)                  (unblind, then verify:)
    e(σ, G2) = e(H(m), X)                   anyone, any time, with only X (verify_credit)

Every validator signs the SAME B, so what a mint buys is a fact about its list of blinded
messages: a mint of N blinded messages yields N signatures and no more (one-more
unforgeability of blind BLS under the one-more co-CDH assumption), whichever t validators
answer for which message. B = r · H(m) with r uniform is a uniform element of G1, independent of
m, and σ is deterministic given (X, m): the credit's bytes depend on its period and nonce only,
not on the validators that signed, the blinding factor or when it was minted. A credit carries
its key period (`ThresholdCredit.period`) and nothing finer.

Encoding (`ThresholdCredit.to_bytes`, 88 bytes): period (8 bytes, big-endian) ‖ nonce (32) ‖
σ (48, compressed G1). Every parser is strict (`protocol.bls`); a blinded message, partial or
signature that is the identity is refused.

Errors (all `ProtocolError`):

    protocol.bls.BlsError           a point or scalar that does not parse (its own tree)
    ThresholdCreditError            root of this module's refusals; `.reason` says why
    ├── PartialInvalidError         a partial signature (or a validator's set of them for a
    │                               mint, `verify_partials`) that does not verify under X_i
    ├── NotEnoughPartialsError      fewer than t partials, or an index outside the committee
    └── CreditSignatureError        a credit (or a batch) that does not verify under X
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from protocol import bls, shamir
from protocol.bls import G1, G2, ORDER
from protocol.errors import ProtocolError

CREDIT_DST: Final = b"PLANET-CREDIT-V1_BLS12381G1_XMD:SHA-256_SSWU_RO_"
CREDIT_DOMAIN: Final = b"planet-credit/v2\n"
NONCE_BYTES: Final = 32
PERIOD_BYTES: Final = 8
CREDIT_BYTES: Final = PERIOD_BYTES + NONCE_BYTES + bls.G1_BYTES
_BATCH_DOMAIN: Final = b"planet-credit-batch/v1\n"
_BATCH_COEFFICIENT_BYTES: Final = 16  # 128-bit random-linear-combination coefficients
_PARTIALS_DOMAIN: Final = b"planet-mint-partials/v1\n"


class ThresholdCreditError(ProtocolError):
    code = "threshold_credit_invalid"

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid threshold credit: {reason}")
        self.reason = reason


class PartialInvalidError(ThresholdCreditError):
    code = "partial_signature_invalid"


class NotEnoughPartialsError(ThresholdCreditError):
    code = "not_enough_partials"


class CreditSignatureError(ThresholdCreditError):
    code = "credit_signature_invalid"


def _check_period(period: int) -> int:
    if isinstance(period, bool) or not isinstance(period, int) or not 0 <= period < 2**64:
        raise ThresholdCreditError("a key period is an integer in [0, 2^64)")
    return period


def _check_nonce(nonce: bytes) -> bytes:
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ThresholdCreditError(f"a credit nonce is {NONCE_BYTES} bytes")
    return nonce


def credit_message(period: int, nonce: bytes) -> bytes:
    """The signed message: CREDIT_DOMAIN ‖ period (8 bytes) ‖ nonce (32 bytes)."""
    return CREDIT_DOMAIN + _check_period(period).to_bytes(PERIOD_BYTES, "big") + _check_nonce(nonce)


def credit_point(period: int, nonce: bytes) -> G1:
    """H(m): the credit message hashed to G1 (RFC 9380, tag CREDIT_DST)."""
    return bls.hash_to_g1(credit_message(period, nonce), CREDIT_DST)


@dataclass(frozen=True)
class ThresholdCredit:
    """A spendable credit: its key period, its nonce, the committee's signature σ."""

    period: int
    nonce: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        return (
            _check_period(self.period).to_bytes(PERIOD_BYTES, "big")
            + _check_nonce(self.nonce)
            + self.signature
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ThresholdCredit:
        if not isinstance(data, bytes) or len(data) != CREDIT_BYTES:
            raise ThresholdCreditError(f"a credit is {CREDIT_BYTES} bytes")
        signature = data[PERIOD_BYTES + NONCE_BYTES :]
        bls.parse_g1(signature, "credit signature")
        return cls(
            int.from_bytes(data[:PERIOD_BYTES], "big"),
            data[PERIOD_BYTES : PERIOD_BYTES + NONCE_BYTES],
            signature,
        )


@dataclass(frozen=True)
class Blinding:
    """The client's secret state for one credit: keep `factor` until the credit is unblinded."""

    period: int
    nonce: bytes
    factor: int
    blinded: bytes  # B = factor · H(m), 48 bytes: what the mint lists and validators sign


def blind(period: int, nonce: bytes, factor: int | None = None) -> Blinding:
    """B = r · H(period, nonce) with r uniform non-zero (or the given r, for tests)."""
    r = shamir.random_scalar() if factor is None else factor
    if not 0 < r < ORDER:
        raise ThresholdCreditError("a blinding factor is in [1, ORDER)")
    blinded = bls.g1_mul(credit_point(period, nonce), r)
    return Blinding(period, nonce, r, bls.g1_bytes(blinded))


def partial_sign(share: int, blinded: bytes) -> bytes:
    """s_i = x_i · B, after parsing B strictly (a validator signs only real points)."""
    if not 0 < share < ORDER:
        raise ThresholdCreditError("a key share is in [1, ORDER)")
    point = bls.parse_g1(blinded, "blinded message")
    return bls.g1_bytes(bls.g1_mul(point, share))


def verify_partial(public_share: G2, blinded: bytes, partial: bytes) -> None:
    """e(s_i, G2) = e(B, X_i), or PartialInvalidError (BlsError for a malformed point)."""
    b_point = bls.parse_g1(blinded, "blinded message")
    s_point = bls.parse_g1(partial, "partial signature")
    if not bls.pairing_equal(s_point, bls.g2_generator(), b_point, public_share):
        raise PartialInvalidError("the partial signature does not verify under its key share")


def combine(partials: Mapping[int, bytes], threshold: int) -> bytes:
    """S = Σ λ_i s_i over the `threshold` lowest indices given (verify them first: a bad one
    spoils S). Fewer than `threshold` distinct indices: NotEnoughPartialsError."""
    if threshold < 1:
        raise NotEnoughPartialsError("the threshold is at least 1")
    if len(partials) < threshold:
        raise NotEnoughPartialsError(f"{len(partials)} partial signatures, {threshold} needed")
    chosen = sorted(partials)[:threshold]
    try:
        coefficients = shamir.lagrange_at_zero(chosen)
    except shamir.SharingError as exc:
        raise NotEnoughPartialsError(f"bad signer index: {exc.reason}") from None
    total = bls.g1_identity()
    for index in chosen:
        point = bls.parse_g1(partials[index], "partial signature")
        total = total + bls.g1_mul(point, coefficients[index])
    return bls.g1_bytes(total)


def unblind(blinding: Blinding, blind_signature: bytes, group_key: G2) -> ThresholdCredit:
    """σ = r⁻¹ · S, verified under the committee key before it is returned."""
    point = bls.parse_g1(blind_signature, "blind signature")
    signature = bls.g1_bytes(bls.g1_mul(point, pow(blinding.factor, -1, ORDER)))
    credit = ThresholdCredit(blinding.period, blinding.nonce, signature)
    verify_credit(group_key, credit)
    return credit


def unblind_all(
    blindings: Sequence[Blinding], blind_signatures: Sequence[bytes], group_key: G2
) -> list[ThresholdCredit]:
    """σ_j = r_j⁻¹ · S_j for each credit, verified together under the committee key
    (`verify_credits`: one pairing check for the lot, not one per credit) before they are
    returned; CreditSignatureError when any does not verify (`unblind` each to find which)."""
    if len(blindings) != len(blind_signatures):
        raise ThresholdCreditError("one blind signature per blinding")
    credits = []
    for blinding, blind_signature in zip(blindings, blind_signatures, strict=True):
        point = bls.parse_g1(blind_signature, "blind signature")
        signature = bls.g1_bytes(bls.g1_mul(point, pow(blinding.factor, -1, ORDER)))
        credits.append(ThresholdCredit(blinding.period, blinding.nonce, signature))
    verify_credits(group_key, credits)
    return credits


def verify_credit(group_key: G2, credit: ThresholdCredit) -> None:
    """e(σ, G2) = e(H(m), X), or CreditSignatureError."""
    sigma = bls.parse_g1(credit.signature, "credit signature")
    hashed = credit_point(credit.period, credit.nonce)
    if not bls.pairing_equal(sigma, bls.g2_generator(), hashed, group_key):
        raise CreditSignatureError("the signature does not verify under the committee key")


def _coefficients(seed: bytes, count: int) -> list[int]:
    """`count` batch coefficients ρ_i = 1 + the first _BATCH_COEFFICIENT_BYTES of
    SHA-256(seed ‖ i): nonzero, and unpredictable before every input is fixed in `seed`."""
    return [
        1
        + int.from_bytes(
            hashlib.sha256(seed + index.to_bytes(8, "big")).digest()[:_BATCH_COEFFICIENT_BYTES],
            "big",
        )
        for index in range(count)
    ]


def _batch_coefficients(group_key: G2, credits: Sequence[ThresholdCredit]) -> list[int]:
    transcript = hashlib.sha256(_BATCH_DOMAIN + bls.g2_bytes(group_key))
    for credit in credits:
        transcript.update(credit.to_bytes())
    return _coefficients(transcript.digest(), len(credits))


def verify_credits(group_key: G2, credits: Sequence[ThresholdCredit]) -> None:
    """All credits at once: e(Σ ρ_i σ_i, G2) = e(Σ ρ_i H(m_i), X), ρ_i 128-bit coefficients
    hashed from the key and every credit (deterministic: every validator derives the same).
    A batch with any invalid credit fails except with probability ~2^-128; CreditSignatureError
    does not say which (check them one by one to find it)."""
    if not credits:
        return
    coefficients = _batch_coefficients(group_key, credits)
    sigma_sum = bls.g1_identity()
    hash_sum = bls.g1_identity()
    for credit, rho in zip(credits, coefficients, strict=True):
        sigma = bls.parse_g1(credit.signature, "credit signature")
        sigma_sum = sigma_sum + bls.g1_mul(sigma, rho)
        hash_sum = hash_sum + bls.g1_mul(credit_point(credit.period, credit.nonce), rho)
    if not bls.pairing_equal(sigma_sum, bls.g2_generator(), hash_sum, group_key):
        raise CreditSignatureError("a credit of the batch does not verify under the committee key")


def _partials_coefficients(
    context: bytes, public_share: G2, blinded: Sequence[bytes], partials: Sequence[bytes]
) -> list[int]:
    transcript = hashlib.sha256(
        _PARTIALS_DOMAIN + len(context).to_bytes(4, "big") + context + bls.g2_bytes(public_share)
    )
    for point in (*blinded, *partials):
        transcript.update(point)
    return _coefficients(transcript.digest(), len(blinded))


def verify_partials(
    public_share: G2, blinded: Sequence[bytes], partials: Sequence[bytes], context: bytes
) -> None:
    """One validator's partials s_j = x_i · B_j for every blinded point of a mint, at once:
    e(Σ ρ_j s_j, G2) = e(Σ ρ_j B_j, X_i) with 128-bit ρ_j hashed from `context` (the mint id
    and the posting tx's signer: the chain's challenge), X_i and every point — two pairings
    for the lot, deterministic (every validator derives the same ρ). A set with any wrong
    partial fails except with probability ~2^-128: PartialInvalidError (BlsError for a point
    that does not parse; ThresholdCreditError when the counts differ)."""
    if len(blinded) != len(partials) or not blinded:
        raise ThresholdCreditError(f"{len(partials)} partials for {len(blinded)} blinded points")
    coefficients = _partials_coefficients(context, public_share, blinded, partials)
    partial_sum = bls.g1_identity()
    blinded_sum = bls.g1_identity()
    for index, (b_raw, s_raw, rho) in enumerate(zip(blinded, partials, coefficients, strict=True)):
        b_point = bls.parse_g1(b_raw, f"blinded message {index}")
        s_point = bls.parse_g1(s_raw, f"partial signature {index}")
        partial_sum = partial_sum + bls.g1_mul(s_point, rho)
        blinded_sum = blinded_sum + bls.g1_mul(b_point, rho)
    if not bls.pairing_equal(partial_sum, bls.g2_generator(), blinded_sum, public_share):
        raise PartialInvalidError("the partial signatures do not verify under the key share")
