"""Speculative decoding through a circuit (node/client/speculation.py): prompt lookup, the
acceptance rules, and real tiny models on in-process nodes giving plain greedy decoding's
tokens while every hop rewinds its KV cache on the rejected guesses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from node.client.circuit import CircuitClient
from node.client.sampling import SamplingConfig, sample
from node.client.speculation import (
    SpeculationConfig,
    SpeculationStats,
    distribution,
    propose,
    verify,
)
from node.client.types import Timings
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.app import STATE_KEY
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from protocol.errors import ConfigError, RemoteError
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit

PROMPTS = [
    "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2",
    "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2 w3 w4 w1 w2",  # repetitive: guesses get accepted
]
STEPS = 16


# ------------------------------------------------------------------------------ proposing
def test_propose_continues_the_most_recent_occurrence_of_the_longest_suffix() -> None:
    config = SpeculationConfig(lookahead=3, max_ngram=2, min_ngram=1)
    # suffix (5, 6) occurred at 0 and at 4: the more recent one's continuation wins
    assert propose([5, 6, 1, 2, 5, 6, 3, 4, 9, 5, 6], config) == [3, 4, 9]
    # no 2-gram match; the 1-gram 7 occurred at index 1
    assert propose([1, 7, 8, 9, 2, 7], config) == [8, 9, 2]
    assert propose([1, 2, 3], config) == []  # nothing repeats
    one = SpeculationConfig(lookahead=5, max_ngram=1, min_ngram=1)
    assert propose([4, 4], one) == [4]  # cut at the end
    assert propose([], config) == []


def test_speculation_config_bounds() -> None:
    with pytest.raises(ConfigError):
        SpeculationConfig(lookahead=0).validate()
    with pytest.raises(ConfigError):
        SpeculationConfig(lookahead=17).validate()
    with pytest.raises(ConfigError):
        SpeculationConfig(min_ngram=3, max_ngram=2).validate()


# ------------------------------------------------------------------------------ accepting
def test_verify_greedy_keeps_the_matching_prefix_then_the_models_token() -> None:
    rows = np.eye(6, dtype=np.float32)[[2, 3, 4, 5]]  # argmax per row: 2, 3, 4, 5
    rng = np.random.default_rng(0)
    greedy = SamplingConfig()
    assert verify(rows, [2, 3, 4], greedy, rng) == [2, 3, 4, 5]  # all kept + bonus
    assert verify(rows, [2, 0, 4], greedy, rng) == [2, 3]  # second guess wrong
    assert verify(rows, [1, 3, 4], greedy, rng) == [2]
    assert verify(rows[:1], [], greedy, rng) == [2]


def test_distribution_is_what_sample_draws_from() -> None:
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0], dtype=np.float32)
    config = SamplingConfig(temperature=0.8, top_p=0.9)
    probs = distribution(logits, config)
    assert probs.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    draws = np.bincount([sample(logits, config, rng) for _ in range(20000)], minlength=5)
    np.testing.assert_allclose(draws / 20000, probs, atol=0.015)
    assert probs[3] == 0.0  # outside the nucleus


def test_verify_sampled_tokens_follow_the_models_distribution() -> None:
    """Speculative sampling with a point-mass guess: the first token is distributed as p of
    row 0 whatever was guessed, and the second (after a kept guess) as p of row 1."""
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(2, 5)).astype(np.float32) * 1.5
    config = SamplingConfig(temperature=1.0)
    p0, p1 = distribution(rows[0], config), distribution(rows[1], config)
    guess = int(np.argsort(p0)[2])  # a middling guess: both branches happen often
    trials = 30000
    first = np.zeros(5)
    second = np.zeros(5)
    for _ in range(trials):
        tokens = verify(rows, [guess], config, rng)
        first[tokens[0]] += 1
        if len(tokens) == 2:
            second[tokens[1]] += 1
    np.testing.assert_allclose(first / trials, p0, atol=0.012)
    np.testing.assert_allclose(second / second.sum(), p1, atol=0.02)


# ------------------------------------------------------------------------------ circuits
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("tiny-spec")
    model = make_tiny_model(root / "src", layers=5, hidden=64, tied=False)
    manifest = prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None)
    return manifest, model


async def _circuit(aiohttp_server, manifest: Path):
    return await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=manifest, shard_id=shard),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(3)
        ],
    )


@pytest.mark.parametrize("prompt", PROMPTS)
async def test_speculative_greedy_tokens_equal_plain_circuit_decoding(aiohttp_server, tiny, prompt):
    manifest, model = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(prompt)
    _servers, hops = await _circuit(aiohttp_server, manifest)
    stats = SpeculationStats()
    timings = Timings()
    async with CircuitClient(hops, hidden_size=64, prefill_chunk=5) as client:
        plain = [
            t async for t in client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
        ]
        spec = [
            t
            async for t in client.generate(
                head,
                ids,
                max_new_tokens=STEPS,
                speculation=SpeculationConfig(lookahead=4),
                stats=stats,
                timings=timings,
                stop_on_eos=False,
            )
        ]
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )[0, len(ids) :].tolist()
    assert plain == expected
    assert spec == expected
    assert stats.passes + stats.accepted == STEPS - 1  # every token after the first
    assert timings.new_tokens == STEPS and timings.decode_steps == STEPS - 1
    # guesses were made and some rejected: every hop rewound and stayed exact
    assert stats.proposed > stats.accepted
    if prompt == PROMPTS[1]:
        assert stats.accepted > 0 and stats.passes < STEPS - 1


async def test_rewind_flag_past_the_cache_is_refused_by_name(aiohttp_server, tiny):
    manifest, _ = tiny
    head = ClientHead.load(manifest, device="cpu")
    _, hops = await _circuit(aiohttp_server, manifest)
    async with CircuitClient(hops, hidden_size=64) as client:
        sid = await client.open("r" * 43)
        await client.send(sid, 0, head.embed_np([1, 2, 3]))
        await client.receive(sid, 2, 1)
        # rewind to 1 then on: accepted (positions 1, 2 recomputed)
        await client.send(sid, 1, head.embed_np([5, 6]), last_only=False, rewind=True)
        await client.receive(sid, 1, 2)
        # a rewind flag does not allow a gap
        await client.send(sid, 4, head.embed_np([5]), rewind=True)
        with pytest.raises(RemoteError) as refused:
            await client.receive(sid, 4, 1)
        assert refused.value.code == "bad_positions"
        # nor does a start below the cache without the flag
        await client.send(sid, 1, head.embed_np([5]))
        with pytest.raises(RemoteError) as refused:
            await client.receive(sid, 1, 1)
        assert refused.value.code == "bad_positions"
        await client.close(sid)


async def test_sampled_speculation_runs_and_stays_in_step(aiohttp_server, tiny):
    """Sampled decoding through the circuit: every pass's rows answer where they were sent
    (the caches rewound in step), the tokens are in the vocabulary."""
    manifest, _ = tiny
    head = ClientHead.load(manifest, device="cpu")
    servers, hops = await _circuit(aiohttp_server, manifest)
    stats = SpeculationStats()
    async with CircuitClient(hops, hidden_size=64) as client:
        tokens = [
            t
            async for t in client.generate(
                head,
                head.encode(PROMPTS[1]),
                max_new_tokens=STEPS,
                sampling=SamplingConfig(temperature=0.7, seed=3),
                stats=stats,
                stop_on_eos=False,
            )
        ]
    assert len(tokens) == STEPS and all(0 <= t < head.vocab_size for t in tokens)
    assert stats.passes + stats.accepted == STEPS - 1
    lengths = {st.app[STATE_KEY].tokens for st in servers}
    assert len(lengths) == 1  # every hop computed the same positions
