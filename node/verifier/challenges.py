"""Challenge prompts of one epoch, from the verifier's secret seed.

The seed is committed on the committee chain before the epoch (`seed_commit`) and revealed
after it (`seed_reveal`), so during the epoch nobody can derive the prompts from public data,
and afterwards anyone can check that the verifier did not pick them after seeing the circuits.
Challenge i of epoch e is a window of natural text (prompt + known continuation) starting at

    offset_i = int(sha256("planet/challenge-window" ‖ seed ‖ uint64_be(e) ‖ uint32_be(i))) mod n

over the token ids of the verifier's corpus (default: the repository's held-out text).

    challenges = epoch_challenges(ids, seed, epoch, count=4, prompt_tokens=32, continuation=64)
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from node.verifier.scoring import Challenge
from protocol.errors import UsageError

SEED_BYTES = 32


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
