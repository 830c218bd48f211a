"""protocol.bls: RFC 9380 hash-to-curve vectors and the strict point and scalar parsers."""

from __future__ import annotations

import pytest

from protocol import bls
from protocol.errors import ProtocolError

pytestmark = pytest.mark.unit

# RFC 9380 appendix J.9.1, suite BLS12381G1_XMD:SHA-256_SSWU_RO_: (msg, P.x, P.y).
RFC9380_DST = b"QUUX-V01-CS02-with-BLS12381G1_XMD:SHA-256_SSWU_RO_"
RFC9380_G1_RO = [
    (
        b"",
        "052926add2207b76ca4fa57a8734416c8dc95e24501772c814278700eed6d1e4e8cf62d9c09db0fac349612b759e79a1",
        "08ba738453bfed09cb546dbb0783dbb3a5f1f566ed67bb6be0e8c67e2e81a4cc68ee29813bb7994998f3eae0c9c6a265",
    ),
    (
        b"abc",
        "03567bc5ef9c690c2ab2ecdf6a96ef1c139cc0b2f284dca0a9a7943388a49a3aee664ba5379a7655d3c68900be2f6903",
        "0b9c15f3fe6e5cf4211f346271d7b01c8f3b28be689c8429c85b67af215533311f0b8dfaaa154fa6b88176c229f2885d",
    ),
    (
        b"abcdef0123456789",
        "11e0b079dea29a68f0383ee94fed1b940995272407e3bb916bbf268c263ddd57a6a27200a784cbc248e84f357ce82d98",
        "03a87ae2caf14e8ee52e51fa2ed8eefe80f02457004ba4d486d6aa1f517c0889501dc7413753f9599b099ebcbbd2d709",
    ),
]
P = bls.FIELD_MODULUS


def compressed(x: int, y: int) -> bytes:
    """The zcash compressed encoding of the affine point (x, y): flag bits on x."""
    data = bytearray(x.to_bytes(48, "big"))
    data[0] |= 0x80
    if y > P - y:
        data[0] |= 0x20
    return bytes(data)


@pytest.mark.parametrize(("msg", "x", "y"), RFC9380_G1_RO, ids=["empty", "abc", "abcdef"])
def test_hash_to_g1_matches_rfc9380(msg: bytes, x: str, y: str) -> None:
    xi, yi = int(x, 16), int(y, 16)
    assert (yi * yi - xi**3 - 4) % P == 0  # the vector itself is a curve point
    assert bls.g1_bytes(bls.hash_to_g1(msg, RFC9380_DST)) == compressed(xi, yi)


def test_hash_to_g1_depends_on_the_tag() -> None:
    assert bls.g1_bytes(bls.hash_to_g1(b"abc", b"OTHER-TAG")) != bls.g1_bytes(
        bls.hash_to_g1(b"abc", RFC9380_DST)
    )
    with pytest.raises(bls.BlsError):
        bls.hash_to_g1(b"abc", b"")
    with pytest.raises(bls.BlsError):
        bls.hash_to_g1(b"abc", b"x" * 256)


def _x_with(square: bool) -> int:
    x = 1
    while (pow((x**3 + 4) % P, (P - 1) // 2, P) == 1) != square:
        x += 1
    return x


def test_parse_g1_refuses_each_malformed_encoding_by_name() -> None:
    generator = bls.g1_bytes(bls.g1_generator())
    assert bls.g1_bytes(bls.parse_g1(generator)) == generator
    with pytest.raises(bls.EncodingError):
        bls.parse_g1(generator[:-1])
    with pytest.raises(bls.EncodingError):
        bls.parse_g1(generator + b"\x00")
    with pytest.raises(bls.EncodingError):  # compression flag missing
        bls.parse_g1(bytes([generator[0] & 0x7F]) + generator[1:])
    with pytest.raises(bls.EncodingError):  # x = p is not a field element
        bls.parse_g1(compressed(P, 0))
    with pytest.raises(bls.EncodingError):  # infinity flag with non-zero bits: not canonical
        bls.parse_g1(b"\xc0" + bytes(46) + b"\x01", allow_identity=True)
    with pytest.raises(bls.NotOnCurveError):
        bls.parse_g1(compressed(_x_with(square=False), 0))
    with pytest.raises(bls.NotInSubgroupError):
        bls.parse_g1(compressed(_x_with(square=True), 0))
    identity = bls.g1_bytes(bls.g1_identity())
    with pytest.raises(bls.IdentityError):
        bls.parse_g1(identity)
    assert bls.is_g1_identity(bls.parse_g1(identity, allow_identity=True))


def test_parse_g2_refuses_each_malformed_encoding_by_name() -> None:
    generator = bls.g2_bytes(bls.g2_generator())
    assert bls.g2_bytes(bls.parse_g2(generator)) == generator
    with pytest.raises(bls.EncodingError):
        bls.parse_g2(generator[:48])
    with pytest.raises(bls.EncodingError):
        bls.parse_g2(bytes([generator[0] & 0x7F]) + generator[1:])
    with pytest.raises(bls.IdentityError):
        bls.parse_g2(bls.g2_bytes(bls.g2_identity()))
    with pytest.raises(bls.EncodingError):
        bls.parse_g2(b"\xc0" + bytes(94) + b"\x01", allow_identity=True)
    # a G2 point off the subgroup: x = (1 + i·c) for the first c that lands on the curve
    found = None
    for c in range(1, 64):
        candidate = bytearray(c.to_bytes(48, "big") + (1).to_bytes(48, "big"))
        candidate[0] |= 0x80
        try:
            bls.parse_g2(bytes(candidate))
        except (bls.NotInSubgroupError, bls.NotOnCurveError) as exc:
            found = found or type(exc)
            if isinstance(exc, bls.NotInSubgroupError):
                break
    assert found is bls.NotInSubgroupError


def test_scalars_are_32_bytes_below_the_order() -> None:
    assert bls.parse_scalar((5).to_bytes(32, "big")) == 5
    with pytest.raises(bls.ScalarError):
        bls.parse_scalar(bls.ORDER.to_bytes(32, "big"))
    with pytest.raises(bls.ScalarError):
        bls.parse_scalar(bytes(32))
    assert bls.parse_scalar(bytes(32), allow_zero=True) == 0
    with pytest.raises(bls.ScalarError):
        bls.parse_scalar(bytes(31))
    with pytest.raises(bls.ScalarError):
        bls.scalar_bytes(bls.ORDER)
    assert issubclass(bls.BlsError, ProtocolError)


def test_group_arithmetic_and_pairing() -> None:
    g1, g2 = bls.g1_generator(), bls.g2_generator()
    assert bls.is_g1_identity(bls.g1_mul(g1, bls.ORDER))
    assert bls.g1_bytes(bls.g1_mul(g1, bls.ORDER + 3)) == bls.g1_bytes(bls.g1_mul(g1, 3))
    assert bls.g1_bytes(bls.g1_mul(g1, -1)) == bls.g1_bytes(-g1)
    # e(a·G1, b·G2) = e(ab·G1, G2), and not e((ab+1)·G1, G2)
    a, b = 123456789, 987654321
    assert bls.pairing_equal(bls.g1_mul(g1, a), bls.g2_mul(g2, b), bls.g1_mul(g1, a * b), g2)
    assert not bls.pairing_equal(
        bls.g1_mul(g1, a), bls.g2_mul(g2, b), bls.g1_mul(g1, a * b + 1), g2
    )
