"""One key period's DKG run as both the chain and each validator's watcher see it.

The receivers are the validators at the run's config block, ascending by address, indexed
1..n. A receiver's X25519 box key is its ed25519 consensus key mapped to Curve25519 (libsodium's
`crypto_sign_ed25519_pk_to_curve25519`; the watcher opens with the matching private key), so no
extra key has to be published. The session id binds the chain and the period, so a deal of one
run never opens as a share of another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from nacl.bindings import crypto_sign_ed25519_pk_to_curve25519
from nacl.exceptions import RuntimeError as NaclRuntimeError
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from protocol.dkg import DkgConfig, DkgMessageError, Receiver, threshold_for

SESSION_DOMAIN: Final = b"planet-credit-dkg/v1\n"


def session_of(chain_id: str, period: int, attempt: int = 0) -> bytes:
    """The run's 32-byte session id: sha256(domain ‖ chain id ‖ 0 ‖ period as 8 bytes ‖
    attempt as 4 bytes)."""
    return hashlib.sha256(
        SESSION_DOMAIN
        + chain_id.encode()
        + b"\0"
        + period.to_bytes(8, "big")
        + attempt.to_bytes(4, "big")
    ).digest()


def box_key_of(consensus_public_key: bytes) -> bytes:
    """A validator's X25519 box key, from its ed25519 consensus key (DkgMessageError if it
    is not a valid ed25519 point)."""
    try:
        return crypto_sign_ed25519_pk_to_curve25519(consensus_public_key)
    except (NaclRuntimeError, ValueError, TypeError) as exc:
        raise DkgMessageError(f"not an ed25519 key: {exc}") from None


def box_private_of(consensus_key: SigningKey) -> PrivateKey:
    """The X25519 private key that opens what was sealed to `box_key_of(its public key)`."""
    return consensus_key.to_curve25519_private_key()


def config_of(session: bytes, receiver_keys: Sequence[bytes]) -> DkgConfig:
    """A fresh run's config: receivers (consensus keys, in index order) are also the dealers."""
    n = len(receiver_keys)
    return DkgConfig(
        session=session,
        dealers=tuple(range(1, n + 1)),
        receivers=tuple(Receiver(i + 1, box_key_of(k)) for i, k in enumerate(receiver_keys)),
        threshold=threshold_for(n),
    )
