"""Seed-synchronised sampled checks (node/verifier/sampled.py) and challenge text the reference
writes from the verifier's seed (node/verifier/challenges.py `generated_text`), with fakes of
the model, the gateway and the committee."""

from __future__ import annotations

import json
import threading
from typing import ClassVar

import numpy as np
import pytest
import torch

from node.client.sampling import SamplingConfig, sample
from node.verifier.challenges import (
    TextAbandoned,
    epoch_challenges,
    generated_text,
    text_length,
)
from node.verifier.echo import vocabulary_index
from node.verifier.report import SCORES_FILE
from node.verifier.sampled import (
    SampledAnswer,
    SampledAnswerError,
    SampledCheck,
    SampledMap,
    parse_sampled,
    replay,
    sampled_request,
    sampling_seed,
)
from node.verifier.scoring import CredibilityMap
from node.verifier.worker import VerifierWorker, WorkerSettings
from protocol.errors import ProtocolError
from tests.unit.test_verifier_worker import A, B, FakeLink, S

pytestmark = pytest.mark.unit

V = 40
TEXTS = [" word" + "abcdefghijklmnopqrst"[i // 2] if i % 2 else f"t{i}" for i in range(V)]
VOCAB = vocabulary_index(TEXTS)


def table(ids: list[int], flip: bool = False) -> torch.Tensor:
    """[T, V] logits depending on the last token (a bigram model); `flip`: a substitute."""
    rows = torch.tensor(ids, dtype=torch.float32)[:, None]
    logits = torch.sin(rows * 1.3 + torch.arange(V, dtype=torch.float32)[None, :] * 0.9) * 3
    return torch.flip(logits, dims=[1]) if flip else logits


def sampled_by(ids: list[int], count: int, config: SamplingConfig, flip: bool) -> list[int]:
    """What a circuit with `table` logits samples, as the gateway does (one rng per answer)."""
    rng = config.rng()
    out = list(ids)
    for _ in range(count):
        out.append(sample(np.asarray(table(out, flip)[-1]), config, rng))
    return out[len(ids) :]


def test_sampled_replay_matches_an_honest_circuit_and_catches_a_substitute() -> None:
    prompt = [1, 2, 3]
    config = SamplingConfig(1.0, 1.0, sampling_seed(b"\x01" * 32, 5, 0))
    for flip, expect_clean in ((False, True), (True, False)):
        tokens = sampled_by(prompt, 64, config, flip)
        answer = SampledAnswer(tuple(tokens), stopped=False)
        check = replay(table([*prompt, *tokens]), len(prompt), answer, config, STOPS)
        assert check.observed == 64
        if expect_clean:
            assert check.mismatched == 0 and check.first_mismatch is None
            assert SampledMap().credibility(check) == 1_000_000
        else:
            assert check.mismatched > 16  # every position is a fresh chance
            assert SampledMap().credibility(check) == 0


def test_sampled_map_tolerates_rounding_then_falls_linearly() -> None:
    scores = SampledMap()
    assert scores.allowed(32) == 1 and scores.allowed(300) == 9
    assert scores.credibility(SampledCheck(0, ())) is None  # nothing observed: no score
    assert scores.credibility(SampledCheck(300, tuple(range(9)))) == 1_000_000
    assert 0 < scores.credibility(SampledCheck(300, tuple(range(20)))) < 1_000_000
    assert scores.credibility(SampledCheck(300, tuple(range(36)))) == 0
    assert SampledCheck(300, (1, 50, 200)).first(64) == SampledCheck(64, (1, 50))


def test_sampling_seed_is_a_function_of_the_secret_epoch_and_index() -> None:
    seeds = {
        sampling_seed(s, e, i) for s in (b"\x00" * 32, b"\x01" * 32) for e in (1, 2) for i in (0, 1)
    }
    assert len(seeds) == 8 and all(0 <= x < 2**63 for x in seeds)
    assert sampling_seed(b"\x00" * 32, 1, 0) == sampling_seed(b"\x00" * 32, 1, 0)
    body = sampled_request("m", [1, 2], max_tokens=8, seed=7, temperature=1.0)
    assert body["seed"] == 7 and body["logprobs"] == 0 and body["temperature"] == 1.0


def _doc(texts: list[str], finish: object = "length") -> dict:
    return {"choices": [{"logprobs": {"tokens": texts}, "finish_reason": finish}]}


def test_parse_sampled_stops_at_the_first_ambiguous_token() -> None:
    assert parse_sampled(_doc([TEXTS[3], TEXTS[5], "??", TEXTS[7]]), VOCAB) == SampledAnswer(
        (3, 5), stopped=False
    )
    # an answer that ended by itself: its stop position is checked too, unless a token was
    # left unread (then the stop is not the position after the tokens read)
    assert parse_sampled(_doc([TEXTS[3]], "stop"), VOCAB) == SampledAnswer((3,), stopped=True)
    assert parse_sampled(_doc([], "stop"), VOCAB) == SampledAnswer((), stopped=True)
    assert not parse_sampled(_doc([TEXTS[3], "??"], "stop"), VOCAB).stopped
    bad_docs = (
        {},
        _doc("x"),  # type: ignore[arg-type]
        {"choices": []},
        _doc([TEXTS[3]], None),
        _doc([TEXTS[3]], "content_filter"),
        _doc([TEXTS[3]], ["stop"]),
    )
    for bad in bad_docs:
        with pytest.raises(SampledAnswerError):
            parse_sampled(bad, VOCAB)


STOP = 0  # the bigram model's end-of-sequence id in these tests
STOPS = frozenset({STOP})


def _stop_seed(prompt: list[int], want: bool) -> tuple[SamplingConfig, int]:
    """A sampling config whose first draw on the reference after `prompt` picks STOP (`want`)
    or another token, and that token."""
    for index in range(10_000):
        config = SamplingConfig(1.0, 1.0, sampling_seed(b"\x02" * 32, 1, index))
        first = sampled_by(prompt, 1, config, flip=False)[0]
        if (first == STOP) == want:
            return config, first
    raise AssertionError("no seed found")


def test_a_stopped_answer_is_checked_at_its_stop() -> None:
    """A circuit that answers nothing (its first sampled token a stop id) is still checked: the
    stop is one observed position. The old check observed 0 positions and scored nothing."""
    prompt = [1, 2, 3]
    logits = table(prompt)
    # the reference would have sampled another token: the empty answer is one mismatch
    config, _ = _stop_seed(prompt, want=False)
    check = replay(logits, len(prompt), SampledAnswer((), stopped=True), config, STOPS)
    assert check == SampledCheck(1, (0,))
    # the reference samples the stop id too: an honest early stop matches
    config, _ = _stop_seed(prompt, want=True)
    check = replay(logits, len(prompt), SampledAnswer((), stopped=True), config, STOPS)
    assert check == SampledCheck(1, ())
    # after some tokens: the stop position is the one after them, with the next draw
    config = SamplingConfig(1.0, 1.0, sampling_seed(b"\x03" * 32, 1, 0))
    tokens = sampled_by(prompt, 5, config, flip=False)
    answer = SampledAnswer(tuple(tokens), stopped=True)
    expected_stop = sampled_by(prompt, 6, config, flip=False)[5]
    check = replay(table([*prompt, *tokens]), len(prompt), answer, config, STOPS)
    assert check.observed == 6
    assert check.mismatches == (() if expected_stop == STOP else (5,))
    with pytest.raises(ProtocolError):  # the stop position needs its row
        replay(table([*prompt, *tokens[:-1]]), len(prompt), answer, config, STOPS)
    with pytest.raises(ProtocolError):  # and the model's stop ids
        replay(table([*prompt, *tokens]), len(prompt), answer, config, frozenset())


class TinyModel:
    """A Reference-like bigram model with caches (what generated_text drives)."""

    vocab = VOCAB

    class Head:
        def embed(self, ids: list[int]) -> torch.Tensor:
            return torch.tensor(ids, dtype=torch.float32).reshape(1, -1, 1)

        def all_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return table([int(x) for x in hidden.reshape(-1).tolist()])

    class Shard:
        def new_cache(self) -> list[int]:
            return []

        def forward(
            self, hidden: torch.Tensor, positions: torch.Tensor, cache: list
        ) -> torch.Tensor:
            assert int(positions[0]) == len(cache)  # positions follow the cache: one pass each
            cache.extend(int(p) for p in positions)
            return hidden

    head = Head()
    shards: ClassVar[list[Shard]] = [Shard(), Shard()]


def test_a_text_being_written_stops_at_its_next_token_once_abandoned() -> None:
    """A stopping verifier sets `abandon`: the thread writing an epoch's text (~10 s on the
    real model) ends before its next token instead of holding the process's exit up."""
    model = TinyModel()
    abandon = threading.Event()
    calls = 0
    forward = TinyModel.Shard.forward

    def counting(self, hidden, positions, cache):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 10:
            abandon.set()  # the verifier stops while the text is under way
        return forward(self, hidden, positions, cache)

    TinyModel.Shard.forward = counting  # type: ignore[method-assign]
    try:
        with pytest.raises(TextAbandoned):
            generated_text(model, b"\x07" * 32, 9, text_length(4, 8, 16), abandon)
    finally:
        TinyModel.Shard.forward = forward  # type: ignore[method-assign]
    assert calls == 10  # both shards of token 5, then nothing more
    assert len(generated_text(model, b"\x07" * 32, 9, 20, threading.Event())) == 20


def test_generated_text_is_fixed_by_seed_and_epoch_and_starts_with_words() -> None:
    model = TinyModel()
    length = text_length(4, 8, 16)
    text = generated_text(model, b"\x07" * 32, 9, length)
    assert len(text) == length == 8 + 16 + 3 * 16
    assert text == generated_text(model, b"\x07" * 32, 9, length)
    assert text != generated_text(model, b"\x07" * 32, 10, length)
    assert text != generated_text(model, b"\x08" * 32, 9, length)
    assert all(TEXTS[t].startswith(" word") for t in text[:2])
    windows = epoch_challenges(
        text, b"\x07" * 32, 9, count=4, prompt_tokens=8, continuation_tokens=16
    )
    assert all(
        len(w.ids) == 24 and " ".join(map(str, w.ids)) in " ".join(map(str, text)) for w in windows
    )


class SamplingAsker:
    """The gateway: echo challenges are not asked here; sampled ones alternate (A, B) honest and
    (A, S) a substitute, each sampled with the request's seed."""

    def __init__(self) -> None:
        self.count = 0
        self.seeds: list[int] = []

    async def ask_sampled(self, prompt, *, max_tokens: int, seed: int, temperature: float):
        from node.verifier.asker import Asked

        self.count += 1
        self.seeds.append(seed)
        nodes = (A, B) if self.count % 2 else (A, S)
        config = SamplingConfig(temperature, 1.0, seed)
        tokens = sampled_by(list(prompt), max_tokens, config, flip=nodes[1] == S)
        doc = _doc([TEXTS[t] for t in tokens])
        return Asked(doc, nodes)


class SampledReference(TinyModel):
    corpus_ids = list(range(V)) * 3
    stop_ids = STOPS

    def logits(self, ids: list[int]) -> torch.Tensor:
        return table(list(ids))

    def served_logits(self, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        from node.verifier.scoring import served_logits

        return served_logits(self.head, self.shards, prompt, tokens, "float32")


async def test_worker_sampled_challenges_score_by_replay_with_the_committed_seed(tmp_path) -> None:
    link = FakeLink(epoch=3)
    settings = WorkerSettings(
        home=tmp_path,
        challenges_per_epoch=2,
        prompt_tokens=4,
        continuation_tokens=8,
        operator_key=None,
        sampled_per_epoch=2,
        sampled_tokens=48,
    )
    asker = SamplingAsker()
    worker = VerifierWorker(settings, SampledReference(), CredibilityMap(8050, 16963), asker, link)
    worker.run_challenge = _skip  # type: ignore[method-assign]  # echo: test_verifier_worker.py
    await worker.step()  # epoch 3: commits the seed of 4, no challenges
    await worker.settle()
    link.epoch = 4
    for _ in range(6):
        await worker.step()
    secret = worker.seeds.get(4)
    assert secret is not None
    assert asker.seeds == [sampling_seed(secret, 4, 0), sampling_seed(secret, 4, 1)]
    scores = json.loads((tmp_path / SCORES_FILE).read_text())
    assert scores["epoch"] == 4 and scores["scores"] == {A: 1_000_000, B: 1_000_000, S: 0}


async def _skip(*_args: object) -> None:
    return None
