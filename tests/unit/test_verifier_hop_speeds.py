"""One-hop probes in the verifier's speed estimate (node/verifier/hop_probe.py, speeds.py steps
5 and 6; issue 44): the verifier times ONE node on its own clock, so the estimate tells how a
circuit's time divides between shards (which whole circuits never tell), a node that answers
slowly lowers only its own speed, and nothing a node says about itself is read."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from pathlib import Path

import pytest

from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.verifier.hop_probe import HopProbe, HopResult, saturate, time_hop
from node.verifier.hop_session import ProbeRows, probe_rows, run_probe
from node.verifier.speeds import (
    MIN_TIMED_TOKENS,
    WINDOW_EPOCHS,
    EpochSpeeds,
    HopTimed,
    Timed,
    hop_times,
    node_speeds,
    stage_times,
)
from protocol.fingerprint import Tolerance
from protocol.speeds import is_speed
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit

TOKENS = 32
LAYERS = 10
SESSIONS = 4  # a probe's sessions at once
# fp32 shards: one decode step and the verifier's prefill agree within a few fp16 ULPs
EXACT_ENOUGH = Tolerance(max_ulp=8, min_match_per_mille=900, max_mean_ulp_milli=4000)
# shard 1 costs 3× shard 0 and shard 2 2×: whole circuits cannot tell (the gauge), so the
# circuit-only estimate splits every circuit's time evenly between the shards
TRUTH = {"a0": 0.010, "b0": 0.020, "a1": 0.030, "b1": 0.060, "a2": 0.020, "b2": 0.025}
SHARDS = [["a0", "b0"], ["a1", "b1"], ["a2", "b2"]]
SHARD_OF = {n: k for k, nodes in enumerate(SHARDS) for n in nodes}
SCORED = dict.fromkeys(TRUTH, 1_000_000)


def circuits(truth: dict[str, float], extra: dict[str, float] | None = None) -> list[Timed]:
    """Every circuit of one node per shard, timed at the sum of its nodes' seconds per token
    (+ `extra` per token for a node that delays what passes through it)."""
    extra = extra or {}
    return [
        Timed(c, TOKENS, TOKENS * sum(truth[n] + extra.get(n, 0.0) for n in c))
        for c in itertools.product(*SHARDS)
    ]


class Clock:
    """The verifier's monotonic clock, advanced by the fake nodes as they compute."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_node(clock: Clock, per_position_s: float, answer: dict[str, object]):
    """A node computing one frame after another, `per_position_s` each, that answers `answer`
    with the position as its output (unless `answer` names one)."""

    async def step(session: int, position: int) -> object:
        await asyncio.sleep(0)  # the sessions' frames interleave
        clock.now += per_position_s
        return {**answer, "output": answer.get("output", (session, position))}

    return step


def right(session: int, position: int, answer: object) -> bool:
    """The verifier's recomputation: the output is (session, position); only `output` is read."""
    return isinstance(answer, dict) and answer.get("output") == (session, position)


def probe(
    speeds: EpochSpeeds, node: str, per_position_s: float, answer: dict[str, object] | None = None
) -> HopResult:
    """Time `node` alone over SESSIONS × TOKENS // SESSIONS positions and note the probe as
    the worker would."""
    clock = Clock()
    asked = HopProbe(node, SHARD_OF[node], LAYERS, SESSIONS, TOKENS // SESSIONS)
    step = fake_node(clock, per_position_s, answer or {})
    result = asyncio.run(time_hop(asked, step, right, clock))
    speeds.note_hop(asked.node, asked.shard, asked.layers, asked.work, result.seconds,
                    result.clean)  # fmt: skip
    return result


def measured(
    truth: dict[str, float],
    probed: list[str],
    *,
    circuit_extra: dict[str, float] | None = None,
    probe_extra: dict[str, float] | None = None,
) -> dict[str, int]:
    """The speeds a verifier reports after timing every circuit and probing `probed`."""
    speeds = EpochSpeeds()
    for t in circuits(truth, circuit_extra):
        speeds.note(t.nodes, t.tokens, t.seconds, clean=True)
    for node in probed:
        probe(speeds, node, truth[node] + (probe_extra or {}).get(node, 0.0))
    return speeds.of(SCORED)


def own(truth: dict[str, float]) -> dict[str, int]:
    return {n: math.floor(round(1 / t, 6)) for n, t in truth.items()}


def test_probes_of_every_node_separate_the_shards_whole_circuits_cannot() -> None:
    assert measured(TRUTH, list(TRUTH)) == own(TRUTH)  # 100, 50 | 33, 16 | 50, 40
    # circuits alone: the even split reads shard 1's nodes faster than they are
    alone = node_speeds(circuits(TRUTH))
    assert alone["a1"] > own(TRUTH)["a1"] and alone["a0"] < own(TRUTH)["a0"]


def test_one_probed_node_per_shard_anchors_the_others_at_the_measured_differences() -> None:
    speeds = EpochSpeeds()
    for t in circuits(TRUTH):
        speeds.note(t.nodes, t.tokens, t.seconds, clean=True)
    for node in ("a0", "b1", "a2"):  # one node of each shard probed
        probe(speeds, node, TRUTH[node])
    times = stage_times((t for _, t in speeds.timed), (h for _, h in speeds.hops))
    assert times == pytest.approx(TRUTH, rel=1e-9)


@pytest.mark.parametrize("slow", sorted(TRUTH))
def test_a_node_that_answers_slowly_on_purpose_lowers_only_its_own_speed(slow: str) -> None:
    honest = measured(TRUTH, list(TRUTH))
    others = {n: v for n, v in honest.items() if n != slow}
    # it holds every frame 50 ms: in the circuits it is in and when probed alone (as the
    # fastest node of its shard, its slowness moved the circuit-only estimate's even split)
    delay = {slow: 0.050}
    lying = measured(TRUTH, list(TRUTH), circuit_extra=delay, probe_extra=delay)
    assert lying[slow] < honest[slow]
    assert {n: v for n, v in lying.items() if n != slow} == others
    # slow in the circuits only (it answers probes at its pace): still nobody else moves
    circuits_only = measured(TRUTH, list(TRUTH), circuit_extra=delay)
    assert {n: v for n, v in circuits_only.items() if n != slow} == others


def test_a_lone_node_slow_on_purpose_does_not_slow_the_rest_of_its_circuit() -> None:
    # one node a shard: one circuit, whose time the circuit-only estimate splits evenly
    truth = {"x": 0.010, "y": 0.010, "z": 0.010}
    speeds = EpochSpeeds()
    speeds.note(("x", "y", "z"), TOKENS, TOKENS * (0.010 + 0.110 + 0.010), clean=True)
    for node, shard, per_position in (("x", 0, 0.010), ("y", 1, 0.110), ("z", 2, 0.010)):
        clock = Clock()
        asked = HopProbe(node, shard, LAYERS, SESSIONS, TOKENS // SESSIONS)
        result = asyncio.run(time_hop(asked, fake_node(clock, per_position, {}), right, clock))
        speeds.note_hop(node, shard, LAYERS, asked.work, result.seconds, result.clean)
    assert speeds.of(dict.fromkeys(truth, 1)) == {"x": 100, "y": 9, "z": 100}


def test_what_a_node_says_about_its_speed_layers_or_compute_time_is_ignored() -> None:
    honest = EpochSpeeds()
    boasting = EpochSpeeds()
    probe(honest, "a0", TRUTH["a0"])
    claims = {"compute_ms": 0.001, "layers": [0, 1000], "speed": 100_000, "shard": 2, "tok_s": 1e9}
    result = probe(boasting, "a0", TRUTH["a0"], claims)
    assert result.clean
    assert boasting.of(SCORED) == honest.of(SCORED) == {"a0": 100}
    assert boasting.hops[0][1].layers == LAYERS and boasting.hops[0][1].shard == 0


def test_a_fast_wrong_answer_is_credited_nothing() -> None:
    speeds = EpochSpeeds()
    result = probe(speeds, "a0", 1e-6, {"output": "made up"})  # instant, and wrong
    assert not result.clean
    assert speeds.hops == [] and speeds.of(SCORED) == {}


def test_a_probe_after_a_move_is_read_per_layer_on_the_latest_shard() -> None:
    speeds = EpochSpeeds()
    # 1 ms a layer: probed on a 10-layer shard, then moved to a 20-layer one and probed slower
    assert speeds.note_hop("m", 0, 10, TOKENS, TOKENS * 0.010, clean=True) == 100
    assert speeds.note_hop("m", 1, 20, TOKENS, TOKENS * 0.030, clean=True) == 33
    assert hop_times(h for _, h in speeds.hops) == pytest.approx({"m": 0.020})  # its best u × 20
    assert speeds.of({"m": 1}) == {"m": 50}


@pytest.mark.parametrize(
    "layers, positions, seconds",
    [
        (LAYERS, TOKENS, 0.0),  # instant
        (LAYERS, TOKENS, -1.0),  # a clock gone backwards
        (LAYERS, TOKENS, 1e300),  # near-endless
        (LAYERS, 10**30, 1.0),  # a huge count
        (10**30, TOKENS, 1e-300),  # past any float
    ],
)
def test_degenerate_probes_give_integers_within_the_chains_bounds(
    layers: int, positions: int, seconds: float
) -> None:
    speeds = EpochSpeeds()
    assert is_speed(speeds.note_hop("x", 0, layers, positions, seconds, clean=True))
    for t in circuits(TRUTH):
        speeds.note(t.nodes, t.tokens, t.seconds, clean=True)
    reported = speeds.of({**SCORED, "x": 1})
    assert reported and all(is_speed(v) for v in reported.values()), reported


@pytest.mark.parametrize(
    "layers, positions, seconds, clean",
    [
        (LAYERS, TOKENS, 1.0, False),  # an output was wrong
        (LAYERS, MIN_TIMED_TOKENS - 1, 1.0, True),  # too few positions
        (0, TOKENS, 1.0, True),  # no layers
        (LAYERS, TOKENS, math.nan, True),
        (LAYERS, TOKENS, math.inf, True),
    ],
)
def test_probes_that_do_not_count_are_not_kept(
    layers: int, positions: int, seconds: float, clean: bool
) -> None:
    speeds = EpochSpeeds()
    assert speeds.note_hop("x", 0, layers, positions, seconds, clean) is None
    assert speeds.hops == []


def test_probes_are_carried_for_the_window_only() -> None:
    speeds = EpochSpeeds(epoch=10)
    speeds.note_hop("x", 0, LAYERS, TOKENS, TOKENS * 0.010, clean=True)
    kept = speeds.carry(10 + WINDOW_EPOCHS - 1)
    assert [h for _, h in kept.hops] == [HopTimed("x", 0, LAYERS, TOKENS, TOKENS * 0.010)]
    assert speeds.carry(10 + WINDOW_EPOCHS).hops == []


def test_one_wrong_answer_in_any_session_makes_the_probe_not_clean() -> None:
    clock = Clock()
    honest = fake_node(clock, 0.001, {})

    async def one_bad(session: int, position: int) -> object:
        answer = await honest(session, position)
        return {"output": "skipped"} if (session, position) == (2, 5) else answer

    asked = HopProbe("a0", 0, LAYERS, SESSIONS, 8)
    assert asyncio.run(time_hop(asked, honest, right, clock)).clean
    assert not asyncio.run(time_hop(asked, one_bad, right, clock)).clean
    none = HopProbe("a0", 0, LAYERS, 0, 8)  # no session: nothing was timed
    assert not asyncio.run(time_hop(none, honest, right, clock)).clean


def link_bound(stage_s: float, round_trip_s: float, positions: int = 8):
    """A node computing one frame after another behind a link of `round_trip_s`: the seconds
    of a probe of n sessions (busy all along, or waiting on the link with too few)."""

    async def run(sessions: int) -> HopResult:
        busy = sessions * positions * stage_s + round_trip_s
        waiting = positions * (stage_s + round_trip_s) + (sessions - 1) * stage_s
        return HopResult(max(busy, waiting), clean=True)

    return run


def test_saturate_doubles_the_sessions_until_the_link_is_hidden() -> None:
    # 8 ms a position behind a 40 ms round trip: 4 sessions wait on the link, 8 keep it busy
    # (16 gain under 10 % more: the last doubling)
    sessions, result = asyncio.run(saturate(link_bound(0.008, 0.040), 8))
    assert sessions == 16
    assert result.seconds / (sessions * 8) == pytest.approx(0.008, rel=0.1)
    # one session a probe would read it 6× slower: the link, not the node
    single = asyncio.run(link_bound(0.008, 0.040)(1))
    assert single.seconds / 8 == pytest.approx(0.048)


def test_saturate_never_reads_a_node_faster_than_it_computes_whatever_it_delays() -> None:
    honest = link_bound(0.008, 0.0)

    async def slower_when_larger(sessions: int) -> HopResult:  # delays the larger probes
        result = await honest(sessions)
        return HopResult(result.seconds * (1 + sessions / 4), clean=True)

    for run in (honest, slower_when_larger):
        sessions, result = asyncio.run(saturate(run, 8))
        assert result.seconds / (sessions * 8) >= 0.008


def test_saturate_credits_nothing_once_an_answer_is_wrong() -> None:
    async def wrong_when_larger(sessions: int) -> HopResult:
        return HopResult(sessions * 8 * 0.001, clean=sessions < 8)

    assert asyncio.run(saturate(wrong_when_larger, 8)) is None


# ---- the live probe against a real in-process node (tiny model) ------------------------------


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-hop")
    make_tiny_model(root / "src", layers=6, hidden=64, tied=False)
    return prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None)


def _rows(manifest: Path, probed: int, wrong: bool = False) -> ProbeRows:
    head = ClientHead.load(manifest, device="cpu")
    shards = [ShardModel.load(manifest, k, device="cpu") for k in range(3)]
    reference = shards[(probed + 1) % 3] if wrong else shards[probed]
    tokens = [[(7 * s + 3 * p) % 90 + 5 for p in range(8)] for s in range(SESSIONS)]
    return probe_rows(head.embed, shards[:probed], reference, tokens)


async def test_a_live_probe_times_one_node_alone_and_checks_every_answer(
    aiohttp_server, tiny_split, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = tiny_split
    config = ServerConfig(manifest_path=manifest, shard_id=1)
    _, hops = await serve_circuit(aiohttp_server, [(config, ModelShardBackend(manifest, 1))])
    hop = Hop(url=hops[0].url, shard=1)  # the node at shard 1, as the last hop
    probe = HopProbe("node-1", 1, 2, SESSIONS, 8)  # 6 layers in 3 parts: 2 a shard
    speeds = EpochSpeeds()
    async with CircuitClient([hop], hidden_size=64) as client:
        result = await run_probe(client, probe, _rows(manifest, 1), EXACT_ENOUGH)
        assert result.clean and result.seconds > 0
        assert is_speed(speeds.note_hop("node-1", 1, 2, probe.work, result.seconds, True))
        # checked against another shard's outputs: the answers are wrong, nothing credited
        with caplog.at_level(logging.WARNING, logger="node.verifier.hop_session"):
            wrong = await run_probe(client, probe, _rows(manifest, 1, wrong=True), EXACT_ENOUGH)
        assert not wrong.clean
        # and the verifier's log says why (an unclean probe credits nothing: it was silent)
        said = [r.getMessage() for r in caplog.records if "hop probe not clean" in r.getMessage()]
        assert said and all("off the verifier's own" in line for line in said), said
