"""Teacher-forced scoring through the gateway's OpenAI API: `/v1/completions` with `echo`.

The verifier asks like any user: `{"prompt": [ids of prompt + known continuation], "echo":
true, "logprobs": 5, "max_tokens": 1, "temperature": 0}`. The circuit runs ONE prefill; the
answer lists, for every prompt token after the first, its logprob and the 5 most likely tokens
with theirs (OpenAI's completions shape: `tokens`, `token_logprobs`, `top_logprobs` keyed by
token text). The verifier compares that with its own reference pass over the same ids.

Per continuation position the circuit's distribution is known only on S = {the true token} ∪
{its top-5}; the distance is the KL of the two distributions coarsened to S ∪ {rest}:

    KL_S = Σ_{i∈S} p(i)·(log p(i) − log q(i)) + p_rest·(log p_rest − log q_rest)

(p: reference, q: circuit, p_rest = 1 − Σ_S p). Coarsening never increases a KL (data
processing), so KL_S ≤ the full-vocabulary KL and an honest circuit (KL ≈ 0) stays ≈ 0; its
calibration (calibration.json, `echo_map`) is measured on the same numbers.

    answer = parse_echo(doc, challenge, vocab)           # EchoAnswer, or EchoAnswerError
    gap = echo_gap(challenge, answer, reference_logits)  # scoring.Gap (kl = mean KL_S)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from node.verifier.scoring import Challenge, Gap
from protocol.errors import ProtocolError

MAX_TOP = 5
_EPS = 1e-12


class EchoAnswerError(ProtocolError):
    """The gateway's echo answer is malformed or does not match the challenge."""

    code = "bad_echo_answer"


@dataclass(frozen=True, slots=True)
class Position:
    """What the circuit said about one prompt position: the true token's logprob and the top
    alternatives as (token id, logprob) where the text names one token unambiguously."""

    logprob: float
    top: tuple[tuple[int, float], ...]
    top1_id: int | None  # the circuit's most likely token (None when its text is ambiguous)


@dataclass(frozen=True, slots=True)
class EchoAnswer:
    positions: tuple[Position, ...]  # one per prompt token after the first


def vocabulary_index(token_texts: Sequence[str]) -> dict[str, int]:
    """Token text → id, for texts that exactly one id decodes to."""
    seen: dict[str, int] = {}
    ambiguous: set[str] = set()
    for token, text in enumerate(token_texts):
        if text in seen:
            ambiguous.add(text)
        seen[text] = token
    return {text: token for text, token in seen.items() if text not in ambiguous}


def _logprob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EchoAnswerError(f"{where}: expected a number")
    number = float(value)
    if math.isnan(number) or number > 1e-6:
        raise EchoAnswerError(f"{where}: {number!r} is not a log-probability")
    return max(number, -1e4)


def parse_echo(doc: Any, challenge: Challenge, vocab: Mapping[str, int]) -> EchoAnswer:
    """The positions of `challenge.ids` from a /v1/completions answer with echo + logprobs."""
    try:
        logprobs = doc["choices"][0]["logprobs"]
        tokens = logprobs["tokens"]
        values = logprobs["token_logprobs"]
        tops = logprobs["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise EchoAnswerError("the answer has no choices[0].logprobs with echo") from None
    total = len(challenge.ids)
    if not all(isinstance(x, list) for x in (tokens, values, tops)):
        raise EchoAnswerError("logprobs fields must be lists")
    if not (len(tokens) == len(values) == len(tops)) or len(tokens) < total:
        raise EchoAnswerError(f"echo covers {len(tokens)} tokens, the challenge has {total}")
    if values[0] is not None:
        raise EchoAnswerError("the first echoed token cannot have a logprob")
    positions = []
    for index in range(1, total):
        top = tops[index]
        if not isinstance(top, dict) or len(top) > MAX_TOP:
            raise EchoAnswerError(f"top_logprobs[{index}] must be an object of <= {MAX_TOP}")
        pairs = []
        best: tuple[float, str] | None = None
        for text, value in top.items():
            logprob = _logprob(value, f"top_logprobs[{index}]")
            if best is None or logprob > best[0]:
                best = (logprob, text)
            if isinstance(text, str) and text in vocab:
                pairs.append((vocab[text], logprob))
        top1 = vocab.get(best[1]) if best is not None else None
        positions.append(
            Position(_logprob(values[index], f"token_logprobs[{index}]"), tuple(pairs), top1)
        )
    return EchoAnswer(tuple(positions))


@torch.inference_mode()
def echo_gap(challenge: Challenge, answer: EchoAnswer, reference: torch.Tensor) -> Gap:
    """Mean coarsened KL (and NLL gap, top-1 agreement) over the continuation's positions.
    `reference`: the verifier's [T, V] logits over `challenge.ids`."""
    total = len(challenge.ids)
    if reference.dim() != 2 or reference.shape[0] != total:
        raise ProtocolError(f"reference logits must be [{total}, V]")
    if len(answer.positions) != total - 1:
        raise EchoAnswerError("the echo answer does not cover the challenge")
    # only the scored rows (the continuation's): log_softmax is row by row, so the prompt's
    # rows (a third of a challenge) need not be normalized at all
    scored = challenge.scored_rows
    ref = torch.log_softmax(reference[scored].to(torch.float64), dim=-1)
    ids = challenge.ids
    kls, gaps, agree = [], [], []
    for row in range(scored.start, scored.stop):
        target = ids[row + 1]
        said = answer.positions[row]  # position row+1's entry
        q = {target: said.logprob}
        for token, logprob in said.top:
            q.setdefault(token, logprob)
        logp = ref[row - scored.start]
        kl = 0.0
        p_in = 0.0
        q_in = 0.0
        for token, logq in q.items():
            lp = float(logp[token])
            p = math.exp(lp)
            kl += p * (lp - logq)
            p_in += p
            q_in += math.exp(logq)
        p_rest = max(0.0, 1.0 - p_in)
        q_rest = max(_EPS, 1.0 - q_in)
        if p_rest > _EPS:
            kl += p_rest * (math.log(p_rest) - math.log(q_rest))
        kls.append(max(0.0, kl))
        gaps.append(float(logp[target]) - said.logprob)
        agree.append(1.0 if said.top1_id == int(logp.argmax()) else 0.0)
    count = len(kls)
    return Gap(
        tokens=count, kl=sum(kls) / count, nll_gap=sum(gaps) / count, top1=sum(agree) / count
    )


def echo_request(model: str, challenge: Challenge) -> dict[str, Any]:
    """The /v1/completions body of a challenge: an ordinary user's echo + logprobs request."""
    return {
        "model": model,
        "prompt": challenge.ids,
        "max_tokens": 1,
        "echo": True,
        "logprobs": MAX_TOP,
        "temperature": 0,
    }


@torch.inference_mode()
def simulated_answer(challenge: Challenge, circuit_logits: torch.Tensor) -> EchoAnswer:
    """What the gateway's echo answer says for a circuit's [T, V] logits (its numbers: float64
    log-softmax, top-5 by logprob), with token ids in place of texts. For calibration and tests."""
    logp = torch.log_softmax(circuit_logits.to(torch.float64), dim=-1)
    ids = challenge.ids
    positions = []
    for row in range(len(ids) - 1):
        values, tokens = torch.topk(logp[row], MAX_TOP)
        top = tuple((int(t), float(v)) for t, v in zip(tokens, values, strict=True))
        positions.append(Position(float(logp[row, ids[row + 1]]), top, top[0][0]))
    return EchoAnswer(tuple(positions))
