"""Measurements behind the calibration: honest and dishonest circuits on real shards.

Used by `python -m node.verifier.calibrate`, by the integration tests and by
`bench/verification.py`; all of them go through these functions so the numbers mean the same.

    circuit = load_circuit("int8")                       # head + 3 shards (prepared, cached)
    challenges = text_challenges(head, heldout_text(), count=12)
    hidden = run_prefill(shards, head.embed(ids))         # one prefill, final hidden [1, T, H]
    trace = serve_trace(shards, head.embed(ids), prompt_len)   # prefill + per-token decode,
                                                          # every shard's inputs and outputs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.verifier.scoring import Challenge

DEFAULT_PARTS = 3


@dataclass
class Circuit:
    name: str
    head: Any
    shards: list[Any]


def load_circuit(quant: str, parts: int = DEFAULT_PARTS, model: str = "default") -> Circuit:
    """The prepared model (cached under $PLANET_HOME; prepared on first use) as a circuit.
    `prepare` has just re-derived every hash of the directory (or written it), so the head and
    shards load without hashing their files a second time."""
    from node.model.head import ClientHead
    from node.model.prepare import prepare
    from node.model.shard import ShardModel

    path: Path = prepare(model=model, parts=parts, quant=quant, progress=lambda _m: None)
    head = ClientHead.load(path, device="cpu", verify=False)
    shards = [ShardModel.load(path, k, device="cpu", verify=False) for k in range(parts)]
    return Circuit(quant, head, shards)


def text_challenges(
    head: Any, text: str, *, count: int, prompt_tokens: int = 32, continuation_tokens: int = 100
) -> list[Challenge]:
    """`count` windows of natural text, evenly spread: prompt then known continuation."""
    ids = head.encode(text)
    length = prompt_tokens + continuation_tokens
    if len(ids) < length:
        raise ValueError(f"text has {len(ids)} tokens, a challenge needs {length}")
    last = len(ids) - length
    starts = [round(i * last / max(1, count - 1)) for i in range(count)]
    return [
        Challenge(tuple(ids[s : s + prompt_tokens]), tuple(ids[s + prompt_tokens : s + length]))
        for s in starts
    ]


@torch.inference_mode()
def run_prefill(shards: Sequence[Any], hidden: torch.Tensor) -> torch.Tensor:
    """Final hidden states [1, T, H] of one prefill through `shards` (fresh caches)."""
    positions = torch.arange(hidden.shape[1])
    for shard in shards:
        hidden = shard.forward(hidden, positions, shard.new_cache())
    return hidden


@dataclass
class ServeTrace:
    """What each shard received and produced while serving one sequence as a node does:
    one prefill of the prompt, then one position per forward."""

    inputs: list[torch.Tensor]  # per shard [1, T, H]
    outputs: list[torch.Tensor]  # per shard [1, T, H]


@torch.inference_mode()
def serve_trace(shards: Sequence[Any], hidden: torch.Tensor, prompt_len: int) -> ServeTrace:
    total = hidden.shape[1]
    caches = [shard.new_cache() for shard in shards]
    inputs: list[list[torch.Tensor]] = [[] for _ in shards]
    outputs: list[list[torch.Tensor]] = [[] for _ in shards]
    spans = [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, total)]
    for first, end in spans:
        h = hidden[:, first:end]
        positions = torch.arange(first, end)
        for index, shard in enumerate(shards):
            inputs[index].append(h)
            h = shard.forward(h, positions, caches[index])
            outputs[index].append(h)
    return ServeTrace(
        [torch.cat(parts, dim=1) for parts in inputs],
        [torch.cat(parts, dim=1) for parts in outputs],
    )


@torch.inference_mode()
def recompute(shard: Any, inputs: torch.Tensor, start: int = 0) -> torch.Tensor:
    """A verifier's recomputation of one shard over recorded inputs: one prefill."""
    positions = torch.arange(start, start + inputs.shape[1])
    return shard.forward(inputs, positions, shard.new_cache())
