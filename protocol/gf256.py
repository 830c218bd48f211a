"""Arithmetic in GF(2^8) and Shamir sharing of byte strings over it.

The field is GF(2)[x] / (x^8 + x^4 + x^3 + x + 1), the one AES uses (0x11B), with generator 3.
A byte string is shared byte-wise: every byte position has its own random polynomial of degree
k - 1 whose constant term is the secret's byte, and share i holds the polynomial's values at the
point x = i (1..255). Any k shares give the secret back by Lagrange interpolation at x = 0; any
k - 1 are uniformly distributed whatever the secret was.

Multiplying a whole byte string by one constant is `bytes.translate` with that constant's row of
the multiplication table, and adding is XOR of big integers, so a 32-byte key is split or joined
in microseconds without a per-byte Python loop.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Final

POLYNOMIAL: Final = 0x11B
GENERATOR: Final = 3
MAX_SHARES: Final = 255


def _tables() -> tuple[list[int], list[int]]:
    exp = [0] * 512
    log = [0] * 256
    value = 1
    for power in range(255):
        exp[power] = value
        log[value] = power
        # value × 3 = value × 2 + value, reduced by the AES polynomial
        doubled = value << 1
        if doubled & 0x100:
            doubled ^= POLYNOMIAL
        value = doubled ^ value
    for power in range(255, 512):
        exp[power] = exp[power - 255]
    return exp, log


_EXP, _LOG = _tables()


def mul(a: int, b: int) -> int:
    """a · b in GF(2^8)."""
    if a == 0 or b == 0:
        return 0
    return _EXP[_LOG[a] + _LOG[b]]


def inverse(a: int) -> int:
    """a⁻¹ in GF(2^8); a must not be 0."""
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^8)")
    return _EXP[255 - _LOG[a]]


# _ROWS[c] maps every byte b to c · b: one `bytes.translate` multiplies a whole string by c.
_ROWS: Final = [bytes(mul(c, b) for b in range(256)) for c in range(256)]


def scale(data: bytes, factor: int) -> bytes:
    """Every byte of `data` times `factor`."""
    return data.translate(_ROWS[factor])


def _xor(a: bytes, b: bytes) -> bytes:
    size = len(a)
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(size, "big")


def split(secret: bytes, shares: int, threshold: int) -> list[bytes]:
    """`shares` shares of `secret` (share i is the value at x = i + 1), any `threshold` of which
    recover it."""
    if not 1 <= threshold <= shares <= MAX_SHARES:
        raise ValueError(f"need 1 ≤ threshold ≤ shares ≤ {MAX_SHARES}")
    coefficients = [secrets.token_bytes(len(secret)) for _ in range(threshold - 1)]
    out = []
    for x in range(1, shares + 1):
        # Horner: ((a_{k-1} x + a_{k-2}) x + …) x + secret
        value = bytes(len(secret))
        for coefficient in reversed(coefficients):
            value = _xor(scale(value, x), coefficient)
        out.append(_xor(scale(value, x), secret))
    return out


def lagrange_at_zero(points: Sequence[int]) -> list[int]:
    """λ_j with Σ λ_j f(x_j) = f(0) for every polynomial of degree < len(points)."""
    if len(set(points)) != len(points) or not all(1 <= x <= MAX_SHARES for x in points):
        raise ValueError("points must be distinct and in 1..255")
    out = []
    for j, xj in enumerate(points):
        numerator, denominator = 1, 1
        for m, xm in enumerate(points):
            if m != j:
                numerator = mul(numerator, xm)  # (0 - x_m) = x_m in characteristic 2
                denominator = mul(denominator, xj ^ xm)
        out.append(mul(numerator, inverse(denominator)))
    return out


def join(shares: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret from (x, share) pairs; exactly the polynomial's degree + 1 of them are needed
    (more are fine if they are consistent, fewer give an unrelated string)."""
    if not shares:
        raise ValueError("no shares")
    size = len(shares[0][1])
    if any(len(share) != size for _, share in shares):
        raise ValueError("shares of different lengths")
    weights = lagrange_at_zero([x for x, _ in shares])
    value = bytes(size)
    for weight, (_, share) in zip(weights, shares, strict=True):
        value = _xor(value, scale(share, weight))
    return value
