"""Relays paid for cloves that arrived (issue 43; docs/overlay.md "Relays are paid"): the node's
acknowledgement of what each path carried, and the pay note a client sends one relay of a path
inside that relay's own onion layer.

Acknowledgement (node → client, a link message of kind ACK, `protocol.overlay`):

    body = n u8 ‖ n × received u64        received[i]: the bytes of the distinct cloves of
                                          index i of this link's messages that reached the node

The client sends clove i of every message on its path i, so received[i] is what path i
delivered forward; what it delivered backward the client counts itself. A path's relays are
paid for (forward acknowledged + backward received) clove bytes at the chain's rate
(`/credit_keys` relay_bytes): floor(bytes / rate) credits each, less what they were paid.

Pay note (client → relay t of a path, a PAY cell, forward only):

    note_t  = MINE u8 (1) ‖ count u8 ‖ count × credit (88 bytes: period ‖ nonce ‖ σ)
            | MINE_ASSIGNED u8 (3) ‖ count u8 ‖ count × (credit (88) ‖ assignment (64))
                                          holder-bound credits, each assigned by its holder to
                                          relay t's X25519 key (protocol/committee/
                                          credit_holder.py `relay_party`): no other relay or
                                          node can redeem them
    layer_t = P_t(note_t)                 P_j: ChaCha20-Poly1305 under hop key k_j, nonce
    layer_j = P_j(ONWARD u8 (2) ‖ layer_{j+1})   PAY_DIRECTION u8 ‖ 3 zeros ‖ pay sequence u64
    PAY cell body = layer_1

Relay j opens its layer at its own pay sequence on that path (one counter per path, from 0,
counting every PAY it opened, its own or onward): ONWARD goes on to the next relay, MINE holds
its credits. A relay before t sees only a sealed blob; no relay but t can read, alter or keep
the credits (the AEAD tag is a MAC under t's hop key, which only the client and t hold). A PAY
cell replayed, or one dropped before another, fails its tag at the sequence the relay expects:
no cloves are paid twice by a replayed cell. A bearer credit is still the client's to give
once: the chain's spent set (abci_app/relay_credits.py) pays each credit to one party.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from protocol import blind_bls, bls
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import ASSIGNMENT_BYTES
from protocol.overlay import (
    PAY_BYTES,
    TAG_BYTES,
    LayerInvalid,
    OverlayError,
    open_layer,
    seal_layer,
)
from protocol.paid_credits import AssignedCredit, with_assignment
from protocol.sida import MAX_CLOVES

PAY_DIRECTION: Final = 3  # the layer nonce's direction byte for pay notes (1, 2: DATA)
MAX_PAY_CREDITS: Final = 16  # credits in one note: a note for the 5th relay fits PAY_BYTES
# (16 assigned credits: 2 + 16 × 152 = 2,434 bytes, with 5 layers' markers and tags ≤ 2,600)
_MINE: Final = 1
_ONWARD: Final = 2
_MINE_ASSIGNED: Final = 3
_U64: Final = struct.Struct(">Q")
MAX_COUNT: Final = (1 << 64) - 1


class PayInvalid(OverlayError):
    """A pay note that does not open under the relay's hop key at its pay sequence (altered,
    replayed, out of order, or not for this path), or whose inside breaks the grammar."""

    code = "pay_invalid"


class PayMisdirected(OverlayError):
    """A note marked onward at the path's exit (it has no next relay)."""

    code = "pay_misdirected"


class AckInvalid(OverlayError):
    code = "ack_invalid"


# -- acknowledgements -------------------------------------------------------------------------


@dataclass(frozen=True)
class Acks:
    """Clove bytes a node received on one link, per clove index (= the client's path index)."""

    received: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return bytes([len(self.received)]) + b"".join(_U64.pack(n) for n in self.received)

    @classmethod
    def from_bytes(cls, data: bytes) -> Acks:
        if not data:
            raise AckInvalid("ack", "empty")
        n = data[0]
        if not 2 <= n <= MAX_CLOVES:
            raise AckInvalid("ack", f"{n} paths is outside [2, {MAX_CLOVES}]")
        if len(data) != 1 + n * _U64.size:
            raise AckInvalid("ack", f"{len(data)} bytes, not {1 + n * _U64.size} for {n} paths")
        return cls(tuple(_U64.unpack_from(data, 1 + i * _U64.size)[0] for i in range(n)))


# -- pay notes --------------------------------------------------------------------------------


def _note(credits: Sequence[ThresholdCredit]) -> bytes:
    if not 1 <= len(credits) <= MAX_PAY_CREDITS:
        raise PayInvalid("pay note", f"{len(credits)} credits, allowed 1..{MAX_PAY_CREDITS}")
    bound = [c for c in credits if isinstance(c, AssignedCredit)]
    if not bound:
        return bytes([_MINE, len(credits)]) + b"".join(c.to_bytes() for c in credits)
    if len(bound) != len(credits):
        raise PayInvalid("pay note", "assigned and unassigned credits in one note")
    entries = b"".join(c.to_bytes() + c.assignment for c in bound)
    return bytes([_MINE_ASSIGNED, len(credits)]) + entries


def _credits(note: bytes) -> tuple[ThresholdCredit, ...]:
    assigned = note[0] == _MINE_ASSIGNED
    size = blind_bls.CREDIT_BYTES + (ASSIGNMENT_BYTES if assigned else 0)
    if len(note) < 2 or not 1 <= note[1] <= MAX_PAY_CREDITS or len(note) != 2 + note[1] * size:
        raise PayInvalid("pay note", f"{len(note)} bytes is not 2 + count × {size}")
    out: list[ThresholdCredit] = []
    for i in range(note[1]):
        entry = note[2 + i * size : 2 + (i + 1) * size]
        try:
            credit = ThresholdCredit.from_bytes(entry[: blind_bls.CREDIT_BYTES])
        except (blind_bls.ThresholdCreditError, bls.BlsError) as error:
            raise PayInvalid(f"pay note credit {i}", error.message) from None
        if assigned:
            credit = with_assignment(credit, entry[blind_bls.CREDIT_BYTES :])
        out.append(credit)
    return tuple(out)


def wrap_pay(
    keys: Sequence[bytes], sequences: Sequence[int], target: int, credits: Sequence[ThresholdCredit]
) -> bytes:
    """The PAY body that gives `credits` to relay `target` (0 = the path's first relay):
    `sequences[j]` is the pay sequence relay j expects next (the caller advances relays
    0..target by one once it is sent)."""
    if not 0 <= target < len(keys) or len(sequences) != len(keys):
        raise PayInvalid("pay note", f"relay {target} of a {len(keys)}-relay path")
    payload = seal_layer(keys[target], PAY_DIRECTION, sequences[target], _note(credits))
    for j in reversed(range(target)):
        payload = seal_layer(keys[j], PAY_DIRECTION, sequences[j], bytes([_ONWARD]) + payload)
    if len(payload) > PAY_BYTES:
        raise PayInvalid("pay note", f"{len(payload)} bytes is over {PAY_BYTES}")
    return payload


@dataclass(frozen=True)
class Opened:
    """A relay's reading of a PAY body: its own credits, or the body to send on."""

    credits: tuple[ThresholdCredit, ...] = ()
    onward: bytes | None = None


def open_pay(key: bytes, sequence: int, payload: bytes, *, exit_relay: bool) -> Opened:
    """Relay's side: open its layer at `sequence` (PayInvalid when it does not open or its
    inside breaks the grammar; PayMisdirected for an onward note at the exit)."""
    try:
        inner = open_layer(key, PAY_DIRECTION, sequence, payload)
    except LayerInvalid:
        raise PayInvalid("pay note", f"does not open at pay sequence {sequence}") from None
    if not inner or inner[0] not in (_MINE, _ONWARD, _MINE_ASSIGNED):
        raise PayInvalid("pay note", "neither for this relay nor onward")
    if inner[0] == _ONWARD:
        if exit_relay:
            raise PayMisdirected("pay note", "onward from the path's exit")
        if len(inner) <= 1 + TAG_BYTES:
            raise PayInvalid("pay note", "an onward note with nothing inside")
        return Opened(onward=inner[1:])
    return Opened(credits=_credits(inner))


def credits_due(delivered: int, rate: int, paid: int) -> int:
    """Credits a relay is owed for `delivered` clove bytes at `rate` bytes a credit, less
    `paid`: whole credits only (the remainder is never paid, so a relay is never paid for a
    byte that did not arrive), never negative."""
    if rate <= 0:
        raise ValueError("a relay rate is at least 1 byte per credit")
    return max(0, delivered // rate - paid)
