"""Measured decode speeds: the unit, the bounds and the median the verifiers and the committee
share (issue 44: placement and rebalancing weigh shards by measured speed).

A speed is an integer number of tokens per second: a node's own decode rate on its stage, as
a verifier measures it by timing the node alone (node/verifier/hop_probe.py: sessions at the
node as a last hop, outputs checked against its own recomputation) or, for a node it has not
probed, solves it from the whole circuits it timed on its sampled challenges
(node/verifier/speeds.py: a circuit's seconds per token are the sum of its nodes', the split
between shards taken from the probed nodes, else assumed even). It is never below the speed of
the node's fastest timed circuit (a circuit is no faster than any of its nodes), and a node
cannot raise it by saying anything: only by answering faster.

    is_speed(v)            an integer in [MIN_SPEED, MAX_SPEED]
    lower_median(values)   the committee's aggregate over distinct verifiers' latest reports

`lower_median` of n values is the ⌊(n−1)/2⌋-th smallest: one verifier among three or more can
never move it outside the range of the others' values (a liar at either end only picks which
honest value it is), and with two it can only lower it (a conservative speed places no node
where it is not needed). Integers only: the committee computes it in consensus.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIN_SPEED = 1  # tokens/s: a circuit slower than one token a second is reported as 1
MAX_SPEED = 100_000  # tokens/s of one stream; anything above is not a measurement


def is_speed(value: Any) -> bool:
    """Whether `value` is a speed the chain accepts (an int, not a bool, within the bounds)."""
    return type(value) is int and MIN_SPEED <= value <= MAX_SPEED


def lower_median(values: Iterable[int]) -> int:
    """The ⌊(n−1)/2⌋-th smallest of `values` (n ≥ 1); the order of the input never matters."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("lower_median of nothing")
    return ordered[(len(ordered) - 1) // 2]
