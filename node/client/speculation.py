"""Speculative decoding through a circuit: several tokens per pass over a slow chain.

Over a WAN a decode step costs one transfer per link (K + 1 for K nodes) whatever the nodes'
speed: at 50 ms a link a 3-node circuit makes at most 5 tokens/s. Here the client guesses up
to `lookahead` next tokens by **prompt lookup** (the longest suffix of the context that
occurred before, and what followed its most recent occurrence; no draft model; the draft's length
adapts to acceptance, `Drafter`), and sends the last chosen token
plus the guesses as ONE frame of k + 1 positions. The circuit computes all of them in one pass;
the last hop answers every row, and the client checks the guesses against the model's own
choice at each row:

- greedy: a guess is kept while it equals the row's argmax; the first row that disagrees (or
  the row after the last guess) gives the model's own next token. The tokens are those of plain
  greedy decoding (in exact arithmetic; the rows are computed in one forward instead of one by
  one, as a prefill's are);
- sampled (temperature / top-p): the guesses are a point-mass proposal q, so the speculative
  sampling rule "keep x with probability min(1, p(x) / q(x)), else draw from (p - q)+" is:
  keep the guess with probability p(guess), else draw from p without the guess, renormalised.
  Every token is distributed as plain sampling's (not the same tokens for a seed).

The next frame carries the rewind flag (protocol/frames/header.py) and starts at the accepted
length: every hop drops the rejected positions from its KV cache before computing it, in the
frame's own path through the circuit (no extra message, and no race with it). A pass without a
guess is a plain one-position decode step.

The decode loop is the one of every generation (`node.client.failover.generate`, also behind
`CircuitClient.generate`): pass `speculation=SpeculationConfig()` and it proposes, verifies and
rewinds as above — with failover, since the token history holds only chosen tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.client.sampling import SamplingConfig, sample
from protocol.errors import ConfigError

MAX_LOOKAHEAD = 16  # guesses per pass (a frame of at most 17 positions)
LOOKUP_WINDOW = 4096  # context tokens searched for an earlier occurrence of the suffix


@dataclass(frozen=True, slots=True)
class SpeculationConfig:
    lookahead: int = 16  # the most tokens guessed per pass (k)
    # the first drafts' length; doubled (up to `lookahead`) after a pass kept every guess, back
    # to it after a pass rejected one. Shrinking further lost tokens per pass in replays of the
    # bench's answers (a guess that is rejected costs a few ms of compute, a pass 4 link delays)
    first_lookahead: int = 8
    max_ngram: int = 64  # longest context suffix matched (the longest match wins)
    # shortest suffix that may propose a full draft: single-token matches are frequent and
    # mostly wrong (on the held-out set they doubled the positions computed for 7 % fewer passes)
    min_ngram: int = 2
    # without such a match, the most recent earlier occurrence of the last token proposes this
    # many tokens (short: right often enough to pay over slow links, cheap when wrong; 3, not
    # 2: a frame of 3 positions computed slower than one of 4 on CPU, node/model/head.py),
    # while it pays (`Drafter`)
    fallback_tokens: int = 3

    def validate(self) -> SpeculationConfig:
        if not 1 <= self.lookahead <= MAX_LOOKAHEAD:
            raise ConfigError(f"lookahead must be 1..{MAX_LOOKAHEAD}, got {self.lookahead}")
        if not 1 <= self.min_ngram <= self.max_ngram <= LOOKUP_WINDOW:
            raise ConfigError(f"need 1 <= min_ngram <= max_ngram <= {LOOKUP_WINDOW}")
        if not 0 <= self.fallback_tokens <= MAX_LOOKAHEAD:
            raise ConfigError(f"fallback_tokens must be 0..{MAX_LOOKAHEAD}")
        if self.first_lookahead < 1:
            raise ConfigError("first_lookahead must be >= 1")
        return self


@dataclass
class SpeculationStats:
    passes: int = 0  # decode passes through the circuit (after the prefill)
    proposed: int = 0  # guesses sent
    accepted: int = 0  # guesses kept

    @property
    def tokens_per_pass(self) -> float:
        return (self.passes + self.accepted) / self.passes if self.passes else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "passes": self.passes,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance": round(self.accepted / self.proposed, 4) if self.proposed else 0.0,
            "tokens_per_pass": round(self.tokens_per_pass, 3),
        }


def longest_match(window: Sequence[int], max_ngram: int) -> tuple[int, int]:
    """(n, begin): the longest suffix of `window` (at most `max_ngram` tokens) that also
    occurred earlier, n its length and `begin` the index right after that occurrence (its
    continuation); the most recent occurrence among equally long ones. (0, 0): the last token
    never occurred before."""
    size = len(window)
    if size < 2:
        return 0, 0
    last = window[-1]
    best, begin = 0, 0
    for end in range(size - 2, -1, -1):  # most recent first; strict > keeps the most recent
        if window[end] != last:
            continue
        n = 1
        while n < max_ngram and end - n >= 0 and window[end - n] == window[size - 1 - n]:
            n += 1
        if n > best:
            best, begin = n, end + 1
            if n == max_ngram:
                break
    return best, begin


def propose(
    context: Sequence[int], config: SpeculationConfig, length: int | None = None
) -> list[int]:
    """Up to `length` (default `lookahead`) tokens that followed the most recent earlier
    occurrence of the context's longest repeated suffix (up to `max_ngram` tokens) when that
    suffix has at least `min_ngram` tokens; else up to `fallback_tokens` after the last token's
    most recent earlier occurrence; [] when the last token never occurred before."""
    window = context[-LOOKUP_WINDOW:]
    n, begin = longest_match(window, config.max_ngram)
    if n == 0:
        return []
    wanted = config.lookahead if length is None else length
    if n < config.min_ngram:
        wanted = min(wanted, config.fallback_tokens)
    return list(window[begin : begin + wanted])


class Drafter:
    """The guesses of one generation's passes: `propose` with a draft length that adapts to
    acceptance (see SpeculationConfig); `observe` each pass's outcome and time.

    A lone-token draft (the fallback) is sent only while its expected gain exceeds its cost, as
    measured on this generation's own passes: its first guess kept with probability p (the
    fallback drafts' record, (kept + 1) / (sent + 2)) saves about one pass without guesses (T1,
    their mean time), and a pass with guesses costs Tg - T1 more (Tg, their mean time). So it
    pays over slow links (T1 is mostly link delay) and is skipped on fast ones, where the extra
    rows' compute is most of a pass. Until both kinds of pass were timed it is sent."""

    def __init__(self, config: SpeculationConfig) -> None:
        self.config = config
        self.first = min(config.first_lookahead, config.lookahead)
        self.length = self.first
        self._fallback = False  # the last draft came from a lone-token match
        self.fallback_sent = 0
        self.fallback_kept = 0  # fallback drafts whose first guess was kept
        self._plain = [0, 0.0]  # passes without guesses: count, seconds
        self._guessed = [0, 0.0]  # passes with guesses: count, seconds

    def fallback_pays(self) -> bool:
        if not self._plain[0] or not self._guessed[0]:
            return True
        plain_s = self._plain[1] / self._plain[0]
        extra_s = self._guessed[1] / self._guessed[0] - plain_s
        kept = (self.fallback_kept + 1) / (self.fallback_sent + 2)
        return kept * plain_s > extra_s

    def draft(self, context: Sequence[int], limit: int) -> list[int]:
        """At most `limit` guesses (the tokens still wanted after this pass's first)."""
        self._fallback = False
        if limit <= 0:
            return []
        window = context[-LOOKUP_WINDOW:]
        n, begin = longest_match(window, self.config.max_ngram)
        if n == 0:
            return []
        wanted = min(self.length, limit)
        if n < self.config.min_ngram:
            if not self.fallback_pays():
                return []
            wanted = min(wanted, self.config.fallback_tokens)
            self._fallback = wanted > 0
        return list(window[begin : begin + wanted])

    def observe(self, proposed: int, accepted: int, seconds: float | None = None) -> None:
        """The last pass: guesses sent and kept, and its time (None: not timed)."""
        if seconds is not None:
            kind = self._guessed if proposed else self._plain
            kind[0] += 1
            kind[1] += seconds
        if proposed == 0:
            return
        if self._fallback:
            self.fallback_sent += 1
            self.fallback_kept += accepted > 0
        if accepted == proposed:  # every guess kept: guess further next time
            self.length = min(self.config.lookahead, 2 * self.length)
        else:
            self.length = self.first


def distribution(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """The probabilities [V] (float64) that `sample` draws from under `config`
    (temperature, then the nucleus of mass top_p)."""
    scaled = logits.astype(np.float64) / config.temperature
    order = np.argsort(-scaled, kind="stable")
    sorted_probs = np.exp(scaled[order] - scaled[order[0]])
    sorted_probs /= sorted_probs.sum()
    if config.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(sorted_probs), config.top_p) + 1)
        sorted_probs[keep:] = 0.0
        sorted_probs /= sorted_probs.sum()
    probs = np.zeros_like(sorted_probs)
    probs[order] = sorted_probs
    return probs


def verify(
    rows: np.ndarray,
    guesses: Sequence[int],
    sampling: SamplingConfig,
    rng: np.random.Generator,
) -> list[int]:
    """The tokens one pass yields: the kept guesses, then one token of the model's own.
    `rows` [len(guesses) + 1, V]: the logits after the last chosen token and after each guess."""
    tokens: list[int] = []
    for index, guess in enumerate(guesses):
        if sampling.greedy:
            choice = int(np.argmax(rows[index]))
            if choice != guess:
                return [*tokens, choice]
        else:
            probs = distribution(rows[index], sampling)
            if rng.random() >= probs[guess]:  # rejected: draw from p without the guess
                probs[guess] = 0.0
                total = probs.sum()
                if total <= 0.0:  # p was a point mass on the guess (cannot reject then)
                    return [*tokens, guess]
                return [*tokens, int(rng.choice(len(probs), p=probs / total))]
        tokens.append(guess)
    return [*tokens, sample(rows[len(guesses)], sampling, rng)]
