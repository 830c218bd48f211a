"""RSA blind signatures (RFC 9474, RSABSSA): a signer signs a message it never sees.

The protocol has one round between a client and a signer (key pair `RsaPrivateKey` /
`RsaPublicKey`), and anyone holding the public key can verify the result:

    client                                               signer
    prepared = prepare(msg)            random 32-byte prefix ‖ msg (Randomized variants)
    blinding = blind(pk, prepared)     EMSA-PSS-encode, multiply by r^e mod n
                  blinding.blinded_msg  ─────────────────►
                                                         blind_sig = blind_sign(sk, blinded_msg)
                                     ◄─────────────────  (checks s^e = m before answering)
    sig = finalize(pk, prepared, blind_sig, blinding.inv)   multiply by r^-1, verify
    verify(pk, prepared, sig)          anyone, any time: a standard RSASSA-PSS verification

`sig` is an ordinary RSASSA-PSS signature (SHA-384, MGF1-SHA-384) over `prepared`, so any
RSA-PSS library verifies it too. The signer sees `blinded_msg = encode(prepared) · r^e mod n`
with `r` a uniform unit mod n: a uniformly random unit, independent of `prepared` and `sig`.
Unlinkability therefore holds only while the client keeps `inv` (and, for Randomized variants,
the prefix until the signature is spent) to itself.

Variants (RFC 9474 section 5), one key per variant (the RFC forbids reusing a key across them):

    RSABSSA-SHA384-PSS-Randomized         48-byte salt, random prefix   (DEFAULT_VARIANT)
    RSABSSA-SHA384-PSSZERO-Randomized     empty salt,   random prefix
    RSABSSA-SHA384-PSS-Deterministic      48-byte salt, message as is
    RSABSSA-SHA384-PSSZERO-Deterministic  empty salt,   message as is (deterministic signature)

Functions that need randomness come in two forms: `*_with` takes it as explicit parameters
(for the RFC's test vectors) and the plain form draws it from `secrets`. Verification is pure
integer and byte arithmetic (Python ints, hashlib), so every validator gets the same answer.

Errors (all `ProtocolError`, so a peer's bad value maps to a 400 / a named result code):

    BlindRsaError                 root of this module's errors; `.reason` says which rule failed
    ├── MessageTooLongError       a message over MAX_MESSAGE_BYTES (RFC: "message too long")
    ├── InvalidInputError         a value of the wrong length or form, a bad salt or prefix,
    │   │                         an inverse that is not one, a message not coprime with n
    │   └── MessageOutOfRangeError  a blinded message or signature representative ≥ n
    ├── KeySizeError              a modulus outside [MIN_MODULUS_BITS, MAX_MODULUS_BITS]
    ├── SigningError              the signer's own check s^e = m failed (a fault; nothing sent)
    └── VerificationError         the signature does not verify (RFC: "invalid signature")

Side channels: Python's big-integer `pow` is not constant-time. `blind_sign` applies RSA
blinding (a fresh random base factor per call, as RFC 9474's "Timing Side Channels and Fault
Attacks" asks), so its timing does not follow the blinded message; the private exponent's bits
may still leak to an attacker who can time many calls on the signer's machine. Client-side
values (`inv`, the prefix) go through the same non-constant-time arithmetic on the client's own
machine.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from math import gcd
from typing import Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from protocol.errors import ProtocolError

MIN_MODULUS_BITS: Final = 2048
MAX_MODULUS_BITS: Final = 4096  # caps a hostile key's cost for every validator that verifies
DEFAULT_MODULUS_BITS: Final = 2048
PUBLIC_EXPONENT: Final = 65537  # what `RsaPrivateKey.generate` uses
MAX_PUBLIC_EXPONENT: Final = 2**32 - 1  # keeps a verification to a few dozen multiplications
PREFIX_BYTES: Final = 32  # RFC 9474 PrepareRandomize: random(32)
# Planet's cap on a message (prepared or not): credits are a few dozen bytes; the cap keeps a
# hostile input to one small hash. (RFC 8017's own limit is the hash's input limit, 2^125 bytes.)
MAX_MESSAGE_BYTES: Final = 64 * 1024
MAX_KEY_DER_BYTES: Final = 1024  # a 4096-bit SubjectPublicKeyInfo is 550 bytes
_HASH_BYTES: Final = 48  # SHA-384
_TRAILER: Final = 0xBC
_UNIT_TRIES: Final = 16  # r not invertible mod n means r shares a prime with n: never in practice


# --- errors ---------------------------------------------------------------------------------------


class BlindRsaError(ProtocolError):
    """A blind-signature value or operation that fails one of RFC 9474's rules."""

    code = "blind_rsa"

    def __init__(self, reason: str) -> None:
        super().__init__(f"blind RSA: {reason}")
        self.reason = reason


class MessageTooLongError(BlindRsaError):
    code = "blind_rsa_message_too_long"

    def __init__(self, length: int, limit: int = MAX_MESSAGE_BYTES) -> None:
        super().__init__(f"message of {length} bytes is over the {limit}-byte limit")
        self.length = length
        self.limit = limit


class InvalidInputError(BlindRsaError):
    code = "blind_rsa_invalid_input"


class MessageOutOfRangeError(InvalidInputError):
    """A blinded message or signature whose integer is not below the modulus."""

    code = "blind_rsa_out_of_range"

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} representative out of range (not below the modulus n)")
        self.what = what


class KeySizeError(BlindRsaError):
    code = "blind_rsa_key_size"

    def __init__(self, bits: int) -> None:
        super().__init__(
            f"an RSA modulus of {bits} bits is outside [{MIN_MODULUS_BITS}, {MAX_MODULUS_BITS}]"
        )
        self.bits = bits


class SigningError(BlindRsaError):
    """The private-key result failed the signer's s^e = m check (a fault or a corrupt key)."""

    code = "blind_rsa_signing_failure"
    http_status = 500

    def __init__(self) -> None:
        super().__init__("signing failure: s^e mod n does not give back the blinded message")


class VerificationError(BlindRsaError):
    code = "blind_rsa_invalid_signature"

    def __init__(self, reason: str = "invalid signature") -> None:
        super().__init__(reason)


# --- variants -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One named RSABSSA variant: SHA-384 and MGF1-SHA-384 throughout, salt length, prefix."""

    name: str
    salt_len: int  # PSS salt bytes: 48 (PSS) or 0 (PSSZERO)
    randomized: bool  # PrepareRandomize (32-byte random prefix) or PrepareIdentity

    @property
    def prefix_len(self) -> int:
        return PREFIX_BYTES if self.randomized else 0


PSS_RANDOMIZED: Final = Variant("RSABSSA-SHA384-PSS-Randomized", salt_len=48, randomized=True)
PSSZERO_RANDOMIZED: Final = Variant(
    "RSABSSA-SHA384-PSSZERO-Randomized", salt_len=0, randomized=True
)
PSS_DETERMINISTIC: Final = Variant(
    "RSABSSA-SHA384-PSS-Deterministic", salt_len=48, randomized=False
)
PSSZERO_DETERMINISTIC: Final = Variant(
    "RSABSSA-SHA384-PSSZERO-Deterministic", salt_len=0, randomized=False
)
VARIANTS: Final = {
    v.name: v
    for v in (PSS_RANDOMIZED, PSSZERO_RANDOMIZED, PSS_DETERMINISTIC, PSSZERO_DETERMINISTIC)
}
# Randomized: the client's fresh prefix makes the signed message unguessable to the signer even
# for low-entropy messages and maliciously generated keys (RFC 9474, "Message Entropy"); the PSS
# salt keeps the signature itself a standard probabilistic RSA-PSS signature.
DEFAULT_VARIANT: Final = PSS_RANDOMIZED


def variant_named(name: str) -> Variant:
    """The variant with RFC 9474's name `name`, or InvalidInputError."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise InvalidInputError(f"unknown variant {name!r}") from None


# --- keys -----------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_public_numbers(n: int, e: int) -> None:
    if (
        isinstance(n, bool)
        or not isinstance(n, int)
        or isinstance(e, bool)
        or not isinstance(e, int)
    ):
        raise InvalidInputError("the modulus and the public exponent are integers")
    if n <= 0:
        raise InvalidInputError("the modulus is positive")
    bits = n.bit_length()
    if not MIN_MODULUS_BITS <= bits <= MAX_MODULUS_BITS:
        raise KeySizeError(bits)
    if n % 2 == 0:
        raise InvalidInputError("the modulus is odd")
    if not 3 <= e <= MAX_PUBLIC_EXPONENT or e % 2 == 0:
        raise InvalidInputError(f"the public exponent is odd and in [3, {MAX_PUBLIC_EXPONENT}]")


@dataclass(frozen=True)
class RsaPublicKey:
    """A signer's public key (n, e): what verifies its blind signatures. Checked on creation."""

    n: int
    e: int

    def __post_init__(self) -> None:
        _check_public_numbers(self.n, self.e)

    @property
    def modulus_bits(self) -> int:
        return self.n.bit_length()

    @property
    def modulus_len(self) -> int:
        """kLen: the byte length of n, of blinded messages and of signatures."""
        return (self.n.bit_length() + 7) // 8

    @classmethod
    def from_cryptography(cls, key: rsa.RSAPublicKey) -> RsaPublicKey:
        numbers = key.public_numbers()
        return cls(n=numbers.n, e=numbers.e)

    def to_cryptography(self) -> rsa.RSAPublicKey:
        return rsa.RSAPublicNumbers(self.e, self.n).public_key()

    def to_der(self) -> bytes:
        """The key as DER SubjectPublicKeyInfo (rsaEncryption), for storing and sending."""
        return self.to_cryptography().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @classmethod
    def from_der(cls, data: bytes) -> RsaPublicKey:
        """Parse DER SubjectPublicKeyInfo bytes from a peer: an RSA key within the size bounds."""
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError("a DER public key is bytes")
        if len(data) > MAX_KEY_DER_BYTES:
            raise InvalidInputError(f"a DER public key is at most {MAX_KEY_DER_BYTES} bytes")
        try:
            key = serialization.load_der_public_key(bytes(data))
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise InvalidInputError(f"not a DER SubjectPublicKeyInfo: {exc}") from None
        if not isinstance(key, rsa.RSAPublicKey):
            raise InvalidInputError(f"not an RSA public key ({type(key).__name__})")
        return cls.from_cryptography(key)


@dataclass(frozen=True, repr=False)
class RsaPrivateKey:
    """A signer's private key. `d` and the primes never leave the signer; repr shows only n's size.

    The CRT values (d mod p-1, d mod q-1, q^-1 mod p) are derived once here. `d` is not checked
    against e (a wrong d is caught per signature by `blind_sign`'s s^e = m check).
    """

    public: RsaPublicKey
    d: int
    p: int
    q: int
    _dp: int = field(init=False, compare=False)
    _dq: int = field(init=False, compare=False)
    _q_inv: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        n = self.public.n
        if self.p * self.q != n or self.p < 3 or self.q < 3:
            raise InvalidInputError("the primes p and q do not multiply to the modulus n")
        if not 1 < self.d < n:
            raise InvalidInputError("the private exponent d is in (1, n)")
        object.__setattr__(self, "_dp", self.d % (self.p - 1))
        object.__setattr__(self, "_dq", self.d % (self.q - 1))
        try:
            object.__setattr__(self, "_q_inv", pow(self.q, -1, self.p))
        except ValueError:
            raise InvalidInputError("p and q are not coprime") from None

    def __repr__(self) -> str:
        return f"RsaPrivateKey(<{self.public.modulus_bits}-bit, secret>)"

    @classmethod
    def generate(cls, bits: int = DEFAULT_MODULUS_BITS) -> RsaPrivateKey:
        """A fresh key pair (e = 65537) from the `cryptography` package's prime generation."""
        if not MIN_MODULUS_BITS <= bits <= MAX_MODULUS_BITS:
            raise KeySizeError(bits)
        return cls.from_cryptography(rsa.generate_private_key(PUBLIC_EXPONENT, bits))

    @classmethod
    def from_cryptography(cls, key: rsa.RSAPrivateKey) -> RsaPrivateKey:
        numbers = key.private_numbers()
        public = RsaPublicKey(n=numbers.public_numbers.n, e=numbers.public_numbers.e)
        return cls(public=public, d=numbers.d, p=numbers.p, q=numbers.q)

    def to_cryptography(self) -> rsa.RSAPrivateKey:
        """The same key as a `cryptography` object (for PEM/PKCS#8 storage)."""
        numbers = rsa.RSAPrivateNumbers(
            p=self.p,
            q=self.q,
            d=self.d,
            dmp1=self._dp,
            dmq1=self._dq,
            iqmp=self._q_inv,
            public_numbers=rsa.RSAPublicNumbers(self.public.e, self.public.n),
        )
        return numbers.private_key()

    def _rsasp1(self, m: int) -> int:
        """s = m^d mod n by the CRT (RFC 8017 5.1.2 / 5.2.1, second form)."""
        s1 = pow(m, self._dp, self.p)
        s2 = pow(m, self._dq, self.q)
        h = (s1 - s2) * self._q_inv % self.p
        return s2 + self.q * h


# --- integer and byte helpers (RFC 8017 OS2IP / I2OSP, MGF1) --------------------------------------


def _i2osp(x: int, length: int) -> bytes:
    return x.to_bytes(length, "big")


def _os2ip(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _sha384(data: bytes) -> bytes:
    return hashlib.sha384(data).digest()


def _mgf1(seed: bytes, mask_len: int) -> bytes:
    """MGF1 with SHA-384 (RFC 8017 B.2.1)."""
    out = bytearray()
    counter = 0
    while len(out) < mask_len:
        out += _sha384(seed + counter.to_bytes(4, "big"))
        counter += 1
    return bytes(out[:mask_len])


def _random_unit(n: int) -> int:
    """A uniform r in [1, n) with gcd(r, n) = 1 (rejection sampling, bounded)."""
    for _ in range(_UNIT_TRIES):
        r = 1 + secrets.randbelow(n - 1)
        if gcd(r, n) == 1:
            return r
    raise InvalidInputError("invalid blind: no invertible blinding factor found")


def _check_bytes(value: bytes, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise InvalidInputError(f"{what} is bytes, got {type(value).__name__}")
    return bytes(value)


def _check_message(msg: bytes, what: str = "message") -> bytes:
    msg = _check_bytes(msg, what)
    if len(msg) > MAX_MESSAGE_BYTES:
        raise MessageTooLongError(len(msg))
    return msg


def _check_exact(value: bytes, length: int, what: str) -> bytes:
    value = _check_bytes(value, what)
    if len(value) != length:
        raise InvalidInputError(f"{what} is {length} bytes, got {len(value)}")
    return value


# --- EMSA-PSS (RFC 8017 9.1) ----------------------------------------------------------------------


def emsa_pss_encode(msg: bytes, em_bits: int, salt: bytes) -> bytes:
    """EMSA-PSS-ENCODE(msg, emBits) with SHA-384, MGF1-SHA-384 and the given salt (sLen = len)."""
    msg = _check_message(msg)
    em_len = (em_bits + 7) // 8
    if em_len < _HASH_BYTES + len(salt) + 2:
        raise KeySizeError(em_bits + 1)
    m_hash = _sha384(msg)
    h = _sha384(b"\x00" * 8 + m_hash + salt)
    db = b"\x00" * (em_len - len(salt) - _HASH_BYTES - 2) + b"\x01" + salt
    masked_db = bytearray(a ^ b for a, b in zip(db, _mgf1(h, len(db)), strict=True))
    masked_db[0] &= 0xFF >> (8 * em_len - em_bits)
    return bytes(masked_db) + h + bytes([_TRAILER])


def _emsa_pss_verify(msg: bytes, em: bytes, em_bits: int, salt_len: int) -> bool:
    """EMSA-PSS-VERIFY (RFC 8017 9.1.2): whether `em` is a valid encoding of `msg`."""
    em_len = (em_bits + 7) // 8
    if len(em) != em_len or em_len < _HASH_BYTES + salt_len + 2 or em[-1] != _TRAILER:
        return False
    masked_db, h = em[: em_len - _HASH_BYTES - 1], em[em_len - _HASH_BYTES - 1 : -1]
    unused_bits = 8 * em_len - em_bits
    if unused_bits and masked_db[0] >> (8 - unused_bits):
        return False
    db = bytearray(a ^ b for a, b in zip(masked_db, _mgf1(h, len(masked_db)), strict=True))
    db[0] &= 0xFF >> unused_bits
    pad_len = em_len - _HASH_BYTES - salt_len - 2
    if any(db[:pad_len]) or db[pad_len] != 0x01:
        return False
    salt = bytes(db[len(db) - salt_len :]) if salt_len else b""
    return hmac.compare_digest(h, _sha384(b"\x00" * 8 + _sha384(msg) + salt))


# --- Prepare (RFC 9474 4.1) -----------------------------------------------------------------------


def prepare_with(msg: bytes, *, prefix: bytes, variant: Variant = DEFAULT_VARIANT) -> bytes:
    """PrepareRandomize / PrepareIdentity with an explicit prefix (32 bytes, or b"")."""
    msg = _check_message(msg)
    prefix = _check_exact(prefix, variant.prefix_len, f"the {variant.name} message prefix")
    if len(prefix) + len(msg) > MAX_MESSAGE_BYTES:
        raise MessageTooLongError(len(prefix) + len(msg))
    return prefix + msg


def prepare(msg: bytes, variant: Variant = DEFAULT_VARIANT) -> bytes:
    """The prepared message to blind: a fresh random 32-byte prefix ‖ msg (Randomized), or msg."""
    return prepare_with(msg, prefix=secrets.token_bytes(variant.prefix_len), variant=variant)


def message_of(prepared_msg: bytes, variant: Variant = DEFAULT_VARIANT) -> bytes:
    """The application message inside a prepared one (a verifier strips the random prefix)."""
    prepared_msg = _check_message(prepared_msg, "prepared message")
    if len(prepared_msg) < variant.prefix_len:
        raise InvalidInputError(f"a {variant.name} prepared message has a 32-byte prefix")
    return prepared_msg[variant.prefix_len :]


# --- Blind (RFC 9474 4.2) -------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class Blinding:
    """What `blind` gives the client: `blinded_msg` goes to the signer, `inv` stays secret."""

    blinded_msg: bytes
    inv: int

    def __repr__(self) -> str:
        return f"Blinding(blinded_msg=<{len(self.blinded_msg)} bytes>, inv=<secret>)"


def blind_with(
    public_key: RsaPublicKey,
    prepared_msg: bytes,
    *,
    salt: bytes,
    inv: int,
    variant: Variant = DEFAULT_VARIANT,
) -> Blinding:
    """Blind with an explicit PSS salt and blinding inverse (r = inv^-1 mod n): RFC 9474's steps.

    The encoding uses emBits = bit_len(n) − 1, as RSASSA-PSS does (RFC 8017 8.1.1), so the
    finalized signature verifies as standard RSA-PSS; the RFC's vectors agree.

    Use `blind` outside tests: a salt or inverse that is not fresh and uniformly random breaks
    unlinkability (a chosen salt can even carry data: RFC 9474, "PSS Salt Choice").
    """
    n = public_key.n
    salt = _check_exact(salt, variant.salt_len, f"the {variant.name} salt")
    if not _is_int(inv) or not 1 <= inv < n:
        raise InvalidInputError("the blinding inverse is an integer in [1, n)")
    encoded = emsa_pss_encode(prepared_msg, public_key.modulus_bits - 1, salt)
    m = _os2ip(encoded)
    if gcd(m, n) != 1:
        raise InvalidInputError("the encoded message is not coprime with the modulus")
    try:
        r = pow(inv, -1, n)
    except ValueError:
        raise InvalidInputError("invalid blind: the blinding inverse is not invertible") from None
    z = m * pow(r, public_key.e, n) % n
    return Blinding(blinded_msg=_i2osp(z, public_key.modulus_len), inv=inv)


def blind(
    public_key: RsaPublicKey, prepared_msg: bytes, variant: Variant = DEFAULT_VARIANT
) -> Blinding:
    """Blind `prepared_msg` for the signer with a fresh salt and a uniform r in [1, n)."""
    inv = pow(_random_unit(public_key.n), -1, public_key.n)  # uniform r, so a uniform inverse
    salt = secrets.token_bytes(variant.salt_len)
    return blind_with(public_key, prepared_msg, salt=salt, inv=inv, variant=variant)


# --- BlindSign (RFC 9474 4.3) ---------------------------------------------------------------------


def blind_sign(private_key: RsaPrivateKey, blinded_msg: bytes) -> bytes:
    """The signer's step: s = m^d mod n for the blinded message m, checked by s^e = m.

    The result does not depend on any randomness; a fresh base-blinding factor per call only
    hides the private-key operation's timing from the blinded message (see the module doc).
    Raises MessageOutOfRangeError for m ≥ n and SigningError when the check fails (a fault: the
    wrong s must never leave the signer, it could reveal a prime of n).
    """
    public = private_key.public
    n, e = public.n, public.e
    blinded_msg = _check_exact(blinded_msg, public.modulus_len, "the blinded message")
    m = _os2ip(blinded_msg)
    if m >= n:
        raise MessageOutOfRangeError("blinded message")
    factor = _random_unit(n)
    s = private_key._rsasp1(m * pow(factor, e, n) % n) * pow(factor, -1, n) % n
    if pow(s, e, n) != m:
        raise SigningError()
    return _i2osp(s, public.modulus_len)


# --- Finalize and Verify (RFC 9474 4.4, RFC 8017 8.1.2) -------------------------------------------


def finalize(
    public_key: RsaPublicKey,
    prepared_msg: bytes,
    blind_sig: bytes,
    inv: int,
    variant: Variant = DEFAULT_VARIANT,
) -> bytes:
    """Unblind the signer's answer (s = z · inv mod n) and verify it; the signature, or an error."""
    n = public_key.n
    blind_sig = _check_exact(blind_sig, public_key.modulus_len, "the blind signature")
    if not _is_int(inv) or not 1 <= inv < n:
        raise InvalidInputError("the blinding inverse is an integer in [1, n)")
    z = _os2ip(blind_sig)
    if z >= n:
        raise MessageOutOfRangeError("blind signature")
    sig = _i2osp(z * inv % n, public_key.modulus_len)
    verify(public_key, prepared_msg, sig, variant)
    return sig


def verify(
    public_key: RsaPublicKey,
    prepared_msg: bytes,
    sig: bytes,
    variant: Variant = DEFAULT_VARIANT,
) -> None:
    """RSASSA-PSS-VERIFY of `sig` over `prepared_msg`; returns None or raises VerificationError.

    Deterministic and public: anyone with the key gets the same answer. A well-formed signature
    that does not verify raises VerificationError, and so does s ≥ n (RFC 8017 RSASSA-PSS-VERIFY
    step 2b: a signature representative out of range is an invalid signature — e.g. a signature
    made under a larger modulus); malformed input (wrong length, an oversized message) raises
    the matching InvalidInputError / MessageTooLongError.
    """
    prepared_msg = _check_message(prepared_msg, "prepared message")
    sig = _check_exact(sig, public_key.modulus_len, "the signature")
    n = public_key.n
    s = _os2ip(sig)
    if s >= n:
        raise VerificationError()
    em_bits = public_key.modulus_bits - 1
    em_len = (em_bits + 7) // 8
    m = pow(s, public_key.e, n)
    if m.bit_length() > 8 * em_len:
        raise VerificationError()
    if not _emsa_pss_verify(prepared_msg, _i2osp(m, em_len), em_bits, variant.salt_len):
        raise VerificationError()


def is_valid(
    public_key: RsaPublicKey,
    prepared_msg: bytes,
    sig: bytes,
    variant: Variant = DEFAULT_VARIANT,
) -> bool:
    """Whether `sig` verifies; False for any malformed input too."""
    try:
        verify(public_key, prepared_msg, sig, variant)
    except BlindRsaError:
        return False
    return True
