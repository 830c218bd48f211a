"""BLS12-381 for Planet: strict encodings over `pyblst` (Python bindings of supranational blst).

Planet's own code only frames the curve; every group operation, the pairing and hash-to-curve
are blst's. Types:

    G1 (48-byte compressed points)    credit signatures, blinded messages, partial signatures
    G2 (96-byte compressed points)    the committee key, public key shares, DKG commitments
    scalars                           Python ints in [0, ORDER), 32 bytes big-endian on the wire

Every parser is strict: the exact length, the canonical compressed encoding (decoding and
re-encoding gives the same bytes, so one point has one encoding), on the curve, in the
prime-order subgroup (blst checks it while decompressing), and, where a caller asks, not the
identity. `hash_to_g1` is RFC 9380's `hash_to_curve` with suite BLS12381G1_XMD:SHA-256_SSWU_RO_
under a caller's domain separation tag. `pairing_equal(a, b, c, d)` decides e(a, b) = e(c, d)
with two Miller loops and one final exponentiation.

Errors (all `ProtocolError`: a peer's bad point maps to a 400 / a named result code):

    BlsError                  root; `.reason` says which rule failed
    ├── EncodingError         wrong length, flag bits, or a non-canonical encoding
    ├── NotOnCurveError       the coordinates are not a point of the curve
    ├── NotInSubgroupError    on the curve, outside the prime-order subgroup
    ├── IdentityError         the point at infinity where a real point is required
    └── ScalarError           a scalar of the wrong length, ≥ ORDER, or zero where refused

Side channels: blst is written to run in constant time, but nobody has checked pyblst's wrapper
for it, and Python's big-integer arithmetic on scalars (Lagrange coefficients, inverses, polynomial
evaluation, a validator's share before it reaches blst) is not constant-time.
"""

from __future__ import annotations

from typing import Final

import pyblst

from protocol.errors import ProtocolError

# The order r of G1, G2 and GT (the scalar field of BLS12-381).
ORDER: Final = 0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001
# The base field modulus p (needed only to encode test vectors' affine coordinates).
FIELD_MODULUS: Final = int(
    "1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab",
    16,
)
G1_BYTES: Final = 48
G2_BYTES: Final = 96
SCALAR_BYTES: Final = 32
MAX_DST_BYTES: Final = 255  # RFC 9380 section 5.3.3: longer tags must be hashed first

# The standard generators (compressed; the zcash serialization every BLS12-381 library shares).
_G1_GENERATOR: Final = bytes.fromhex(
    "97f1d3a73197d7942695638c4fa9ac0fc3688c4f9774b905a14e3a3f171bac586c55e83ff97a1aeffb3af00adb22c6bb"
)
_G2_GENERATOR: Final = bytes.fromhex(
    "93e02b6052719f607dacd3a088274f65596bd0d09920b61ab5da61bbdc7f5049334cf11213945d57e5ac7d055d042b7e"
    "024aa2b2f08f0a91260805272dc51051c6e47ad4fa403b02b4510b647ae3d1770bac0326a805bbefd48056c8c121bdb8"
)
_G1_IDENTITY: Final = b"\xc0" + bytes(G1_BYTES - 1)
_G2_IDENTITY: Final = b"\xc0" + bytes(G2_BYTES - 1)

G1 = pyblst.BlstP1Element
G2 = pyblst.BlstP2Element


class BlsError(ProtocolError):
    """A BLS12-381 value that breaks one of this module's parsing rules."""

    code = "bls_invalid"

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"invalid {what}: {reason}")
        self.what = what
        self.reason = reason


class EncodingError(BlsError):
    code = "bls_encoding"


class NotOnCurveError(BlsError):
    code = "bls_not_on_curve"


class NotInSubgroupError(BlsError):
    code = "bls_not_in_subgroup"


class IdentityError(BlsError):
    code = "bls_identity"


class ScalarError(BlsError):
    code = "bls_scalar"


def g1_generator() -> G1:
    return G1.uncompress(_G1_GENERATOR)


def g2_generator() -> G2:
    return G2.uncompress(_G2_GENERATOR)


def g1_identity() -> G1:
    return G1()


def g2_identity() -> G2:
    return G2()


def g1_bytes(point: G1) -> bytes:
    return bytes(point.compress())


def g2_bytes(point: G2) -> bytes:
    return bytes(point.compress())


def is_g1_identity(point: G1) -> bool:
    return g1_bytes(point) == _G1_IDENTITY


def is_g2_identity(point: G2) -> bool:
    return g2_bytes(point) == _G2_IDENTITY


def _blst_error(what: str, exc: Exception) -> BlsError:
    text = str(exc)
    if "NOT_IN_GROUP" in text:
        return NotInSubgroupError(what, "the point is not in the prime-order subgroup")
    if "NOT_ON_CURVE" in text:
        return NotOnCurveError(what, "the point is not on the curve")
    return EncodingError(what, f"not a compressed point ({text})")


def parse_g1(data: bytes, what: str = "G1 point", *, allow_identity: bool = False) -> G1:
    """A canonical compressed G1 point in the subgroup (not the identity unless allowed)."""
    if not isinstance(data, bytes) or len(data) != G1_BYTES:
        raise EncodingError(what, f"a compressed G1 point is {G1_BYTES} bytes")
    try:
        point = G1.uncompress(data)
    except (ValueError, TypeError) as exc:
        raise _blst_error(what, exc) from None
    if g1_bytes(point) != data:
        raise EncodingError(what, "not the canonical encoding of its point")
    if not allow_identity and data == _G1_IDENTITY:
        raise IdentityError(what, "the point at infinity")
    return point


def parse_g2(data: bytes, what: str = "G2 point", *, allow_identity: bool = False) -> G2:
    """A canonical compressed G2 point in the subgroup (not the identity unless allowed)."""
    if not isinstance(data, bytes) or len(data) != G2_BYTES:
        raise EncodingError(what, f"a compressed G2 point is {G2_BYTES} bytes")
    try:
        point = G2.uncompress(data)
    except (ValueError, TypeError) as exc:
        raise _blst_error(what, exc) from None
    if g2_bytes(point) != data:
        raise EncodingError(what, "not the canonical encoding of its point")
    if not allow_identity and data == _G2_IDENTITY:
        raise IdentityError(what, "the point at infinity")
    return point


def scalar_bytes(value: int) -> bytes:
    if not 0 <= value < ORDER:
        raise ScalarError("scalar", "outside [0, ORDER)")
    return value.to_bytes(SCALAR_BYTES, "big")


def parse_scalar(data: bytes, what: str = "scalar", *, allow_zero: bool = False) -> int:
    """A 32-byte big-endian scalar < ORDER (non-zero unless allowed)."""
    if not isinstance(data, bytes) or len(data) != SCALAR_BYTES:
        raise ScalarError(what, f"a scalar is {SCALAR_BYTES} bytes")
    value = int.from_bytes(data, "big")
    if value >= ORDER:
        raise ScalarError(what, "not below the group order")
    if value == 0 and not allow_zero:
        raise ScalarError(what, "zero")
    return value


def g1_mul(point: G1, scalar: int) -> G1:
    """scalar · point, for any integer scalar (reduced mod ORDER first: blst takes [0, 2^256))."""
    return point.scalar_mul(scalar % ORDER)


def g2_mul(point: G2, scalar: int) -> G2:
    return point.scalar_mul(scalar % ORDER)


def g1_sum(points: list[G1]) -> G1:
    total = G1()
    for point in points:
        total = total + point
    return total


def g2_sum(points: list[G2]) -> G2:
    total = G2()
    for point in points:
        total = total + point
    return total


def hash_to_g1(message: bytes, dst: bytes) -> G1:
    """RFC 9380 hash_to_curve, suite BLS12381G1_XMD:SHA-256_SSWU_RO_, tag `dst`."""
    if not 0 < len(dst) <= MAX_DST_BYTES:
        raise BlsError("domain separation tag", f"1 to {MAX_DST_BYTES} bytes")
    return G1.hash_to_group(message, dst)


def pairing_equal(a: G1, b: G2, c: G1, d: G2) -> bool:
    """e(a, b) == e(c, d)."""
    return bool(pyblst.final_verify(pyblst.miller_loop(a, b), pyblst.miller_loop(c, d)))
