"""The committee's reputation recurrence, re-derived from docs/committee.md, for calibration.

The verifier must know what its credibility scores do to a node's reputation, but `node` never
imports `abci_app`; this is an independent implementation of the rules as the page states them
(integers at SCALE = 10**6, floors only):

    window = last W values of C including C(T); c = values < tau
    punished iff c * gamma_den > W * gamma_num
    normal:   R = (alpha * R_prev + beta * C) // SCALE
    punished: D = (W + 2) * gamma_num + c * gamma_den
              R = (alpha * R_prev * D + SCALE * (W + 1) * gamma_num * C) // (SCALE * D)
    untrusted while R < untrusted_below

The page's two worked examples are unit-tested against this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SCALE = 1_000_000


@dataclass(frozen=True, slots=True)
class Params:
    alpha: int = 400_000
    beta: int = 600_000
    window: int = 5
    gamma_num: int = 1
    gamma_den: int = 5
    tau: int = 300_000
    untrusted_below: int = 400_000
    initial: int = 500_000


def step(
    previous: int, window: tuple[int, ...], credibility: int, params: Params
) -> tuple[int, tuple[int, ...]]:
    """One applied epoch: (R(T), new window)."""
    if not 0 <= credibility <= SCALE or not 0 <= previous <= SCALE:
        raise ValueError("reputation values live in [0, SCALE]")
    window = (*window, credibility)[-params.window :]
    abnormal = sum(1 for value in window if value < params.tau)
    if abnormal * params.gamma_den <= params.window * params.gamma_num:
        return (params.alpha * previous + params.beta * credibility) // SCALE, window
    denominator = (params.window + 2) * params.gamma_num + abnormal * params.gamma_den
    numerator = (
        params.alpha * previous * denominator
        + SCALE * (params.window + 1) * params.gamma_num * credibility
    )
    return numerator // (SCALE * denominator), window


def trajectory(
    credibilities: Iterable[int],
    params: Params = Params(),
    start: int | None = None,
    window: tuple[int, ...] = (),
) -> list[int]:
    """R after each epoch, from R(0) = `start` (default: a new node's `initial`)."""
    reputation = params.initial if start is None else start
    out = []
    for credibility in credibilities:
        reputation, window = step(reputation, window, credibility, params)
        out.append(reputation)
    return out


def epochs_until_untrusted(trace: list[int], params: Params = Params()) -> int | None:
    """1-based epoch at which R first drops below the threshold (None: never)."""
    for index, reputation in enumerate(trace):
        if reputation < params.untrusted_below:
            return index + 1
    return None
