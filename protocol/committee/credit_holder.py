"""A credit's holder key: only the buyer can give a credit to a node or a relay (issue 42,
attack 4 follow-up; docs/credits.md "Who may lock or redeem a credit").

A holder-bound credit's nonce is the public key of a fresh Ed25519 key, its **holder key**,
made from 32 random bytes (its **seed**) that only the buyer keeps. The nonce is what gets
blind-signed, so the validators that mint it see nothing new; a fresh key per credit keeps
credits unlinkable. The spent id stays sha256(nonce) = sha256(holder key).

To give a credit to a party, the buyer signs an **assignment** with the holder key:

    assignment = Ed25519_sign(holder seed, ASSIGNMENT_DOMAIN ‖ party kind u8 ‖ party key (32)
                              ‖ shard u16 big-endian ‖ len(model) u8 ‖ model (ASCII))

    party kind NODE  (1)   party key: the node's committee key (the key that signs its
                           `credit_lock` and `credit_redeem`); model and shard: what it serves
    party kind RELAY (2)   party key: the relay's registered X25519 key; model "", shard 0

The chain locks or redeems a holder-bound credit only for the party its assignment names
(abci_app/credit_holders.py): a lock or redemption copied out of the mempool by another party
names the other party's key and is refused `CREDIT_NOT_ASSIGNED`. No chain id is bound: the
holder key is one credit's and the credit verifies only under its own committee's key, so an
assignment is meaningful on that chain only.

Pure: bytes in, bytes out (PyNaCl, libsodium's Ed25519: deterministic signing and verifying).
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Final

from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey

from protocol.committee.grammar import NAME, check

ASSIGNMENT_DOMAIN: Final = b"planet-credit-assignment/v1\n"
SEED_BYTES: Final = 32
HOLDER_BYTES: Final = 32
ASSIGNMENT_BYTES: Final = 64
PARTY_KEY_BYTES: Final = 32
NODE: Final = 1
RELAY: Final = 2
HOLDER_HEX = re.compile(f"[0-9a-f]{{{2 * HOLDER_BYTES}}}\\Z")
ASSIGNMENT_HEX = re.compile(f"[0-9a-f]{{{2 * ASSIGNMENT_BYTES}}}\\Z")


def new_seed() -> bytes:
    """A fresh holder seed (the buyer's secret of one credit)."""
    return secrets.token_bytes(SEED_BYTES)


def holder_of(seed: bytes) -> bytes:
    """The holder key (32 bytes) of `seed`: the nonce its credit is minted on."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a holder seed is {SEED_BYTES} bytes")
    return SigningKey(seed).verify_key.encode()


def node_party(node_key: bytes, model: str, shard: int) -> bytes:
    """The assignment's message for a node (`node_key`: its committee key) on (model, shard)."""
    return _party(NODE, node_key, model, shard)


def relay_party(relay_key: bytes) -> bytes:
    """The assignment's message for a relay (`relay_key`: its registered X25519 key)."""
    return _party(RELAY, relay_key, "", 0)


def _party(kind: int, key: bytes, model: str, shard: int) -> bytes:
    if len(key) != PARTY_KEY_BYTES:
        raise ValueError(f"a party key is {PARTY_KEY_BYTES} bytes")
    if model and NAME.match(model) is None:
        raise ValueError(f"model {model!a} is not a model id")
    if not 0 <= shard <= 0xFFFF:
        raise ValueError(f"shard {shard} is not 0 … 65535")
    name = model.encode("ascii")
    return (
        ASSIGNMENT_DOMAIN
        + bytes([kind])
        + key
        + shard.to_bytes(2, "big")
        + bytes([len(name)])
        + name
    )


def assign(seed: bytes, party: bytes) -> bytes:
    """The holder's assignment (64 bytes) of its credit to `party` (`node_party`, `relay_party`)."""
    return SigningKey(seed).sign(party).signature


def assigned(holder: bytes, party: bytes, assignment: bytes) -> bool:
    """Whether `assignment` is the holder key's signature over `party` (False for a holder that
    is no Ed25519 key, or of small order: libsodium refuses those)."""
    if len(holder) != HOLDER_BYTES or len(assignment) != ASSIGNMENT_BYTES:
        return False
    try:
        VerifyKey(holder).verify(party, assignment)
    except (BadSignatureError, CryptoError, ValueError):
        return False
    return True


def parse_assignment(item: Any, where: str) -> bytes:
    """An assignment from a peer or a tx (128 lowercase hex), or TxDecodeError naming `where`."""
    return bytes.fromhex(check.text(item, where, ASSIGNMENT_HEX, 2 * ASSIGNMENT_BYTES))


def parse_holder(item: Any, where: str) -> bytes:
    """A holder key from a tx (64 lowercase hex), or TxDecodeError naming `where`."""
    return bytes.fromhex(check.text(item, where, HOLDER_HEX, 2 * HOLDER_BYTES))
