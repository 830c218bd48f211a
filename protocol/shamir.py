"""Shamir sharing over the BLS12-381 scalar field, Feldman commitments, Lagrange at zero.

    poly = random_polynomial(threshold, secret)   degree threshold - 1, poly[0] = secret
    share = evaluate(poly, index)                 index ≥ 1: a participant's share f(index)
    commitments = commit(poly)                    [a_k · G2]: public, binds the polynomial
    public_share(commitments, index)              Σ_k index^k · C_k = f(index) · G2
    lagrange_at_zero(indices)                     {i: λ_i} with Σ λ_i f(i) = f(0) for any
                                                  polynomial of degree < len(indices)

Indices are 1..n (0 would be the secret itself). Integers only; the randomness of
`random_polynomial` is `secrets`, drawn by the dealer, never by the chain.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from protocol import bls
from protocol.bls import G2, ORDER


class SharingError(bls.BlsError):
    """An index set or threshold that Shamir sharing cannot use."""

    code = "shamir_invalid"


def check_index(index: int) -> int:
    if not 1 <= index < ORDER:
        raise SharingError("share index", "outside [1, ORDER)")
    return index


def random_scalar() -> int:
    """A uniform non-zero scalar."""
    return 1 + secrets.randbelow(ORDER - 1)


def random_polynomial(threshold: int, secret: int | None = None) -> list[int]:
    """Coefficients a_0..a_{threshold-1}, a_0 = `secret` (random if None)."""
    if threshold < 1:
        raise SharingError("threshold", "at least 1")
    constant = random_scalar() if secret is None else secret % ORDER
    return [constant] + [secrets.randbelow(ORDER) for _ in range(threshold - 1)]


def evaluate(poly: Sequence[int], index: int) -> int:
    """f(index) mod ORDER (Horner)."""
    check_index(index)
    value = 0
    for coefficient in reversed(poly):
        value = (value * index + coefficient) % ORDER
    return value


def commit(poly: Sequence[int]) -> list[G2]:
    """Feldman commitments a_k · G2."""
    generator = bls.g2_generator()
    return [bls.g2_mul(generator, coefficient) for coefficient in poly]


def public_share(commitments: Sequence[G2], index: int) -> G2:
    """Σ_k index^k · C_k: the G2 image of the committed polynomial at `index`."""
    check_index(index)
    total = bls.g2_identity()
    power = 1
    for commitment in commitments:
        total = total + bls.g2_mul(commitment, power)
        power = power * index % ORDER
    return total


def share_matches(commitments: Sequence[G2], index: int, share: int) -> bool:
    """share · G2 == Σ_k index^k · C_k (Feldman's check)."""
    expected = public_share(commitments, index)
    return bls.g2_bytes(bls.g2_mul(bls.g2_generator(), share)) == bls.g2_bytes(expected)


def lagrange_at_zero(indices: Iterable[int]) -> dict[int, int]:
    """λ_i = Π_{j≠i} j / (j - i) mod ORDER for distinct indices ≥ 1."""
    points = list(indices)
    if not points:
        raise SharingError("index set", "empty")
    if len(set(points)) != len(points):
        raise SharingError("index set", "an index appears twice")
    for index in points:
        check_index(index)
    coefficients: dict[int, int] = {}
    for i in points:
        numerator = 1
        denominator = 1
        for j in points:
            if j != i:
                numerator = numerator * j % ORDER
                denominator = denominator * (j - i) % ORDER
        coefficients[i] = numerator * pow(denominator, -1, ORDER) % ORDER
    return coefficients
