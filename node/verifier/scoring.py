"""Teacher-forced credibility: how far a circuit's next-token distributions are from ours.

A challenge is a natural prompt plus a known continuation. The verifier sends prompt +
continuation to the circuit as ONE prefill, as any client would, and gets the circuit's final
hidden states (or logits) for every position; it runs its own reference model over the same ids
in ONE forward pass. At every position that predicts a continuation token it measures

    kl        KL(reference || circuit) over the whole vocabulary, nats
    nll_gap   -log p_circuit(token) - (-log p_reference(token)), nats
    top1      whether both put the same token first

and maps the mean KL to a credibility C in [0, SCALE] (SCALE = 10**6, the chain's fixed point)
with the calibrated piecewise-linear `CredibilityMap` (`calibration.json`). Scoring a fixed
sequence rather than a free-running answer is what separates a cheaper substitute: a substitute's
own answer can have a *lower* perplexity than the real model's (FINDINGS.md).

    ref = reference_logits(head, shards, challenge.ids)          # [T, V], one pass
    gap = compare_logits(challenge, head.all_logits(circuit_hidden), ref)
    c = credibility_map.credibility(gap)                         # int in [0, 10**6]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from protocol.errors import ProtocolError, UsageError
from protocol.frames.codecs import wire_values

SCALE = 1_000_000
MICRO = 1_000_000  # KL thresholds are stored in micro-nats (integers)


@dataclass(frozen=True, slots=True)
class Challenge:
    """A natural prompt and the continuation the circuit is scored on (token ids)."""

    prompt_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.continuation_ids:
            raise UsageError("a challenge needs a non-empty prompt and continuation")

    @property
    def ids(self) -> list[int]:
        return [*self.prompt_ids, *self.continuation_ids]

    @property
    def scored_rows(self) -> slice:
        """Rows of [T, V] logits that predict the continuation's tokens."""
        start = len(self.prompt_ids) - 1
        return slice(start, start + len(self.continuation_ids))


@dataclass(frozen=True, slots=True)
class Gap:
    """Per-token distance of a circuit from the reference on one challenge (means)."""

    tokens: int
    kl: float  # nats per token
    nll_gap: float  # nats per token
    top1: float  # fraction of positions whose argmax agrees

    def to_json(self) -> dict[str, float | int]:
        return {
            "tokens": self.tokens,
            "kl": round(self.kl, 6),
            "nll_gap": round(self.nll_gap, 6),
            "top1": round(self.top1, 4),
        }


@torch.inference_mode()
def reference_logits(
    head, shards: Sequence, ids: Sequence[int], wire_dtype: str = "float32"
) -> torch.Tensor:
    """[T, V] logits of `ids` through `shards` (fresh caches) and `head`: one forward pass.
    `wire_dtype` "float16": every boundary a circuit puts on the wire (the embeddings, each
    shard's output) rounded as a float16 frame carries it, so that the reference computes what
    an honest circuit on float16 frames computes (its sampled tokens replay exactly)."""

    def wire(hidden: torch.Tensor) -> torch.Tensor:
        if wire_dtype == "float32":
            return hidden
        return torch.from_numpy(wire_values(hidden.float().contiguous().numpy(), wire_dtype, "raw"))

    hidden = wire(head.embed(ids))
    positions = torch.arange(len(ids))
    for shard in shards:
        hidden = wire(shard.forward(hidden, positions, shard.new_cache()))
    return head.all_logits(hidden)


@torch.inference_mode()
def served_logits(
    head, shards: Sequence, prompt: Sequence[int], tokens: Sequence[int], wire_dtype: str
) -> torch.Tensor:
    """[T, V] logits over prompt + tokens on the schedule nodes serve an answer with (the
    prompt in one prefill, then one position per forward; T = prompt + tokens + 1 rows, the
    last after the final token), every boundary rounded as `wire_dtype` frames carry it. Rows
    before the prompt's last are zero. A sampled answer is replayed on these: the sampler's
    sorted draw flips on any change of the logits, and one prefill differs from the decode
    steps by rounding (on fp16 frames an honest circuit's 32-token answers mismatched 5.7 % of
    a prefill's draws, none of these; bench/wire_dtype.py)."""

    def wire(hidden: torch.Tensor) -> torch.Tensor:
        if wire_dtype == "float32":
            return hidden
        return torch.from_numpy(wire_values(hidden.float().contiguous().numpy(), wire_dtype, "raw"))

    caches = [shard.new_cache() for shard in shards]
    rows = []
    step, start = list(prompt), 0
    for token in [*tokens, None]:
        hidden = wire(head.embed(step))
        positions = torch.arange(start, start + len(step))
        for shard, cache in zip(shards, caches, strict=True):
            hidden = wire(shard.forward(hidden, positions, cache))
        rows.append(head.all_logits(hidden[:, -1:])[-1])
        start += len(step)
        step = [token]
    out = torch.zeros(len(prompt) - 1 + len(rows), rows[0].shape[-1])
    out[len(prompt) - 1 :] = torch.stack(rows)
    return out


@torch.inference_mode()
def compare_logits(
    challenge: Challenge, circuit_logits: torch.Tensor, reference: torch.Tensor
) -> Gap:
    """Distance of the circuit's [T, V] logits from the reference's on the continuation."""
    total = len(challenge.prompt_ids) + len(challenge.continuation_ids)
    for name, logits in (("circuit", circuit_logits), ("reference", reference)):
        if logits.dim() != 2 or logits.shape[0] != total:
            raise ProtocolError(f"{name} logits must be [{total}, V], got {list(logits.shape)}")
    if circuit_logits.shape != reference.shape:
        raise ProtocolError("circuit and reference logits differ in vocabulary size")
    rows = challenge.scored_rows
    circuit = torch.log_softmax(circuit_logits[rows].to(torch.float32), dim=-1)  # [N, V]
    ref = torch.log_softmax(reference[rows].to(torch.float32), dim=-1)
    if not bool(torch.isfinite(circuit).all()):
        # NaN/inf from a node: as far from the reference as anything can be.
        return Gap(len(challenge.continuation_ids), float("inf"), float("inf"), 0.0)
    targets = torch.tensor(challenge.continuation_ids, dtype=torch.long).unsqueeze(1)
    kl = (ref.exp() * (ref - circuit)).sum(dim=-1)  # [N]
    nll_gap = ref.gather(1, targets)[:, 0] - circuit.gather(1, targets)[:, 0]
    top1 = (ref.argmax(dim=-1) == circuit.argmax(dim=-1)).float()
    return Gap(
        tokens=len(challenge.continuation_ids),
        kl=float(kl.mean().clamp(min=0.0)),
        nll_gap=float(nll_gap.mean()),
        top1=float(top1.mean()),
    )


@dataclass(frozen=True, slots=True)
class CredibilityMap:
    """C = SCALE while KL <= `full_micro`, 0 from KL >= `zero_micro`, linear in between
    (integers: KL in micro-nats, floored once)."""

    full_micro: int
    zero_micro: int

    def __post_init__(self) -> None:
        if not 0 <= self.full_micro < self.zero_micro:
            raise ValueError("credibility map: need 0 <= full_micro < zero_micro")

    def credibility(self, gap: Gap) -> int:
        if not gap.kl < float("inf"):
            return 0
        kl_micro = int(gap.kl * MICRO)
        if kl_micro <= self.full_micro:
            return SCALE
        if kl_micro >= self.zero_micro:
            return 0
        return SCALE * (self.zero_micro - kl_micro) // (self.zero_micro - self.full_micro)


def epoch_credibility(scores: Sequence[int]) -> int:
    """C(T) of one epoch: the floored mean of that epoch's challenge credibilities."""
    if not scores:
        raise UsageError("an epoch's credibility needs at least one challenge score")
    for score in scores:
        if isinstance(score, bool) or not isinstance(score, int) or not 0 <= score <= SCALE:
            raise ValueError(f"credibility {score!r} outside [0, {SCALE}]")
    return sum(scores) // len(scores)
