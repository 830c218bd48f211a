"""A credit as clients and nodes pass it around: the RSA form (`protocol.credits.Credit`, being
retired) or the threshold-BLS form (`protocol.blind_bls.ThresholdCredit`, the default).

    on the wire and in files   RSA: [epoch, prepared hex, [[validator, sig hex], ...]]
                               threshold: 176 hex chars (period ‖ nonce ‖ σ)
    spent id                   sha256 of the nonce, either form (the chain's `cspent/` key)
    window                     RSA: epochs e … e + lifetime; threshold: from its period's start
                               to its issue epoch (the epoch of the period's last block) +
                               lifetime (`protocol.threshold_mint`)

Integers only; the window functions mirror the chain's rules (abci_app/credits.py,
abci_app/threshold_credits.py) on a `ChainClock` read from `/credit_keys`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from protocol.blind_bls import ThresholdCredit
from protocol.committee.credits import parse_credit
from protocol.committee.threshold_credits import parse_threshold_credit
from protocol.credit_periods import KeySchedule
from protocol.credits import ChainClock, Credit, spent_id, takeable, window_end
from protocol.errors import ProtocolError

PaidCredit = Credit | ThresholdCredit


def credit_json(credit: PaidCredit) -> Any:
    if isinstance(credit, ThresholdCredit):
        return credit.to_bytes().hex()
    return credit.to_json()


def parse_paid_credit(item: Any, where: str = "credit") -> PaidCredit:
    """Either form from a peer or a file (TxDecodeError, by name, otherwise)."""
    if isinstance(item, str):
        return parse_threshold_credit(item, where)
    return parse_credit(item, where)


def paid_spent_id(credit: PaidCredit) -> str:
    if isinstance(credit, ThresholdCredit):
        return hashlib.sha256(credit.nonce).hexdigest()
    return spent_id(credit.prepared)


def _schedule(clock: ChainClock) -> KeySchedule:
    if clock.period_blocks < 1:
        raise ProtocolError("the committee states no key_period_blocks: it takes no such credit")
    return KeySchedule(clock.period_blocks, 1)


def expiry_epoch(credit: PaidCredit, clock: ChainClock) -> int:
    """The epoch whose + lifetime ends the credit's window (its own epoch, or its period's
    issue epoch)."""
    if isinstance(credit, ThresholdCredit):
        end = _schedule(clock).period_end(credit.period)
        return max(1, (end - 1) // clock.epoch_length + 1)
    return credit.epoch


def started(credit: PaidCredit, clock: ChainClock) -> bool:
    """Whether the chain's next block is in the credit's window or after its start."""
    if isinstance(credit, ThresholdCredit):
        first = _schedule(clock).period_start(credit.period)
        return clock.height + 1 >= first
    return credit.epoch <= clock.epoch


def paid_redeemable(credit: PaidCredit, clock: ChainClock) -> bool:
    """The chain's window, in the epoch of the clock's next block."""
    return started(credit, clock) and clock.epoch <= expiry_epoch(credit, clock) + clock.lifetime


def paid_takeable(credit: PaidCredit, clock: ChainClock, margin_blocks: int) -> bool:
    """`protocol.credits.takeable` for either form."""
    if isinstance(credit, Credit):
        return takeable(credit.epoch, clock, margin_blocks)
    if not started(credit, clock):
        return False
    end = window_end(expiry_epoch(credit, clock), clock.lifetime, clock.epoch_length)
    return clock.height + margin_blocks <= end


def paid_window_end(credit: PaidCredit, clock: ChainClock) -> int:
    return window_end(expiry_epoch(credit, clock), clock.lifetime, clock.epoch_length)
