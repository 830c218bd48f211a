"""`sample`'s descending order is exactly `np.argsort(-x, kind="stable")` (the token a seed
picks depends on it bit for bit: the gateway samples, a verifier replays the seed), computed
with an unstable sort and ties put back in index order: many ties, signed zeros, infinities,
NaNs, one and two values; and a seeded sampler picks the same tokens as with the stable sort."""

from __future__ import annotations

import numpy as np
import pytest

from node.client import sampling
from node.client.sampling import SamplingConfig, descending_order, sample

pytestmark = pytest.mark.unit


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(41)
    cases = [np.array([1.0]), np.array([2.0, 2.0]), np.array([0.0, -0.0, 0.0, -0.0])]
    for trial in range(200):
        n = int(rng.integers(1, 2000))
        x = rng.standard_normal(n)
        if trial % 2 == 0:
            x = np.round(x, 1)  # runs of ties everywhere
        if trial % 5 == 0:
            x[rng.integers(0, n, n // 4 + 1)] = 0.0
            x[rng.integers(0, n, n // 8 + 1)] = -0.0
        if trial % 7 == 0:
            x[rng.integers(0, n, 3)] = np.inf
            x[rng.integers(0, n, 3)] = -np.inf
        if trial % 11 == 0:
            x[rng.integers(0, n, 3)] = np.nan
        cases.append(x)
    logits = (rng.standard_normal(49152) * 3).astype(np.float32).astype(np.float64)
    cases.append(logits)
    return cases


def test_descending_order_is_the_stable_argsort_of_the_negated_values() -> None:
    for values in _cases():
        assert np.array_equal(descending_order(values), np.argsort(-values, kind="stable"))


def test_a_seeded_sampler_picks_the_tokens_the_stable_sort_picked(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    rows = [np.round(rng.standard_normal(5000) * 4, 2).astype(np.float32) for _ in range(40)]
    config = SamplingConfig(temperature=0.8, top_p=0.95, seed=123)
    new = config.rng()
    fast = [sample(row, config, new) for row in rows]
    monkeypatch.setattr(
        sampling, "descending_order", lambda values: np.argsort(-values, kind="stable")
    )
    old = config.rng()
    assert fast == [sample(row, config, old) for row in rows]
