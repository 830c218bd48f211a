"""Challenge prompts of one epoch, from the verifier's secret seed.

The seed is committed on the committee chain before the epoch (`seed_commit`) and revealed
after it (`seed_reveal`), so during the epoch nobody can derive the prompts from public data,
and afterwards anyone can check that the verifier did not pick them after seeing the circuits.
Challenge i of epoch e is a window of natural text (prompt + known continuation) starting at

    offset_i = int(sha256("planet/challenge-window" ‖ seed ‖ uint64_be(e) ‖ uint32_be(i))) mod n

over the token ids of the epoch's text. Two sources of that text (`--challenge-source`):

- `generated` (the default): text the reference model itself writes from the seed
  (`generated_text`): two start tokens drawn from the vocabulary's words by
  sha256("planet/challenge-text" ‖ seed ‖ e), then the model samples on (temperature 0.8,
  top-p 0.95, numpy's generator seeded from the same digest) for the windows' total length.
  Nothing in the repository lists it and nobody can write it before the seed is revealed, so
  no node can index challenges in advance; after the reveal anyone with the registered model
  regenerates it and checks the windows (same model, same code; on other hardware a rare
  float-rounding flip of one sampled token would make the check differ from that token on);
- `corpus`: windows of a fixed text (the repository's held-out text): cheap, but public — a
  node that indexes it can recognise the windows.

    text = generated_text(reference, seed, epoch, length)            # token ids
    challenges = epoch_challenges(text, seed, epoch, count=4, prompt_tokens=32, continuation=64)
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from node.client.sampling import SamplingConfig, sample
from node.verifier.scoring import Challenge
from protocol.errors import PlanetError, UsageError

SEED_BYTES = 32
TEXT_DOMAIN = b"planet/challenge-text/v1"
TEXT_SAMPLING = (0.8, 0.95)  # temperature, top-p of the generated challenge text
WINDOW_STRIDE = 16  # generated text: windows start within (count - 1) · stride tokens
_WORD = re.compile(r" ?[A-Za-z]{3,}\Z")


def new_seed() -> bytes:
    return secrets.token_bytes(SEED_BYTES)


def window_offset(seed: bytes, epoch: int, index: int, span: int) -> int:
    """Where challenge `index` of `epoch` starts, in [0, span)."""
    digest = hashlib.sha256(
        b"planet/challenge-window" + seed + epoch.to_bytes(8, "big") + index.to_bytes(4, "big")
    ).digest()
    return int.from_bytes(digest, "big") % span


def epoch_challenges(
    corpus_ids: Sequence[int],
    seed: bytes,
    epoch: int,
    *,
    count: int,
    prompt_tokens: int = 32,
    continuation_tokens: int = 64,
) -> list[Challenge]:
    """`count` prompt + continuation windows of `corpus_ids` chosen by (seed, epoch)."""
    if len(seed) != SEED_BYTES:
        raise UsageError(f"a challenge seed is {SEED_BYTES} bytes")
    length = prompt_tokens + continuation_tokens
    if count < 1 or prompt_tokens < 1 or continuation_tokens < 1:
        raise UsageError("count, prompt and continuation lengths must be >= 1")
    if len(corpus_ids) < length:
        raise UsageError(f"the corpus has {len(corpus_ids)} tokens, a challenge needs {length}")
    span = len(corpus_ids) - length + 1
    out = []
    for index in range(count):
        start = window_offset(seed, epoch, index, span)
        window = corpus_ids[start : start + length]
        out.append(Challenge(tuple(window[:prompt_tokens]), tuple(window[prompt_tokens:])))
    return out


def text_length(count: int, prompt_tokens: int, continuation_tokens: int) -> int:
    """Tokens of generated text an epoch's `count` windows are drawn from."""
    return prompt_tokens + continuation_tokens + (count - 1) * WINDOW_STRIDE


def _start_tokens(vocab: dict[str, int], digest: bytes) -> list[int]:
    words = sorted(token for text, token in vocab.items() if _WORD.match(text))
    if not words:
        raise UsageError("the reference's vocabulary has no word tokens to start a text")
    first = int.from_bytes(digest[8:16], "big") % len(words)
    second = int.from_bytes(digest[16:24], "big") % len(words)
    return [words[first], words[second]]


class TextAbandoned(PlanetError):
    """`generated_text` was told to stop (the verifier is shutting down) before the text was
    written."""

    code = "text_abandoned"


@torch.inference_mode()
def generated_text(
    reference: Any,
    seed: bytes,
    epoch: int,
    length: int,
    abandon: threading.Event | None = None,
) -> list[int]:
    """`length` token ids the reference model writes from (seed, epoch): the secret, fresh text
    of that epoch's challenges. `reference`: node.verifier.reference.Reference (head, shards
    with caches, vocab). Deterministic for one model and code. It runs in a thread for ~10 s:
    once `abandon` is set it stops before its next token (`TextAbandoned`), so a stopping
    verifier does not wait for it."""
    if len(seed) != SEED_BYTES:
        raise UsageError(f"a challenge seed is {SEED_BYTES} bytes")
    digest = hashlib.sha256(TEXT_DOMAIN + seed + epoch.to_bytes(8, "big")).digest()
    temperature, top_p = TEXT_SAMPLING
    config = SamplingConfig(temperature, top_p, int.from_bytes(digest[:8], "big")).validate()
    rng = config.rng()
    ids = _start_tokens(reference.vocab, digest)
    caches = [shard.new_cache() for shard in reference.shards]
    hidden = reference.head.embed(ids)
    positions = torch.arange(len(ids))
    while True:
        if abandon is not None and abandon.is_set():
            raise TextAbandoned(f"epoch {epoch}'s challenge text abandoned at {len(ids)} tokens")
        for shard, cache in zip(reference.shards, caches, strict=True):
            hidden = shard.forward(hidden, positions, cache)
        if len(ids) >= length:
            return ids[:length]
        logits = reference.head.all_logits(hidden[:, -1:])[-1].to(torch.float32).numpy()
        token = sample(np.asarray(logits), config, rng)
        ids.append(token)
        hidden = reference.head.embed([token])
        positions = torch.tensor([len(ids) - 1])
