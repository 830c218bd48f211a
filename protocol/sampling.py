"""Choosing the next token from logits: greedy by default, or temperature + nucleus (top-p).

One sampler for everyone who must agree on a token: the client's loop, the first node's ring
loop (node/server/ring.py) and the verifiers' replay (node/verifier/sampled.py).

Sampling is deterministic for a given seed: the random source is a numpy Generator owned by the
caller, and the arithmetic runs in float64 on a sorted copy (stable order for ties).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocol.errors import UsageError


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    seed: int | None = None

    def validate(self) -> SamplingConfig:
        if not 0.0 <= self.temperature <= 10.0:
            raise UsageError(f"temperature must be in [0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def sample(logits: np.ndarray, config: SamplingConfig, rng: np.random.Generator) -> int:
    """One token id from `logits` [V]."""
    if config.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / config.temperature
    order = descending_order(scaled)
    sorted_logits = scaled[order]
    probs = np.exp(sorted_logits - sorted_logits[0])
    probs /= probs.sum()
    if config.top_p < 1.0:
        cumulative = np.cumsum(probs)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(cumulative, config.top_p) + 1)
        probs = probs[:keep] / probs[:keep].sum()
    choice = int(rng.choice(len(probs), p=probs))
    return int(order[choice])


def descending_order(values: np.ndarray) -> np.ndarray:
    """`np.argsort(-values, kind="stable")` (ties in index order), in ~60 % of its CPU on a
    SmolLM2 vocabulary (3.0 ms, not 4.8, a sampled token on the gateway and again in a
    verifier's replay): numpy's unstable argsort (SIMD on this CPU), then each run of equal
    values put back in index order. NaNs (which sort last, unordered): the stable argsort."""
    keys = -values
    order = np.argsort(keys)
    ranked = keys[order]
    if ranked.size and np.isnan(ranked[-1]):
        return np.argsort(keys, kind="stable")
    same = ranked[1:] == ranked[:-1]  # -0.0 == 0.0, as the stable sort also has them
    if same.any():
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same, [0])).astype(np.int8)))
        for start, stop in zip(edges[::2], edges[1::2], strict=True):
            order[start : stop + 1].sort()  # positions start..stop hold one value
    return order
