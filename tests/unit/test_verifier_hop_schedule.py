"""The worker's one-node timings (issue 44): which nodes a verifier times alone each epoch
(node/verifier/hop_schedule.py: drawn with the epoch's seed among routable nodes, unprobed ones
first, bounded), how the worker runs them (node/verifier/worker.py step 3b: one after each
challenge, a clean timing into the epoch's speeds, a failed one nowhere) and a live run of
`HopRunner` against a real in-process node."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.next_hops import parse_ranges
from node.server.span_backend import SpanBackend
from node.verifier.hop_runner import HopRunner, Timing
from node.verifier.hop_schedule import (
    HopSettings,
    ProbeTarget,
    candidates,
    choose,
    probe_tokens,
)
from node.verifier.report import SCORES_FILE
from node.verifier.scoring import CredibilityMap
from node.verifier.worker import VerifierWorker, WorkerSettings
from protocol.fingerprint import Tolerance
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.stream_circuit import serve_circuit
from tests.unit.test_verifier_worker import OPERATOR, A, B, FakeAsker, FakeLink, FakeReference

pytestmark = pytest.mark.unit

SEED = bytes(range(32))
EXACT_ENOUGH = Tolerance(max_ulp=8, min_match_per_mille=900, max_mean_ulp_milli=4000)


def _entry(key: str, shard: int = 0, *, routable: bool = True, price: Any = None) -> dict:
    entry: dict[str, Any] = {
        "key": key,
        "endpoint": f"http://127.0.0.1:{46000 + int(key[:2], 16)}",
        "shards": [shard],
        "routable": routable,
    }
    if price is not None:
        entry["prices"] = {str(shard): price}
    return entry


KEYS = [f"{i:02x}" * 32 for i in range(1, 11)]
NODES = candidates([_entry(k, i % 2) for i, k in enumerate(KEYS)], 2)


# ---- which nodes ----------------------------------------------------------------------------


def test_the_choice_is_the_seeds_and_the_epochs_and_bounded() -> None:
    def pick(seed: bytes, epoch: int, count: int = 3) -> list[str]:
        chosen = choose(NODES, seed=seed, epoch=epoch, count=count, recent=(), can_pay=False)
        return [t.key for t in chosen]

    first = pick(SEED, 7)
    assert len(first) == 3 and len(set(first)) == 3
    assert pick(SEED, 7) == first  # deterministic given the seed and the epoch
    others = {tuple(pick(bytes([s]) * 32, 7)) for s in range(8)}
    assert len(others) > 1  # another seed, another draw
    assert {tuple(pick(SEED, e)) for e in range(8)} != {tuple(first)}  # and another epoch
    assert pick(SEED, 7, count=0) == []
    assert sorted(pick(SEED, 7, count=99)) == sorted(KEYS)  # never more than there are


def test_nodes_without_a_probe_in_the_window_go_first() -> None:
    recent = set(KEYS[:8])
    chosen = choose(NODES, seed=SEED, epoch=1, count=3, recent=recent, can_pay=False)
    assert {t.key for t in chosen[:2]} == set(KEYS[8:])
    assert chosen[2].key in recent  # then the others, in the draw's order


def test_only_routable_well_formed_dialable_nodes_and_charging_ones_only_with_credits() -> None:
    entries = [
        _entry(KEYS[0]),
        _entry(KEYS[1], routable=False),
        _entry(KEYS[2], shard=5),  # no such shard
        {**_entry(KEYS[3]), "shards": [0, 2]},  # not one contiguous run
        {**_entry(KEYS[4]), "endpoint": "ftp://x:1"},
        {**_entry(KEYS[5]), "key": "zz" * 32},
        _entry(KEYS[6], price=64),  # charging
        _entry(KEYS[7], price=0),  # free on the chain
        "not a node",
    ]
    found = candidates(entries, 2)
    assert [t.key for t in found] == [KEYS[0], KEYS[6], KEYS[7]]
    assert [t.price for t in found] == [None, 64, 0]

    def keys(**kw: Any) -> set[str]:
        return {t.key for t in choose(found, seed=SEED, epoch=1, count=9, recent=(), **kw)}

    assert keys(can_pay=False) == {KEYS[0], KEYS[7]}
    assert keys(can_pay=True) == {KEYS[0], KEYS[6], KEYS[7]}
    refused = f"http://127.0.0.1:{46000 + int(KEYS[0][:2], 16)}"
    assert keys(can_pay=True, allowed=lambda url: url != refused) == {KEYS[6], KEYS[7]}


def test_a_span_is_a_target_timed_as_one_hop_and_charging_when_any_shard_charges() -> None:
    span = {**_entry(KEYS[0]), "shards": [1, 2], "prices": {"1": 0, "2": 64}}
    past = {**_entry(KEYS[1]), "shards": [2, 3]}  # past the model's 3 shards
    free = {**_entry(KEYS[2]), "shards": [0, 1], "prices": {"0": 0, "1": 0}}
    found = candidates([span, past, free], 3)
    assert [(t.key, t.span.shards) for t in found] == [(KEYS[0], (1, 2)), (KEYS[2], (0, 1))]
    assert found[0].prices() == ((1, 0), (2, 64)) and found[0].charging
    assert found[1].prices() == ((0, 0), (1, 0)) and not found[1].charging
    assert candidates([_entry(KEYS[3], 1)], 3)[0].last is None  # one shard: no span
    chosen = choose(found, seed=SEED, epoch=1, count=9, recent=(), can_pay=False)
    assert [t.key for t in chosen] == [KEYS[2]]


def test_the_address_policy_dials_private_endpoints_only_in_allowed_ranges() -> None:
    reference = SimpleNamespace(shards=[None, None])
    public = HopRunner(reference, EXACT_ENOUGH, HopSettings())
    assert not public.allowed("http://127.0.0.1:46001")
    assert public.allowed("https://8.8.8.8:8443")
    devnet = HopRunner(
        reference, EXACT_ENOUGH, HopSettings(), private_ranges=parse_ranges("127.0.0.0/8")
    )
    assert devnet.allowed("http://127.0.0.1:46001") and not devnet.allowed("http://10.0.0.1:1")


def test_each_probe_round_and_session_steps_fresh_tokens_of_the_vocabulary() -> None:
    one = probe_tokens(SEED, 3, KEYS[0], 0, 4, 20, 50)
    assert one == probe_tokens(SEED, 3, KEYS[0], 0, 4, 20, 50)
    assert len(one) == 4 and all(len(s) == 20 and all(0 <= t < 50 for t in s) for s in one)
    assert len({tuple(s) for s in one}) == 4
    assert probe_tokens(SEED, 3, KEYS[0], 1, 4, 20, 50) != one  # the next round
    assert probe_tokens(SEED, 3, KEYS[1], 0, 4, 20, 50) != one  # another node


@pytest.mark.parametrize(
    "settings",
    [
        HopSettings(per_epoch=-1),
        HopSettings(per_epoch=65),
        HopSettings(sessions=8, most_sessions=4),
        HopSettings(sessions=4, most_sessions=64),
        HopSettings(positions=0),
        HopSettings(sessions=1, most_sessions=1, positions=4),  # 4 positions: never counts
    ],
)
def test_settings_out_of_bounds_are_refused(settings: HopSettings) -> None:
    assert settings.problem() is not None


def test_the_defaults_are_sane() -> None:
    assert HopSettings().problem() is None
    assert HopSettings(per_epoch=1, sessions=4, most_sessions=4).problem() is None


# ---- the worker runs them -------------------------------------------------------------------


class NodesLink(FakeLink):
    async def nodes(self, **filters: Any) -> list[dict[str, Any]]:
        self.queried.append("/nodes")
        return [_entry(A, 0), _entry(B, 1)]


class FakeHops(HopRunner):
    """A runner whose `time_node` answers from a table (None: the node refused or erred)."""

    def __init__(self, seconds: dict[str, float | None], per_epoch: int = 2) -> None:
        layers = SimpleNamespace(layers=(0, 3))
        reference = SimpleNamespace(shards=[layers] * 2, model_hash="sha256:" + "00" * 32)
        super().__init__(
            reference,
            EXACT_ENOUGH,
            HopSettings(per_epoch=per_epoch),
            private_ranges=parse_ranges("127.0.0.0/8"),
        )
        self.seconds = seconds
        self.timed: list[tuple[str, int]] = []

    async def time_node(self, target: ProbeTarget, seed: bytes, epoch: int) -> Timing | None:
        self.timed.append((target.key, epoch))
        seconds = self.seconds[target.key]
        if seconds is None:
            return None
        return Timing(target.key, target.shard, 3, 32, seconds, 4)


def _worker(tmp_path: Path, link: FakeLink, hops: HopRunner | None) -> VerifierWorker:
    settings = WorkerSettings(
        home=tmp_path,
        challenges_per_epoch=2,
        prompt_tokens=4,
        continuation_tokens=8,
        operator_key=OPERATOR,
        challenge_source="corpus",
        sampled_per_epoch=0,
    )
    return VerifierWorker(
        settings, FakeReference(), CredibilityMap(8050, 16963), FakeAsker(), link, hops
    )


async def _epoch(worker: VerifierWorker, link: FakeLink, epoch: int, steps: int) -> None:
    link.epoch = epoch
    for _ in range(steps):
        await worker.step()
        await worker.settle()


async def test_the_worker_times_the_drawn_nodes_once_each_and_reports_their_speed(
    tmp_path: Path,
) -> None:
    link = NodesLink(epoch=3)
    hops = FakeHops({A: 0.032, B: 0.096})  # 32 positions: 1 ms and 3 ms a position
    worker = _worker(tmp_path, link, hops)
    await _epoch(worker, link, 3, 1)  # no seed of its own for epoch 3: nothing asked
    assert hops.timed == []
    await _epoch(worker, link, 4, 4)  # 2 challenges, 2 probes: one after each challenge
    assert sorted(hops.timed) == [(A, 4), (B, 4)]
    state = worker.state
    assert state is not None and not state.pending
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    # no sampled check ran: the speeds are the probes' own (1 / 1 ms, 1 / 3 ms), nothing else
    assert report["speeds"] == {A: 1000, B: 333}
    await worker.step()  # the epoch's work is done: no node is timed twice
    assert len(hops.timed) == 2


async def test_a_node_that_refuses_or_errs_gets_no_timing(tmp_path: Path) -> None:
    link = NodesLink(epoch=3)
    hops = FakeHops({A: None, B: 0.096})
    worker = _worker(tmp_path, link, hops)
    await _epoch(worker, link, 3, 1)
    await _epoch(worker, link, 4, 4)
    assert sorted(hops.timed) == [(A, 4), (B, 4)]
    state = worker.state
    assert state is not None and [h.node for _, h in state.speeds.hops] == [B]
    report = json.loads((tmp_path / SCORES_FILE).read_text())
    assert report["speeds"] == {B: 333}  # A scored, but timed by nothing: no speed
    assert A in report["scores"]


async def test_a_bounded_number_a_epoch_and_the_unprobed_ones_next(tmp_path: Path) -> None:
    link = NodesLink(epoch=3)
    hops = FakeHops({A: 0.032, B: 0.096}, per_epoch=1)
    worker = _worker(tmp_path, link, hops)
    await _epoch(worker, link, 3, 1)
    await _epoch(worker, link, 4, 3)
    await _epoch(worker, link, 5, 3)
    assert [e for _, e in hops.timed] == [4, 5]  # one a epoch
    assert {k for k, _ in hops.timed} == {A, B}  # the one not timed in the window goes next


async def test_without_a_runner_the_worker_times_nothing(tmp_path: Path) -> None:
    link = NodesLink(epoch=3)
    worker = _worker(tmp_path, link, None)
    await _epoch(worker, link, 3, 1)
    await _epoch(worker, link, 4, 3)
    assert "/nodes" not in link.queried
    state = worker.state
    assert state is not None and state.speeds.hops == []


# ---- the runner against a real in-process node ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-runner")
    make_tiny_model(root / "src", layers=6, hidden=64, tied=False)
    return prepare(root / "src", parts=3, out=root / "p3", progress=lambda _: None)


async def test_the_runner_times_a_real_node_alone_and_not_one_serving_another_shard(
    aiohttp_server, tiny_split
) -> None:
    manifest = tiny_split
    config = ServerConfig(manifest_path=manifest, shard_id=1)
    _, hops = await serve_circuit(aiohttp_server, [(config, ModelShardBackend(manifest, 1))])
    reference = SimpleNamespace(
        head=ClientHead.load(manifest, device="cpu"),
        shards=[ShardModel.load(manifest, k, device="cpu") for k in range(3)],
        model_hash="sha256:" + "00" * 32,
    )
    runner = HopRunner(
        reference,
        EXACT_ENOUGH,
        HopSettings(per_epoch=1, sessions=4, most_sessions=8, positions=4),
        private_ranges=parse_ranges("127.0.0.0/8"),
    )
    key = "ab" * 32
    timed = await runner.time_node(ProbeTarget(key, hops[0].url, 1, None), SEED, 4)
    assert timed is not None and timed.node == key and timed.layers == 2
    assert timed.sessions in (4, 8) and timed.positions == timed.sessions * 4
    assert timed.seconds > 0
    # the same node asked as shard 2 (outputs of shard 1, not 2): wrong, no timing
    assert await runner.time_node(ProbeTarget(key, hops[0].url, 2, None), SEED, 4) is None
    # a node that is not there: no timing
    gone = ProbeTarget(key, "http://127.0.0.1:9", 1, None)
    assert await runner.time_node(gone, SEED, 4) is None


@pytest.fixture(scope="module")
def tiny_quarters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 shards of one layer each: a span of two is as deep as one shard of `tiny_split` (the
    random tiny model's top-k rows have near-ties that more layers of rounding can swap)."""
    root = tmp_path_factory.mktemp("tiny-quarters")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    return prepare(root / "src", parts=4, out=root / "p4", progress=lambda _: None)


async def test_the_runner_times_a_span_node_as_one_hop_through_all_its_layers(
    aiohttp_server, tiny_quarters
) -> None:
    manifest = tiny_quarters
    config = ServerConfig(manifest_path=manifest, shard_id=1, last_shard=2)
    span = SpanBackend([ModelShardBackend(manifest, s, device="cpu") for s in (1, 2)])
    _, hops = await serve_circuit(aiohttp_server, [(config, span)])
    reference = SimpleNamespace(
        head=ClientHead.load(manifest, device="cpu"),
        shards=[ShardModel.load(manifest, k, device="cpu") for k in range(4)],
        model_hash="sha256:" + "00" * 32,
    )
    settings = HopSettings(per_epoch=1, sessions=4, most_sessions=4, positions=4)
    runner = HopRunner(
        reference, EXACT_ENOUGH, settings, private_ranges=parse_ranges("127.0.0.0/8")
    )
    key = "cd" * 32
    url = hops[0].url
    timed = await runner.time_node(ProbeTarget(key, url, 1, None, last=2), SEED, 4)
    assert timed is not None and (timed.node, timed.shard, timed.layers) == (key, 1, 2)
    assert timed.positions == 16 and timed.seconds > 0
    # the span asked as shard 1 alone: its answer is shard 2's output, wrong for shard 1
    assert await runner.time_node(ProbeTarget(key, url, 1, None), SEED, 4) is None
