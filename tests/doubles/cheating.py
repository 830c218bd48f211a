"""Cheater modes of a compute node, for tests of the verification path only.

A cheating node still answers every protocol request exactly like an honest one (same /info,
same frames); only the numbers it computes are wrong. Nothing in the product reaches this
module: a cheating node is `python -m tests.doubles.cheating_node ... --cheat MODE`
(tests/doubles/cheating_node.py), which wraps the real shard backend before the real `serve()`.

Modes (`parse_mode`):

    substitute-skip:N      a cheaper substitute: only the shard's first layer and every N-th
                           layer run (same weights, ~1 - 1/N of the compute saved)
    substitute-perturb:R   a perturbed model: Gaussian noise of R x std on every Linear
                           weight (fp32 shards only; quantized weights refuse)
    noise:R:K              noise of R x the position's RMS on the outputs of every position
                           p with p % K == 0 (a node that guesses some steps)
    noise:R:K:withhold     noise:R:K, and the node hands a spot-check ticket only to the
                           verifier assigned to the check (`protocol.spotcheck.assign_verifier`):
                           every other verifier of the epoch's set, asking to re-judge a peer's
                           finding, is refused (`withholding`, applied by cheating_node.py)
    no-tickets             computes honestly; `answers_tickets` is false (no ticket endpoint
                           consults it yet, so it still answers spot-check tickets)
    silent                 computes honestly; its operator's agent commits nothing
                           (tests/doubles/cheating_join.py starts it without --commit-dir)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.errors import ConfigError
from protocol.spotcheck import assign_verifier
from protocol.tickets import TicketRequest

log = logging.getLogger(__name__)

KINDS = ("substitute-skip", "substitute-perturb", "noise", "no-tickets", "silent")
_NUMBER = r"(?:0|[1-9][0-9]{0,5})(?:\.[0-9]{1,6})?"
_PATTERNS = {
    "substitute-skip": re.compile(r"substitute-skip:([2-9]|[1-9][0-9])\Z"),
    "substitute-perturb": re.compile(rf"substitute-perturb:({_NUMBER})\Z"),
    "noise": re.compile(rf"noise:({_NUMBER}):([1-9][0-9]{{0,3}})(:withhold)?\Z"),
    "no-tickets": re.compile(r"no-tickets\Z"),
    "silent": re.compile(r"silent\Z"),
}


@dataclass(frozen=True, slots=True)
class CheatMode:
    kind: str  # one of KINDS
    every: int = 0  # substitute-skip: keep every N-th layer; noise: every K-th position
    relative: float = 0.0  # substitute-perturb / noise: noise scale
    withhold: bool = False  # noise: tickets only for the assigned verifier

    def __str__(self) -> str:
        if self.kind == "substitute-skip":
            return f"{self.kind}:{self.every}"
        if self.kind == "substitute-perturb":
            return f"{self.kind}:{self.relative:g}"
        if self.kind == "noise":
            withhold = ":withhold" if self.withhold else ""
            return f"{self.kind}:{self.relative:g}:{self.every}{withhold}"
        return self.kind


def parse_mode(text: str) -> CheatMode:
    """`text` → CheatMode, or ConfigError naming the grammar."""
    for kind, pattern in _PATTERNS.items():
        match = pattern.match(text)
        if match is None:
            continue
        if kind == "substitute-skip":
            return CheatMode(kind, every=int(match[1]))
        if kind == "substitute-perturb":
            return CheatMode(kind, relative=float(match[1]))
        if kind == "noise":
            return CheatMode(
                kind, every=int(match[2]), relative=float(match[1]), withhold=bool(match[3])
            )
        return CheatMode(kind)
    raise ConfigError(
        f"unknown cheat mode {text[:60]!r}",
        hint="substitute-skip:N, substitute-perturb:R, noise:R:K[:withhold], no-tickets or silent",
    )


Authorize = Callable[..., None]


def withholding(authorize: Authorize) -> Authorize:
    """`node.server.tickets.authorize_selection` of a node that withholds its tickets: what
    `authorize` refuses stays refused, and of the epoch's verifiers only the one assigned to the
    triple (`assign_verifier(request.seed, request.triple, verifiers)`) gets a ticket; the
    others (re-judging a peer's finding) get TicketRefusedError."""
    from node.server.tickets import TicketRefusedError

    def authorize_assigned_only(
        request: TicketRequest, seeds: Any, verifiers: Any, rate_ppm: int, **kwargs: Any
    ) -> None:
        authorize(request, seeds, verifiers, rate_ppm, **kwargs)
        if request.verifier != assign_verifier(request.seed, request.triple, verifiers):
            log.warning("ticket withheld from verifier %s", request.verifier[:12])
            raise TicketRefusedError("the requester is not the verifier assigned to this check")

    return authorize_assigned_only


class CheatingBackend:
    """A ShardBackend (node/server/backend.py) that computes wrongly in one of the modes."""

    def __init__(self, backend: Any, mode: CheatMode, *, seed: int = 0) -> None:
        self._backend = backend
        self.mode = mode
        self.shard_id = backend.shard_id
        self.hidden_size = backend.hidden_size
        self.layers = backend.layers
        self.model_id = backend.model_id
        self.model_hash = backend.model_hash
        self.quant = backend.quant
        self.device = backend.device
        self.answers_tickets = mode.kind != "no-tickets"
        self._rng = np.random.default_rng(seed)

    def new_cache(self) -> Any:
        return self._backend.new_cache()

    def cache_bytes(self, cache: Any) -> int:
        return int(self._backend.cache_bytes(cache))

    def cache_bytes_per_position(self) -> int:
        return int(self._backend.cache_bytes_per_position())

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        out = self._backend.forward(hidden, positions, cache)
        if self.mode.kind != "noise":
            return out
        out = np.array(out, dtype=np.float32, copy=True)
        for index, position in enumerate(positions.tolist()):
            self._noisy(out, 0, index, position)
        return out

    def forward_batch(
        self, hidden: np.ndarray, positions: np.ndarray, caches: list[Any]
    ) -> np.ndarray:
        """The batched decode step (node/server/batcher.py) cheats exactly like `forward`."""
        out = self._backend.forward_batch(hidden, positions, caches)
        if self.mode.kind != "noise":
            return out
        out = np.array(out, dtype=np.float32, copy=True)
        for row, position in enumerate(positions.tolist()):
            self._noisy(out, row, 0, position)
        return out

    def _noisy(self, out: np.ndarray, row: int, index: int, position: int) -> None:
        if position % self.mode.every != 0:
            return
        values = out[row, index]
        rms = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
        noise = self._rng.standard_normal(values.shape).astype(np.float32)
        out[row, index] = values + noise * np.float32(self.mode.relative * rms)


def _skip_layers(model: Any, every: int) -> None:
    """Keep the shard's first layer and every `every`-th one (ShardModel internals)."""
    modules = getattr(model, "_modules", None)
    types = getattr(model, "_types", None)
    if not isinstance(modules, list) or not isinstance(types, list):
        raise ConfigError("substitute-skip needs a node.model ShardModel backend")
    keep = [i for i in range(len(modules)) if i % every == 0]
    model._modules = [modules[i] for i in keep]
    model._types = [types[i] for i in keep]


def _perturb(model: Any, relative: float, seed: int) -> None:
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        for module in model.module.modules():
            if isinstance(module, nn.Linear):
                weight = module.weight
                if type(weight) is not torch.nn.Parameter and type(weight) is not torch.Tensor:
                    raise ConfigError("substitute-perturb needs an unquantized (fp32) shard")
                noise = torch.randn(weight.shape, generator=generator).to(weight.dtype)
                weight.add_(noise * (relative * float(weight.float().std())))


def wrap(backend: Any, mode: CheatMode, *, seed: int = 0) -> CheatingBackend:
    """The dishonest backend (changes `backend`'s model in place for the substitute modes)."""
    if mode.kind == "substitute-skip":
        _skip_layers(backend.model, mode.every)
    elif mode.kind == "substitute-perturb":
        _perturb(backend.model, mode.relative, seed)
    return CheatingBackend(backend, mode, seed=seed)
