"""PlanetServe reputation (sec. 3.4) in fixed point — the exact integer rules.

One home for the recurrence: the committee applies it to the agreed credibilities
(`abci_app/epochs.py`) and the verifier's calibration predicts with it what its scores do to a
node (`node/verifier/calibrate.py`), so both compute the same values bit for bit.

All values are integers at scale `SCALE = 10**6` (1.0 ↔ 1_000_000): credibility C(T) ∈ [0, SCALE]
(the average normalised perplexity 1/PPL of a node's challenge answers in epoch T) and
reputation R(T) ∈ [0, SCALE].

Per epoch, for each node with an agreed C(T):

1. The sliding window holds the last W values of C, *including* C(T) (oldest dropped first).
2. c = number of values in the window with C < τ (strictly below: "abnormal").
3. Punishment applies when c/W > γ, evaluated exactly as `c · γ_den > W · γ_num`
   (γ = γ_num/γ_den; with W = 5, γ = 1/5 that is c ≥ 2).
4. Normal:     R(T) = ⌊(α·R(T−1) + β·C(T)) / SCALE⌋        (α = 0.4, β = 0.6 at SCALE)
   Punished:   R(T) = α·R(T−1) + (W+1)/(W + c/γ + 2) · C(T), computed as ONE exact fraction and
               floored once:  D = (W+2)·γ_num + c·γ_den,
               R(T) = ⌊(α·R(T−1)·D + SCALE·(W+1)·γ_num·C(T)) / (SCALE·D)⌋
5. A node is untrusted while R < untrusted threshold (0.4 → 400_000).

Floors only (no round-half rules), all operands non-negative, so every implementation that
follows these lines agrees bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SCALE = 1_000_000


@dataclass(frozen=True, slots=True)
class ReputationParams:
    """PlanetServe defaults; every field an integer (fractions as numerator/denominator)."""

    alpha: int = 400_000  # weight of R(T-1), at SCALE
    beta: int = 600_000  # weight of C(T), at SCALE
    window: int = 5  # W, epochs
    gamma_num: int = 1  # γ = 1/5
    gamma_den: int = 5
    tau: int = 300_000  # abnormal when C < τ (at SCALE); configurable in genesis
    untrusted_below: int = 400_000  # untrusted when R < this (at SCALE)
    initial: int = 500_000  # R(0) of a newly registered node (at SCALE)

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"reputation.{name}: expected a non-negative integer")
        if self.alpha + self.beta != SCALE:
            raise ValueError("reputation: alpha + beta must equal SCALE")
        if self.window < 1 or self.gamma_num < 1 or self.gamma_den < 1:
            raise ValueError("reputation: window and gamma must be positive")
        for name in ("tau", "untrusted_below", "initial"):
            if getattr(self, name) > SCALE:
                raise ValueError(f"reputation.{name}: must be ≤ {SCALE}")


def _check(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SCALE:
        raise ValueError(f"{name}: expected an integer in [0, {SCALE}], got {value!r}")
    return value


def abnormal_count(window: tuple[int, ...] | list[int], params: ReputationParams) -> int:
    """c: how many window values are strictly below τ."""
    return sum(1 for value in window if value < params.tau)


def punished(count: int, params: ReputationParams) -> bool:
    """c/W > γ, exactly: c·γ_den > W·γ_num."""
    return count * params.gamma_den > params.window * params.gamma_num


def update(
    previous: int, window: tuple[int, ...], credibility: int, params: ReputationParams
) -> tuple[int, tuple[int, ...]]:
    """One epoch's update: returns (R(T), the new window)."""
    _check(previous, "R(T-1)")
    _check(credibility, "C(T)")
    new_window = (*window, credibility)[-params.window :]
    count = abnormal_count(new_window, params)
    if not punished(count, params):
        return (params.alpha * previous + params.beta * credibility) // SCALE, new_window
    denominator = (params.window + 2) * params.gamma_num + count * params.gamma_den
    numerator = (
        params.alpha * previous * denominator
        + SCALE * (params.window + 1) * params.gamma_num * credibility
    )
    return numerator // (SCALE * denominator), new_window


def is_untrusted(reputation: int, params: ReputationParams) -> bool:
    return reputation < params.untrusted_below


def trajectory(
    credibilities: Iterable[int],
    params: ReputationParams = ReputationParams(),
    start: int | None = None,
    window: tuple[int, ...] = (),
) -> list[int]:
    """R after each epoch of `credibilities`, from R(0) = `start` (default: a new node's
    `initial`) and the given window."""
    reputation = params.initial if start is None else start
    out = []
    for credibility in credibilities:
        reputation, window = update(reputation, window, credibility, params)
        out.append(reputation)
    return out


def epochs_until_untrusted(
    trace: list[int], params: ReputationParams = ReputationParams()
) -> int | None:
    """1-based epoch at which R first drops below the threshold (None: never)."""
    for index, reputation in enumerate(trace):
        if is_untrusted(reputation, params):
            return index + 1
    return None
