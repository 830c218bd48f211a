"""Dishonest circuits, for calibration, tests and benchmarks only.

Nothing in the node, gateway or CLI imports this module and no configuration reaches it: a cheat
is built only by calling one of these functions with an explicit `confirm=CHEAT` argument, so it
cannot be switched on by accident. Each one is a substitute a lazy or greedy node could honestly
run with what this repository has (no other model can be downloaded here):

    skip_layers(shard, every, confirm=CHEAT)        same weights, some decoder layers skipped
    drop_layer(shard, index, confirm=CHEAT)         same weights, one decoder layer skipped
    perturb_weights_(shard, relative, seed, confirm=CHEAT)   noise on every Linear weight
    NoisyShard(shard, relative, every, seed, confirm=CHEAT)  noise on the outputs of some steps
    truncated circuits need no helper: run the first shards and skip the last ones.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

CHEAT = "i-am-building-a-dishonest-circuit"


def _confirm(confirm: str) -> None:
    if confirm != CHEAT:
        raise ValueError("cheat helpers need confirm=cheats.CHEAT")


def skip_layers(shard: Any, every: int, *, confirm: str) -> Any:
    """A copy of `shard` (sharing weights) that runs only its first layer and then every
    `every`-th one, skipping the rest (compute saved ≈ 1 - 1/every). The first layer always
    runs, because it sizes the causal mask from its cache."""
    _confirm(confirm)
    if every < 2:
        raise ValueError("every must be at least 2")
    cheat = copy.copy(shard)
    keep = [i for i in range(len(shard._modules)) if i % every == 0]
    cheat._modules = [shard._modules[i] for i in keep]
    cheat._types = [shard._types[i] for i in keep]
    return cheat


def drop_layer(shard: Any, index: int, *, confirm: str) -> Any:
    """A copy of `shard` (sharing weights) without its `index`-th layer (not the first)."""
    _confirm(confirm)
    if not 0 < index < len(shard._modules):
        raise ValueError("index must name a layer of the shard other than its first")
    cheat = copy.copy(shard)
    cheat._modules = [m for i, m in enumerate(shard._modules) if i != index]
    cheat._types = [t for i, t in enumerate(shard._types) if i != index]
    return cheat


@torch.inference_mode()
def perturb_weights_(shard: Any, relative: float, seed: int, *, confirm: str) -> Any:
    """Add Gaussian noise of `relative` x each Linear weight's std, in place; returns `shard`."""
    _confirm(confirm)
    generator = torch.Generator().manual_seed(seed)
    for module in shard.module.modules():
        if isinstance(module, nn.Linear):
            weight = module.weight
            noise = torch.randn(weight.shape, generator=generator).to(weight.device, weight.dtype)
            weight.add_(noise * (relative * float(weight.float().std())))
    return shard


class NoisyShard:
    """Wraps a shard; on positions p with p % every == 0 adds Gaussian noise of `relative` x the
    output's per-position RMS (a node that skips work on some steps and fills in a guess)."""

    def __init__(self, shard: Any, relative: float, every: int, seed: int, *, confirm: str) -> None:
        _confirm(confirm)
        self._shard = shard
        self._relative = relative
        self._every = every
        self._generator = torch.Generator().manual_seed(seed)
        self.layers = shard.layers
        self.hidden_size = shard.hidden_size
        self.quant = shard.quant

    def new_cache(self) -> Any:
        return self._shard.new_cache()

    def cache_bytes_per_position(self) -> int:
        return int(self._shard.cache_bytes_per_position())

    def __getattr__(self, name: str) -> Any:
        # everything else a ShardModel offers (cache accounting, config) comes from the shard
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._shard, name)

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self._shard.forward(hidden, positions, cache).clone()
        for index, position in enumerate(positions.tolist()):
            self._noisy(out, 0, index, position)
        return out

    @torch.inference_mode()
    def forward_batch(
        self, hidden: torch.Tensor, positions: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        """Batched decode steps (node/server/batcher.py) are as noisy as single ones."""
        out = self._shard.forward_batch(hidden, positions, caches).clone()
        for row, position in enumerate(positions.tolist()):
            self._noisy(out, row, 0, position)
        return out

    def _noisy(self, out: torch.Tensor, row: int, index: int, position: int) -> None:
        if position % self._every == 0:
            values = out[row, index]
            rms = float(values.pow(2).mean().sqrt())
            noise = torch.randn(values.shape, generator=self._generator)
            out[row, index] = values + noise * (self._relative * rms)

    __call__ = forward
