"""A verifier's measurement of decode speed (node/verifier/speeds.py, issue 44): the asker times
each completion on its own clock, the worker keeps a clean sampled answer's time (never a
dishonest circuit's), solves each node's own speed from its circuits (test_verifier_speed_
estimate.py), and writes the speeds of the nodes it scores into `reputation_scores.json` beside
their scores."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import node.verifier.asker as asker_module
from node.verifier.asker import Asked, PersonalAsker
from node.verifier.report import SCORES_FILE, scores_report
from node.verifier.scoring import CredibilityMap
from node.verifier.speeds import MIN_TIMED_TOKENS, EpochSpeeds, decode_speed
from node.verifier.worker import VerifierWorker, WorkerSettings
from protocol.errors import UsageError
from protocol.speeds import MAX_SPEED
from tests.unit.test_verifier_sampled import SampledReference, SamplingAsker, _skip
from tests.unit.test_verifier_worker import A, B, FakeLink, S

pytestmark = pytest.mark.unit


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_decode_speed_is_integer_tokens_per_second_within_the_chains_bounds() -> None:
    assert decode_speed(48, 2.0) == 24
    assert decode_speed(10, 3.0) == 3  # floored
    assert decode_speed(8, 100.0) == 1  # slower than a token a second: the floor of 1
    assert decode_speed(50, 0.0) == MAX_SPEED and decode_speed(10**9, 1.0) == MAX_SPEED


def test_epoch_speeds_keep_clean_circuits_only_with_enough_tokens() -> None:
    speeds = EpochSpeeds()
    assert speeds.note((A, B), 48, 4.0, clean=True) == 12  # the circuit's own speed, logged
    assert speeds.note((A, S), 48, 0.5, clean=False) is None  # fast by not computing: no credit
    assert speeds.note((A, B), MIN_TIMED_TOKENS - 1, 0.01, clean=True) is None  # mostly prefill
    assert speeds.note((A, S), 48, 2.0, clean=True) == 24
    assert [t.nodes for _, t in speeds.timed] == [(A, B), (A, S)]
    # per node: A + B = 1/12 s a token, A + S = 1/24 s; shards split evenly: A and S 1/48 s
    assert speeds.of({A: 1_000_000, B: 1_000_000}) == {A: 48, B: 16}  # scored nodes only


async def test_personal_asker_times_the_completion_on_its_clock(monkeypatch) -> None:
    clock = FakeClock()

    async def complete(_http: Any, _url: str, _body: Any, _auth: str) -> tuple[Any, Any]:
        clock.now += 2.5  # the circuit decodes for 2.5 s
        return {"choices": []}, {"paid_with": "credits", "nodes": [A, B]}

    monkeypatch.setattr(asker_module, "_complete", complete)
    asker = PersonalAsker("http://127.0.0.1:1", None, "0x" + "00" * 32, "t", clock=clock)  # type: ignore[arg-type]
    asked = await asker._ask({"model": "m"})
    assert asked.nodes == (A, B) and asked.seconds == 2.5


class TimedAsker(SamplingAsker):
    """The gateway of test_verifier_sampled.py, each answer timed on a fake clock: the honest
    circuit (A, B) decodes 48 tokens in 2 s, the substitute (A, S) in 0.25 s (it skips work)."""

    async def ask_sampled(self, prompt, *, max_tokens: int, seed: int, temperature: float):
        asked: Asked = await super().ask_sampled(
            prompt, max_tokens=max_tokens, seed=seed, temperature=temperature
        )
        seconds = 0.25 if S in asked.nodes else 2.0
        return dataclasses.replace(asked, seconds=seconds)


async def test_worker_reports_the_speed_of_clean_circuits_beside_their_scores(tmp_path) -> None:
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
    asker = TimedAsker()
    worker = VerifierWorker(settings, SampledReference(), CredibilityMap(8050, 16963), asker, link)
    worker.run_challenge = _skip  # type: ignore[method-assign]
    await worker.step()  # epoch 3: commits the seed of 4
    await worker.settle()
    link.epoch = 4
    for _ in range(6):
        await worker.step()
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert report["scores"] == {A: 1_000_000, B: 1_000_000, S: 0}
    # 48 checked tokens in 2 s through (A, B): 1/24 s a token, 1/48 s each (split evenly: one
    # circuit says nothing of how); the substitute's fast answer credits nobody (S, nor A)
    assert report["speeds"] == {A: 48, B: 48}


def test_the_scores_file_refuses_a_speed_of_an_unscored_node_or_out_of_bounds() -> None:
    assert scores_report(4, {A: 1}, speeds={A: 5})["speeds"] == {A: 5}
    assert "speeds" not in scores_report(4, {A: 1}, speeds={})
    for speeds in ({B: 5}, {A: 0}, {A: MAX_SPEED + 1}, {A: True}):
        with pytest.raises(UsageError):
            scores_report(4, {A: 1}, speeds=speeds)
