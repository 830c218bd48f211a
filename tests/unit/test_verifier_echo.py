"""Teacher-forced scoring through the gateway's echo answer (node/verifier/echo.py), challenge
windows from a secret seed (challenges.py), attribution of circuit scores to nodes
(attribution.py) and the seed book (seedbook.py)."""

from __future__ import annotations

import math
import stat

import numpy as np
import pytest
import torch

from node.gateway.engine import token_event
from node.gateway.shapes import completion_logprobs
from node.verifier.attribution import CircuitScore, attribute, unresolved
from node.verifier.challenges import epoch_challenges
from node.verifier.echo import (
    EchoAnswerError,
    echo_gap,
    echo_request,
    parse_echo,
    simulated_answer,
    vocabulary_index,
)
from node.verifier.scoring import SCALE, Challenge, compare_logits
from node.verifier.seedbook import SeedBook
from protocol.errors import ConfigError, UsageError

pytestmark = pytest.mark.unit

V = 40
TEXTS = [f"t{i}" for i in range(V)]
VOCAB = vocabulary_index(TEXTS)


def _logits(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _gateway_doc(challenge: Challenge, logits: torch.Tensor) -> dict:
    """The /v1/completions echo answer the gateway would send for these circuit logits."""
    ids = challenge.ids
    events = [token_event(ids[0], None, False, 0)]
    events += [
        token_event(ids[i], logits[i - 1].numpy().astype(np.float32), True, 5)
        for i in range(1, len(ids))
    ]
    shaped = completion_logprobs([], lambda t: TEXTS[t], 0, events)
    return {"choices": [{"text": "", "logprobs": shaped}]}


CHALLENGE = Challenge(tuple(range(1, 6)), tuple(range(6, 16)))


def test_echo_gateway_answer_parses_to_the_simulated_answer_and_scores_zero_when_equal() -> None:
    logits = _logits(1, len(CHALLENGE.ids))
    doc = _gateway_doc(CHALLENGE, logits)
    parsed = parse_echo(doc, CHALLENGE, VOCAB)
    simulated = simulated_answer(CHALLENGE, logits)
    for got, want in zip(parsed.positions, simulated.positions, strict=True):
        assert math.isclose(got.logprob, want.logprob, abs_tol=1e-5)
        assert {t for t, _ in got.top} == {t for t, _ in want.top}
        assert got.top1_id == want.top1_id
    gap = echo_gap(CHALLENGE, parsed, logits)
    assert gap.kl < 1e-6 and gap.top1 == 1.0 and gap.tokens == 10


def test_echo_coarsened_kl_grows_with_the_difference_and_never_exceeds_the_full_kl() -> None:
    reference = _logits(2, len(CHALLENGE.ids))
    last = 0.0
    for scale in (0.05, 0.3, 1.0):
        circuit = reference + scale * _logits(3, len(CHALLENGE.ids))
        coarse = echo_gap(CHALLENGE, simulated_answer(CHALLENGE, circuit), reference)
        full = compare_logits(CHALLENGE, circuit, reference)
        assert last < coarse.kl <= full.kl + 1e-6
        last = coarse.kl


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["choices"][0].pop("logprobs"),
        lambda d: d["choices"][0]["logprobs"]["tokens"].pop(),
        lambda d: d["choices"][0]["logprobs"]["token_logprobs"].__setitem__(0, -1.0),
        lambda d: d["choices"][0]["logprobs"]["token_logprobs"].__setitem__(3, 0.5),
        lambda d: d["choices"][0]["logprobs"]["token_logprobs"].__setitem__(3, float("nan")),
        lambda d: d["choices"][0]["logprobs"]["token_logprobs"].__setitem__(3, "x"),
        lambda d: d["choices"][0]["logprobs"]["top_logprobs"].__setitem__(2, [1]),
        lambda d: d["choices"][0]["logprobs"]["top_logprobs"][2].update(
            {f"z{i}": -9.0 for i in range(5)}
        ),
        lambda d: d.clear(),
    ],
)
def test_echo_malformed_answers_are_named_errors(mutate) -> None:
    doc = _gateway_doc(CHALLENGE, _logits(4, len(CHALLENGE.ids)))
    mutate(doc)
    with pytest.raises(EchoAnswerError):
        parse_echo(doc, CHALLENGE, VOCAB)


def test_echo_request_is_an_ordinary_completion_request() -> None:
    from node.gateway.requests import parse_completion

    req = parse_completion(echo_request("m", CHALLENGE))
    assert req.echo and req.logprobs == 5 and req.prompt == tuple(CHALLENGE.ids)
    assert req.sampling.max_tokens == 1 and not req.sampling.stream


def test_vocabulary_index_drops_ambiguous_texts() -> None:
    assert vocabulary_index(["a", "b", "a", "c"]) == {"b": 1, "c": 3}


def test_challenges_depend_on_seed_and_epoch_only() -> None:
    corpus = list(range(1000))
    one = epoch_challenges(
        corpus, b"\x01" * 32, 7, count=4, prompt_tokens=8, continuation_tokens=16
    )
    assert one == epoch_challenges(
        corpus, b"\x01" * 32, 7, count=4, prompt_tokens=8, continuation_tokens=16
    )
    assert one != epoch_challenges(
        corpus, b"\x01" * 32, 8, count=4, prompt_tokens=8, continuation_tokens=16
    )
    assert one != epoch_challenges(
        corpus, b"\x02" * 32, 7, count=4, prompt_tokens=8, continuation_tokens=16
    )
    for challenge in one:
        start = challenge.prompt_ids[0]
        assert challenge.ids == list(range(start, start + 24))
    with pytest.raises(UsageError):
        epoch_challenges(corpus[:10], b"\x01" * 32, 1, count=1, prompt_tokens=8)
    with pytest.raises(UsageError):
        epoch_challenges(corpus, b"\x01" * 31, 1, count=1)


def test_attribution_blames_the_only_uncleared_node_and_clears_honest_partners() -> None:
    a, b, s = "a" * 64, "b" * 64, "c" * 64
    results = [
        CircuitScore((a, b), SCALE),
        CircuitScore((a, s), 0),
        CircuitScore((a, s), 120_000),
    ]
    assert attribute(results) == {a: SCALE, b: SCALE, s: 0}


def test_attribution_ambiguous_circuit_blames_nobody() -> None:
    a, s = "a" * 64, "c" * 64
    assert attribute([CircuitScore((a, s), 0)]) == {}
    assert attribute([]) == {}


def test_attribution_two_cheaters_together_blame_nobody_until_seen_apart() -> None:
    a, b, x, y = "a" * 64, "b" * 64, "d" * 64, "e" * 64
    assert attribute([CircuitScore((x, y), 0), CircuitScore((a, b), SCALE)]) == {
        a: SCALE,
        b: SCALE,
    }
    scores = attribute(
        [CircuitScore((x, y), 0), CircuitScore((a, y), 0), CircuitScore((a, b), SCALE)]
    )
    assert scores == {a: SCALE, b: SCALE, y: 0}


def test_unresolved_names_only_the_low_circuits_that_blamed_nobody() -> None:
    a, b, s, x, y = "a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64
    ambiguous = CircuitScore((x, y), 0)
    results = [CircuitScore((a, b), SCALE), CircuitScore((a, s), 0), ambiguous]
    assert unresolved(results) == [ambiguous]  # (a, s) blamed s; (a, b) is clean
    assert unresolved([CircuitScore((s, s), 0)]) == []  # one node twice: blamed, not ambiguous
    assert unresolved([]) == []


def test_seedbook_persists_privately_and_refuses_a_corrupt_file(tmp_path) -> None:
    path = tmp_path / "v" / "seeds.json"
    book = SeedBook(path)
    seed = book.ensure(3)
    assert book.ensure(3) == seed and len(seed) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SeedBook(path).get(3) == seed and SeedBook(path).get(4) is None
    path.write_text('{"x": "zz"}')
    with pytest.raises(ConfigError):
        SeedBook(path)
