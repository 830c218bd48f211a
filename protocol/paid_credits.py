"""A credit as clients and nodes pass it around (`protocol.blind_bls.ThresholdCredit`).

    on the wire and in files   176 hex chars (period ‖ nonce ‖ σ)
    spent id                   sha256 of the nonce (the chain's `cspent/` key)
    HeldCredit                 a credit with its holder seed (the buyer's wallet only; never
                               sent): `assign` gives it to a node or relay
                               (protocol/committee/credit_holder.py)
    AssignedCredit             a credit with its holder's assignment to the party it was paid to
                               (what a `pay` carries, a node spools and its agent locks with)
    window                     from its period's start to its issue epoch (the epoch of the
                               period's last block) + lifetime (`protocol.threshold_mint`)

Integers only; the window functions mirror the chain's rules (abci_app/credits.py) on a
`ChainClock` read from `/credit_keys`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import assign, holder_of, parse_assignment
from protocol.committee.credits import parse_credit
from protocol.committee.grammar import TxDecodeError
from protocol.credit_periods import KeySchedule
from protocol.credits import ChainClock, window_end
from protocol.errors import ProtocolError

PaidCredit = ThresholdCredit


class CreditInvalidError(ProtocolError):
    """A credit whose σ does not verify under its key period's committee key."""

    code = "credit_invalid"


@dataclass(frozen=True)
class HeldCredit(ThresholdCredit):
    """A holder-bound credit as its buyer keeps it: with its holder seed (nonce = its key)."""

    seed: bytes = b""

    def assign(self, party: bytes) -> AssignedCredit:
        """The credit given to `party` (`credit_holder.node_party` / `relay_party`)."""
        return AssignedCredit(self.period, self.nonce, self.signature, assign(self.seed, party))


@dataclass(frozen=True)
class AssignedCredit(ThresholdCredit):
    """A credit with its holder's assignment (64 bytes) to the party it was given to."""

    assignment: bytes = b""


def held(credit: ThresholdCredit, seed: bytes) -> HeldCredit:
    """`credit` with its holder seed (ValueError unless the seed's key is the credit's nonce)."""
    if holder_of(seed) != credit.nonce:
        raise ValueError("the holder seed is not this credit's")
    return HeldCredit(credit.period, credit.nonce, credit.signature, seed)


def credit_json(credit: PaidCredit) -> Any:
    return credit.to_bytes().hex()


def assigned_json(credit: PaidCredit) -> Any:
    """A credit as a node spools it: its hex, with its assignment when it has one."""
    if isinstance(credit, AssignedCredit):
        return {"assignment": credit.assignment.hex(), "credit": credit_json(credit)}
    return credit_json(credit)


def parse_assigned(item: Any, where: str) -> PaidCredit:
    """`assigned_json` read back strictly (TxDecodeError naming `where`)."""
    if isinstance(item, dict):
        if set(item) != {"assignment", "credit"}:
            raise TxDecodeError(f"{where}: expected keys assignment, credit")
        credit = parse_paid_credit(item["credit"], where)
        return with_assignment(credit, parse_assignment(item["assignment"], where))
    return parse_paid_credit(item, where)


def with_assignment(credit: ThresholdCredit, assignment: bytes) -> AssignedCredit:
    return AssignedCredit(credit.period, credit.nonce, credit.signature, assignment)


def parse_paid_credit(item: Any, where: str = "credit") -> PaidCredit:
    """A credit from a peer or a file (TxDecodeError, by name, otherwise: an RSA credit of
    before, `[epoch, prepared, signatures]`, is named as such)."""
    if isinstance(item, list):
        raise TxDecodeError(f"{where}: an RSA credit, which the committee no longer redeems")
    return parse_credit(item, where)


def spent_id(credit: PaidCredit) -> str:
    return hashlib.sha256(credit.nonce).hexdigest()


def _schedule(clock: ChainClock) -> KeySchedule:
    if clock.period_blocks < 1:
        raise ProtocolError("the committee states no key_period_blocks: it takes no such credit")
    return KeySchedule(clock.period_blocks, 1)


def expiry_epoch(credit: PaidCredit, clock: ChainClock) -> int:
    """The epoch whose + lifetime ends the credit's window: its period's issue epoch."""
    end = _schedule(clock).period_end(credit.period)
    return max(1, (end - 1) // clock.epoch_length + 1)


def started(credit: PaidCredit, clock: ChainClock) -> bool:
    """Whether the chain's next block is in the credit's window or after its start."""
    first = _schedule(clock).period_start(credit.period)
    return clock.height + 1 >= first


def paid_redeemable(credit: PaidCredit, clock: ChainClock) -> bool:
    """The chain's window, in the epoch of the clock's next block."""
    return started(credit, clock) and clock.epoch <= expiry_epoch(credit, clock) + clock.lifetime


def paid_takeable(credit: PaidCredit, clock: ChainClock, margin_blocks: int) -> bool:
    """Whether a node takes the credit at `clock` with `margin_blocks` of redemption delay:
    its window has started and still holds `margin_blocks` after the latest committed block."""
    if not started(credit, clock):
        return False
    end = window_end(expiry_epoch(credit, clock), clock.lifetime, clock.epoch_length)
    return clock.height + margin_blocks <= end


def paid_window_end(credit: PaidCredit, clock: ChainClock) -> int:
    return window_end(expiry_epoch(credit, clock), clock.lifetime, clock.epoch_length)
