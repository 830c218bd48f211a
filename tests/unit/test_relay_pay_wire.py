"""The wire of relay pay (protocol/relay_pay.py, issue 43): a PAY note opens only for the relay
it is for, under its hop key at its pay sequence, and passes the relays before it as a sealed
blob; a replayed, altered, reordered or misdirected note is refused by name; acknowledgements
and notes parse strictly; the rate's arithmetic pays whole credits for cloves that arrived."""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.overlay import PAY_BYTES, Cell, CellKind, CellMalformed, MessageKind
from protocol.relay_pay import (
    MAX_PAY_CREDITS,
    AckInvalid,
    Acks,
    PayInvalid,
    PayMisdirected,
    credits_due,
    open_pay,
    wrap_pay,
)
from tests.credit_fakes import fake_credits

pytestmark = pytest.mark.unit


def walk(keys: list[bytes], sequences: list[int], body: bytes) -> tuple[int, tuple]:
    """Relay by relay as the relays do: (the relay that kept the note, its credits)."""
    for j, key in enumerate(keys):
        opened = open_pay(key, sequences[j], body, exit_relay=j == len(keys) - 1)
        if opened.onward is None:
            return j, opened.credits
        body = opened.onward
    raise AssertionError("no relay kept the note")


@pytest.mark.parametrize("length", [1, 2, 3, 5])
def test_a_note_is_kept_by_its_relay_and_opens_for_no_other(length: int) -> None:
    keys = [os.urandom(32) for _ in range(length)]
    for target in range(length):
        credits = fake_credits(3, first=10 * target)
        body = wrap_pay(keys, [0] * length, target, credits)
        assert walk(keys, [0] * length, body) == (target, tuple(credits))
        # no other relay's key opens the first layer; the relays before see only onward bytes
        for j in range(length):
            if j != 0:
                with pytest.raises(PayInvalid):
                    open_pay(keys[j], 0, body, exit_relay=False)
        if target > 0:
            onward = open_pay(keys[0], 0, body, exit_relay=False).onward
            assert onward is not None
            assert not any(c.nonce in onward for c in credits)  # sealed: no credit readable


def test_a_replayed_altered_or_reordered_note_is_refused_by_name() -> None:
    keys = [os.urandom(32), os.urandom(32)]
    first = wrap_pay(keys, [0, 0], 1, fake_credits(1))
    second = wrap_pay(keys, [1, 1], 1, fake_credits(1, first=5))
    assert walk(keys, [0, 0], first)[0] == 1
    # the relay's pay sequence moved on: the same cell again does not open (no pay twice)
    with pytest.raises(PayInvalid, match="pay sequence 1"):
        open_pay(keys[0], 1, first, exit_relay=False)
    with pytest.raises(PayInvalid):  # the second before the first: out of order
        open_pay(keys[0], 0, second, exit_relay=False)
    altered = bytes([first[0] ^ 1]) + first[1:]
    with pytest.raises(PayInvalid) as caught:
        open_pay(keys[0], 0, altered, exit_relay=False)
    assert caught.value.code == "pay_invalid"
    # a note sent onward from the exit has nowhere to go
    onward_at_exit = wrap_pay(keys, [0, 0], 1, fake_credits(1))
    with pytest.raises(PayMisdirected) as misdirected:
        open_pay(keys[0], 0, onward_at_exit, exit_relay=True)
    assert misdirected.value.code == "pay_misdirected"


def test_notes_and_pay_cells_are_strict() -> None:
    keys = [os.urandom(32) for _ in range(5)]
    with pytest.raises(PayInvalid, match="0 credits"):
        wrap_pay(keys, [0] * 5, 4, [])
    with pytest.raises(PayInvalid, match=f"{MAX_PAY_CREDITS + 1} credits"):
        wrap_pay(keys, [0] * 5, 4, fake_credits(MAX_PAY_CREDITS + 1))
    with pytest.raises(PayInvalid):
        wrap_pay(keys, [0] * 5, 5, fake_credits(1))
    biggest = wrap_pay(keys, [0] * 5, 4, fake_credits(MAX_PAY_CREDITS))
    assert len(biggest) <= PAY_BYTES
    assert Cell.from_bytes(Cell(CellKind.PAY, 3, biggest).to_bytes()).body == biggest
    for body in (b"", b"\0" * 16, b"\0" * (PAY_BYTES + 1)):
        with pytest.raises(CellMalformed) as caught:
            Cell.from_bytes(Cell(CellKind.PAY, 3, body).to_bytes())
        assert caught.value.code == "cell_malformed"
    # a note whose inside is not a list of credits, sealed properly: refused by name
    from protocol.overlay import seal_layer
    from protocol.relay_pay import PAY_DIRECTION

    for inner in (b"", b"\x09", b"\x01\x01" + b"\0" * 10, b"\x01\x01" + b"\xff" * 88):
        sealed = seal_layer(keys[0], PAY_DIRECTION, 0, inner)
        with pytest.raises(PayInvalid):
            open_pay(keys[0], 0, sealed, exit_relay=True)


def test_acknowledgements_are_strict() -> None:
    acks = Acks((3, 0, 7, 2**64 - 1))
    assert Acks.from_bytes(acks.to_bytes()) == acks
    assert MessageKind.ACK == 4
    for bad in (b"", b"\x01" + b"\0" * 8, b"\x11" + b"\0" * 8 * 17, acks.to_bytes()[:-1]):
        with pytest.raises(AckInvalid) as caught:
            Acks.from_bytes(bad)
        assert caught.value.code == "ack_invalid"


@given(st.binary(max_size=200))
def test_any_bytes_are_an_acknowledgement_or_refused(data: bytes) -> None:
    with contextlib.suppress(AckInvalid):
        acks = Acks.from_bytes(data)
        assert acks.to_bytes() == data  # what parses is exactly its own encoding


def test_whole_credits_for_cloves_that_arrived_and_never_twice() -> None:
    assert credits_due(0, 4, 0) == 0
    assert credits_due(3, 4, 0) == 0  # the remainder is never paid
    assert credits_due(9, 4, 0) == 2
    assert credits_due(9, 4, 2) == 0  # paid already
    assert credits_due(13, 4, 2) == 1
    assert credits_due(5, 4, 3) == 0  # never negative
    with pytest.raises(ValueError):
        credits_due(5, 0, 0)
