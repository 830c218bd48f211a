"""A verifier's measurement of the nodes' decode speed (issue 44), reported in its vote extension.

The verifier already times nothing it does not ask: each sampled challenge (sampled.py) is an
ordinary user's completion of `sampled_tokens` tokens through one circuit (one node per
shard), and the asker times the completion request itself (`Asked.seconds`: from sending it to
reading the whole answer, the deposit before it not counted) on its own monotonic clock. Then

    speed = ⌊checked tokens / seconds⌋ tokens/s, clamped to [1, 100 000] (protocol/speeds.py)

where `checked tokens` are the positions the replay checked (`SampledCheck.observed`: the
tokens it could read, plus the stop it sampled), counted only when

- the answer scored clean (credibility 10^6): a circuit that answered fast by not computing
  must not be credited its speed;
- at least `MIN_TIMED_TOKENS` positions were checked: a two-token answer times mostly the
  prompt's prefill and the hops, not decoding.

The circuit's speed goes to every node of it: a pipeline is no faster than any of its stages,
so it is a lower bound on each node's own speed (the prompt's prefill and the network's hops
are in it too), and no node can raise it but by answering faster. Over an epoch a node keeps
the best speed of its clean circuits (`EpochSpeeds.note`): a fast node seen beside a slow one
is credited its faster circuit when it served one, as attribution.py clears a node by its best
circuit. The speeds of the nodes the epoch's report scores go into `reputation_scores.json`
(report.py) and from there into the validator's vote extension; the committee keeps the lower
median over verifiers (abci_app/speeds.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.speeds import MAX_SPEED, MIN_SPEED

MIN_TIMED_TOKENS = 8  # checked positions an answer needs for its time to count


def decode_speed(tokens: int, seconds: float) -> int:
    """Tokens/s of `tokens` decoded in `seconds`, floored and clamped to the chain's bounds."""
    if seconds <= 0:
        return MAX_SPEED
    return max(MIN_SPEED, min(MAX_SPEED, int(tokens / seconds)))


@dataclass
class EpochSpeeds:
    """The best measured speed of each node over one epoch's clean sampled challenges."""

    best: dict[str, int] = field(default_factory=dict)

    def note(self, nodes: Sequence[str], tokens: int, seconds: float, clean: bool) -> int | None:
        """Credit one timed answer of the circuit `nodes`; its speed, or None when it does not
        count (not clean, or fewer than MIN_TIMED_TOKENS checked positions)."""
        if not clean or tokens < MIN_TIMED_TOKENS or not nodes:
            return None
        speed = decode_speed(tokens, seconds)
        for node in nodes:
            self.best[node] = max(self.best.get(node, 0), speed)
        return speed

    def of(self, scored: Mapping[str, int]) -> dict[str, int]:
        """The speeds to report beside `scored` (the report's scores): its nodes only."""
        return {node: speed for node, speed in sorted(self.best.items()) if node in scored}
