"""Seed-synchronised checks of sampled answers (the DiFR idea, arXiv 2511.20621, in our words).

Echo challenges (echo.py) check the circuit's distributions teacher-forced; this checks tokens a
circuit actually SAMPLED at temperature > 0. The verifier asks like any user, with OpenAI's
`seed` (its value derived from the verifier's committed secret seed, `sampling_seed`, so it is
checkable after the reveal and no node can know it: nodes never sample, the client's head does).
The gateway samples each token with `node.client.sampling.sample` from one numpy Generator
seeded with it, one uniform draw per token. The verifier then runs its reference over prompt +
the answer's tokens on the schedule nodes serve it (the prompt in one prefill, one position per
forward, shard boundaries rounded as its gateway's frames: `Reference.served_logits`; one
prefill differs by rounding, which flips ~6 % of an honest fp16 circuit's draws) and replays
the same sampler with the same seed on its own logits:
at every position the same uniform picks a token from the reference's distribution. An honest
circuit's logits equal the reference's up to rounding, so the replay picks the same token
unless the uniform falls within that rounding of a boundary; a substitute's distributions
differ, and each position is an independent chance that the replay picks another token.

    seed = sampling_seed(secret, epoch, index)                     # < 2^63 (the gateway's range)
    body = sampled_request(model, prompt_ids, max_tokens=32, seed=seed, temperature=1.0)
    answer = parse_sampled(doc, vocab)                              # the answer's token ids
    logits = reference.served_logits(prompt_ids, answer.tokens)    # the nodes' schedule
    check = replay(logits, len(prompt_ids), answer, config, reference.stop_ids)
    c = SampledMap().credibility(check)                             # 10^6 … 0

Only tokens whose text names one id are checked (`parse_sampled` stops at the first other):
`check.observed` counts the positions checked, `check.mismatched` the ones the replay chose
differently. An answer that ended by itself (`finish_reason` "stop": the verifier asks with no
stop strings, so the circuit sampled an end-of-sequence token) is one more observed position: the
replay must pick one of the model's stop ids there. Without it, a circuit whose first sampled
token is a stop id would answer nothing and escape the check. The detection rate against tokens
observed is measured by bench/verification.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from node.client.sampling import SamplingConfig, sample
from protocol.errors import ProtocolError

SEED_DOMAIN = b"planet/sampling-seed/v1"
SCALE = 1_000_000


class SampledAnswerError(ProtocolError):
    """The gateway's answer to a sampled challenge is malformed."""

    code = "bad_sampled_answer"


def sampling_seed(secret: bytes, epoch: int, index: int) -> int:
    """The `seed` of sampled challenge `index` of `epoch`: 63 bits of
    sha256(domain ‖ secret ‖ u64 epoch ‖ u32 index) (non-negative within OpenAI's int64)."""
    digest = hashlib.sha256(
        SEED_DOMAIN + secret + epoch.to_bytes(8, "big") + index.to_bytes(4, "big")
    ).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sampled_request(
    model: str, prompt_ids: Sequence[int], *, max_tokens: int, seed: int, temperature: float
) -> dict[str, Any]:
    """An ordinary user's sampled completion with a seed; `logprobs: 0` returns each token's
    text (the ids the verifier replays)."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": 1,
        "seed": seed,
        "logprobs": 0,
    }


@dataclass(frozen=True, slots=True)
class SampledAnswer:
    tokens: tuple[int, ...]  # the generated ids, up to the first ambiguous text
    stopped: bool  # the circuit sampled a stop id right after `tokens` (finish_reason "stop")


def parse_sampled(doc: Any, vocab: Mapping[str, int]) -> SampledAnswer:
    """The generated token ids of a /v1/completions answer, up to the first token whose text
    does not name exactly one id; `stopped` when every token was read and the answer ended by
    itself (finish_reason "stop", not "length")."""
    try:
        choice = doc["choices"][0]
        tokens = choice["logprobs"]["tokens"]
    except (KeyError, IndexError, TypeError):
        raise SampledAnswerError("the answer has no choices[0].logprobs.tokens") from None
    if not isinstance(tokens, list):
        raise SampledAnswerError("logprobs.tokens must be a list")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise SampledAnswerError(f"finish_reason must be 'stop' or 'length', not {finish!r}")
    out = []
    for text in tokens:
        if not isinstance(text, str) or text not in vocab:
            break
        out.append(vocab[text])
    return SampledAnswer(tuple(out), finish == "stop" and len(out) == len(tokens))


@dataclass(frozen=True, slots=True)
class SampledCheck:
    observed: int  # positions checked
    mismatches: tuple[int, ...]  # where the replay chose another token (0-based, generated)

    @property
    def mismatched(self) -> int:
        return len(self.mismatches)

    @property
    def first_mismatch(self) -> int | None:
        return self.mismatches[0] if self.mismatches else None

    def first(self, count: int) -> SampledCheck:
        """The check of the first `count` positions only (detection vs tokens observed)."""
        return SampledCheck(
            min(count, self.observed), tuple(m for m in self.mismatches if m < count)
        )


@torch.inference_mode()
def replay(
    reference: torch.Tensor,
    prompt_len: int,
    answer: SampledAnswer,
    config: SamplingConfig,
    stop_ids: frozenset[int],
) -> SampledCheck:
    """Replay the gateway's sampler (same seed, one draw per token) on the reference's [T, V]
    logits over prompt + the answer's tokens; count where it picks another token than the
    circuit did. A `stopped` answer adds the position after its tokens, where the replay must
    pick one of `stop_ids`."""
    if config.seed is None or config.greedy:
        raise ProtocolError("a sampled check needs a seed and a temperature above 0")
    tokens = answer.tokens
    rows_needed = prompt_len + len(tokens) - 1 + int(answer.stopped)
    if reference.dim() != 2 or reference.shape[0] < rows_needed:
        raise ProtocolError("reference logits must cover the prompt and the answer")
    if answer.stopped and not stop_ids:
        raise ProtocolError("a stopped answer is checked against the model's stop ids")
    rows = reference.to(torch.float32).numpy()
    rng = config.rng()
    mismatches = [
        index
        for index, token in enumerate(tokens)
        if sample(np.asarray(rows[prompt_len - 1 + index]), config, rng) != token
    ]
    observed = len(tokens)
    if answer.stopped:
        if sample(np.asarray(rows[prompt_len - 1 + observed]), config, rng) not in stop_ids:
            mismatches.append(observed)
        observed += 1
    return SampledCheck(observed, tuple(mismatches))


@dataclass(frozen=True, slots=True)
class SampledMap:
    """Credibility of a sampled check: 10^6 while at most `allowed` positions mismatch
    (`allowed_per_mille` of the observed, at least `min_allowed`: honest rounding), 0 from
    `zero_factor` × allowed, linear between (integers)."""

    allowed_per_mille: int = 30  # DiFR: > 98 % of honest regenerated tokens match on GPUs
    min_allowed: int = 1
    zero_factor: int = 4

    def allowed(self, observed: int) -> int:
        return max(self.min_allowed, observed * self.allowed_per_mille // 1000)

    def credibility(self, check: SampledCheck) -> int | None:
        """None when nothing was observed (no score: the circuit is not judged on it)."""
        if check.observed == 0:
            return None
        allowed = self.allowed(check.observed)
        zero = self.zero_factor * allowed
        if check.mismatched <= allowed:
            return SCALE
        if check.mismatched >= zero:
            return 0
        return SCALE * (zero - check.mismatched) // (zero - allowed)
