"""Failover mid-answer (node/client/failover.py, node/client/replicas.py) with real tiny models on
in-process nodes: a hop that goes away or freezes mid-answer is replaced by a replica, the
history is replayed at the same positions, and the greedy tokens equal a run without failure;
the replacement's first decode frame starts at position N (Petals #587); retries are bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web

from node.client.costs import CostBook
from node.client.failover import FailoverPolicy, generate
from node.client.replicas import ReplicaCircuits
from node.client.speculation import SpeculationConfig, SpeculationStats
from node.client.types import Hop, Timings
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.app import STATE_KEY, create_app
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.next_hops import ForwardList
from protocol.errors import UnavailableError
from tests.doubles.choice import FirstOrLast
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 12
H = 64


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Path]:
    root = tmp_path_factory.mktemp("tiny-failover")
    model = make_tiny_model(root / "src", layers=4, hidden=H, tied=False)
    manifest = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    return root, model, Path(manifest)


def _expected(model: Any, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    return out[0, len(ids) :].tolist()


class _Freezable:
    """A backend whose forward blocks (like a SIGSTOPped process) once `frozen` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.frozen = threading.Event()
        self.thawed = threading.Event()
        self.slow_s = 0.0  # added to every forward (a slow node)
        self.hiccups: list[float] = []  # added to the next one-position forwards, one each

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, hidden: np.ndarray, positions: np.ndarray, cache: Any) -> np.ndarray:
        if self.frozen.is_set():
            self.thawed.wait(30)
        decode = hidden.shape[1] == 1
        time.sleep(self.slow_s + (self.hiccups.pop(0) if decode and self.hiccups else 0.0))
        return self.inner.forward(hidden, positions, cache)

    def forward_batch(self, hidden: np.ndarray, positions: np.ndarray, caches: Any) -> np.ndarray:
        if self.frozen.is_set():
            self.thawed.wait(30)
        time.sleep(self.slow_s)
        return self.inner.forward_batch(hidden, positions, caches)


async def _nodes(aiohttp_server: Any, manifest: Path, shards: list[int]) -> tuple[list, list]:
    """One in-process node per entry of `shards`; each may forward to any of them. Returns the
    servers, and per node the (start, count) of every forward it ran, in order."""
    servers, frames = [], []
    for shard in shards:
        backend = _Freezable(ModelShardBackend(manifest, shard, device="cpu"))
        app = create_app(ServerConfig(manifest_path=manifest, shard_id=shard), backend)

        @web.middleware
        async def freeze_health(request: web.Request, handler: Any, backend=backend) -> Any:
            if request.path == "/health" and backend.frozen.is_set():
                await asyncio.sleep(60)  # a frozen process answers nothing
            return await handler(request)

        app.middlewares.insert(0, freeze_health)
        seen: list[tuple[int, int]] = []
        app[STATE_KEY].forward_hooks.append(
            lambda _tag, positions, _in, _out, seen=seen: seen.append(
                (int(positions[0]), len(positions))
            )
        )
        servers.append(await aiohttp_server(app))
        frames.append(seen)
    urls = frozenset(str(s.make_url("")).rstrip("/") for s in servers)
    for shard, server in zip(shards, servers, strict=True):
        server.app[STATE_KEY].next_hops = ForwardList(shard, urls)
    return servers, frames


def _hops(servers: list, shards: list[int]) -> list[Hop]:
    return [
        Hop(url=str(s.make_url("")).rstrip("/"), shard=shard)
        for s, shard in zip(servers, shards, strict=True)
    ]


def _source(http: aiohttp.ClientSession, manifest: Path, hops: list[Hop]) -> ReplicaCircuits:
    from node.model.manifest import Manifest

    loaded = Manifest.load(manifest)
    expected = {s.shard_id: (loaded.model_hash, s.layers) for s in loaded.shards}
    return ReplicaCircuits(http, hops, expected=expected, hidden_size=H, prefill_chunk=5)


async def _answer(
    source: ReplicaCircuits,
    head: Any,
    ids: list[int],
    on_token: Any = None,
    speculation: SpeculationConfig | None = None,
    stats: SpeculationStats | None = None,
    timings: Timings | None = None,
    **policy: Any,
):
    timings = timings if timings is not None else Timings()
    tokens: list[int] = []
    async for token in generate(
        source,
        head,
        ids,
        max_new_tokens=STEPS,
        stop_on_eos=False,
        timings=timings,
        policy=FailoverPolicy(backoff_s=0.01, **policy),
        speculation=speculation,
        stats=stats,
    ):
        tokens.append(token)
        if on_token is not None:
            await on_token(len(tokens))
    return tokens, timings


@pytest.mark.parametrize("kill_at", [1, 5, STEPS - 2])
async def test_failover_hop_gone_mid_answer_replica_continues_same_greedy_tokens(
    aiohttp_server, tiny, kill_at
):
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, frames = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)
        killed: list[int] = []

        async def on_token(count: int) -> None:
            if count == kill_at:
                index = hops.index(source.current[1])
                killed.append(index)
                await servers[index].close()

        tokens, timings = await _answer(source, head, ids, on_token)
    assert tokens == _expected(model, ids)
    (failover,) = timings.failovers
    assert failover.hops == (1,)
    # the failed node answered the prompt and the steps before the kill
    assert failover.served == len(ids) + kill_at - 1
    # the replacement got the whole history at positions 0 … N-1, then continued at N
    n = len(ids) + kill_at
    assert failover.replayed == n
    replacement = frames[({1, 2} - set(killed)).pop()]
    positions = [p for start, count in replacement for p in range(start, start + count)]
    assert positions == list(range(len(ids) + STEPS - 1))
    replay_end = next(i for i, (s, c) in enumerate(replacement) if s + c == n)
    assert replacement[replay_end + 1] == (n, 1)  # the first step after the replay: position N
    # the prompt's own chunks (5) are kept; the fed tokens follow as their own chunk(s)
    assert replacement[0] == (0, 5) and (len(ids), min(5, kill_at)) in replacement
    assert failover.recovery_ms > 0 and failover.replay_ms > 0


async def test_failover_while_speculating_replays_only_chosen_tokens_and_stays_exact(
    aiohttp_server, tiny
):
    """Speculative passes (guesses + rewind) on a circuit whose hop dies mid-answer: the
    replacement replays the prompt and the chosen tokens only, and greedy tokens are those of
    plain decoding."""
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    stats = SpeculationStats()
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)

        async def on_token(count: int) -> None:
            if count == STEPS // 2:
                await servers[hops.index(source.current[1])].close()

        speculation = SpeculationConfig(lookahead=4, min_ngram=1)
        tokens, timings = await _answer(source, head, ids, on_token, speculation, stats)
    assert tokens == _expected(model, ids)
    (failover,) = timings.failovers
    assert failover.hops == (1,)
    assert len(ids) < failover.replayed <= len(ids) + STEPS // 2 + 4  # no guess replayed
    assert stats.proposed > 0 and stats.passes > 0
    assert timings.new_tokens == STEPS and timings.decode_steps == STEPS - 1


async def test_failover_first_hop_gone_upstream_replaced_and_exact(aiohttp_server, tiny):
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 0, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)

        async def on_token(count: int) -> None:
            if count == 4:
                await servers[hops.index(source.current[0])].close()

        tokens, timings = await _answer(source, head, ids, on_token)
    assert tokens == _expected(model, ids)
    assert [f.hops for f in timings.failovers] == [(0,)]
    assert source.circuits[0][0] != source.circuits[1][0]
    assert source.circuits[0][1] == source.circuits[1][1]  # the healthy hop stays


async def test_failover_frozen_hop_stall_found_by_health_probe_and_replaced(aiohttp_server, tiny):
    """A hop that stops answering (SIGSTOP-like: its forward and /health hang) is found by the
    stall timeout and the /health probe, and replaced; tokens unchanged."""
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    frozen: list[Any] = []
    try:
        async with aiohttp.ClientSession() as http:
            source = _source(http, manifest, hops)
            source.probe_timeout_s = 0.5

            async def on_token(count: int) -> None:
                if count == 3:
                    backend = servers[hops.index(source.current[1])].app[STATE_KEY].backend
                    backend.frozen.set()
                    frozen.append(backend)

            tokens, timings = await _answer(source, head, ids, on_token, stall_s=1.0)
    finally:
        for backend in frozen:
            backend.thawed.set()
    assert tokens == _expected(model, ids)
    (failover,) = timings.failovers
    assert failover.code == "unavailable" and failover.hops == (1,)
    assert failover.recovery_ms >= 500  # the /health probe waited for the frozen node


async def test_failover_bounded_attempts_then_the_last_error(aiohttp_server, tiny):
    """Every node of shard 1 gone: each replacement fails; after `attempts` the error is
    raised, one failover record per failed circuit, with backoff between them."""
    _, _, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)

        async def on_token(count: int) -> None:
            if count == 2:
                await servers[1].close()
                await servers[2].close()

        with pytest.raises(UnavailableError):
            await _answer(source, head, ids, on_token, attempts=2)
    assert len(source.circuits) == 3  # the first circuit and two replacements


async def test_a_slow_node_on_trial_is_left_after_its_first_passes_and_tokens_stay_exact(
    aiohttp_server, tiny
):
    """Shard 1 has a fast node (seen by an earlier question) and a slow one not seen yet: the
    next question tries the slow one, and after its first MIN_OBSERVED_PASSES decode passes
    moves to the fast one (the history replayed at the same positions), not at the end of the
    answer; the slow node is not avoided or marked failed, the record says `outpriced` and what
    it served; greedy tokens are those of the model. The fast node on trial is kept: only a
    slow one is left.

    Slow is relative to what the cost book measured of the two, on whatever load the machine
    has: the slow node adds 0.1 s plus twice the fast node's seen pass and both nodes' claimed
    costs to each forward (on a loaded box the fast circuit's passes and the /info round
    trips grow too, and a fixed +0.1 s was once within 2x of them: no move). The book's clock
    stands still, so the claims measured in the first answer are those the trial is judged
    against (no /info refresh mid-test)."""
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    pick = FirstOrLast()
    from node.model.manifest import Manifest

    loaded = Manifest.load(manifest)
    expected = {s.shard_id: (loaded.model_hash, s.layers) for s in loaded.shards}
    async with aiohttp.ClientSession() as http:
        book = CostBook(rng=pick, clock=lambda: 1000.0)  # stands still: see the docstring
        source = ReplicaCircuits(http, hops, expected=expected, hidden_size=H, costs=book)

        async def nothing(count: int) -> None:
            pass

        first_hop = servers[0].app[STATE_KEY]
        first, quiet = await _answer(source, head, ids, nothing)  # nothing seen: the first
        assert source.circuits == [(hops[0], hops[1])] and quiet.failovers == []
        unmoved = first_hop.forwards
        fast_seen = book.get(hops[1].url).seen_s
        assert fast_seen is not None  # its passes were observed
        # beyond 2x the fast node's checked cost whatever the load made of the measurements
        # (node/client/costs.py `outpriced`: the seen passes minus the fast node's share)
        claims = book.cost_s(hops[1].url) + book.cost_s(hops[2].url)
        servers[2].app[STATE_KEY].backend.slow_s = 0.1 + 2 * (fast_seen + claims)
        pick.last = True  # the slow node, tied with the fast one as the cheapest: tried
        tokens, timings = await _answer(source, head, ids, nothing)
        # the replay sends the prompt and the answer so far as two frames (`split_at`), which
        # stand in for the 4th token's decode pass: a move costs the first hop one frame more
        # (the count tests/integration/test_gateway_network.py expects of a move)
        assert first_hop.forwards - unmoved == unmoved + 1
        rtt_after = source.costs.get(hops[2].url).rtt_s
        # the fast node's passes forgotten, the slow one's not: the fast one is tried, and kept
        source.costs.get(hops[1].url).seen_at_s = float("-inf")
        pick.last = False  # (beside only one node seen, claims alone price the two alike)
        again, kept = await _answer(source, head, ids, nothing)
    assert first == tokens == again == _expected(model, ids)
    assert source.circuits[1:] == [(hops[0], hops[2]), (hops[0], hops[1]), (hops[0], hops[1])]
    (moved,) = timings.failovers
    assert moved.code == "outpriced" and moved.hops == (1,)
    # the slow circuit served the prompt and three decode passes; the replay adds the 4th token
    assert moved.served == len(ids) + 3 and moved.replayed == len(ids) + 4
    assert moved.recovery_ms > 0
    assert not source._avoided(hops[2]) and rtt_after is not None and rtt_after < 0.1
    assert source.costs.get(hops[2].url).trials == 1  # backed off: not the cheapest for 120 s
    assert kept.failovers == [] and source.costs.get(hops[1].url).trials == 1


async def test_one_hiccup_in_a_trial_nodes_first_passes_does_not_move_the_question(
    aiohttp_server, tiny
):
    """A node on trial as fast as its replica but with one slow decode pass (a page-in, the
    box's other load) among its first MIN_OBSERVED_PASSES: judged on the median pass, it keeps
    the question (the mean of the three would price it far above the seen replica)."""
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    pick = FirstOrLast()
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)
        # slack for a loaded machine's pass times (tens of ms, the tiny model's passes are a
        # few): the mean with the 0.5 s hiccup (~170 ms a pass) is still far beyond it
        source.costs = CostBook(rng=pick, slack_s=0.05)

        async def nothing(count: int) -> None:
            pass

        await _answer(source, head, ids, nothing)  # the first node of shard 1 seen
        pick.last = True  # the other one, not seen: tried
        servers[2].app[STATE_KEY].backend.hiccups = [0.5]
        tokens, timings = await _answer(source, head, ids, nothing)
    assert source.circuits[1:] == [(hops[0], hops[2])]
    assert timings.failovers == [] and tokens == _expected(model, ids)
    assert source.costs.get(hops[2].url).trials == 1  # it was a trial


async def _hang_up_when(task: asyncio.Task, ready: Any) -> None:
    """Cancel `task` (the client hung up) once `ready()` holds and the replay has begun."""
    for _ in range(400):
        if ready():
            break
        await asyncio.sleep(0.05)
    assert ready(), "the replacement circuit was never leased"
    await asyncio.sleep(0.3)  # its replay is under way, frozen on the replica
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("cause", ["node_gone", "outpriced"])
async def test_a_hang_up_during_the_replay_keeps_the_left_circuits_record(
    aiohttp_server, tiny, cause
):
    """The question leaves a circuit (its shard-1 node killed, or on trial and slow), and the
    client hangs up while the replacement replays the history (frozen here, so the replay is
    surely under way). What the left circuit served is still recorded: the records are how each
    circuit is paid (node/gateway/engine.py `served_circuit`), and a record lost here left the
    hosted gateway unable to close the question's payment."""
    _, _, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    pick = FirstOrLast()
    replica = servers[2].app[STATE_KEY].backend
    timings = Timings()
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)
        source.costs = CostBook(rng=pick)

        async def nothing(count: int) -> None:
            pass

        if cause == "outpriced":
            await _answer(source, head, ids, nothing)  # the fast node of shard 1 seen
            pick.last = True  # the slow one, not seen: tried, and left after its first passes
            servers[2].app[STATE_KEY].backend.slow_s = 0.1
            replica = servers[1].app[STATE_KEY].backend
        kill_at = 3

        async def on_token(count: int) -> None:
            replica.frozen.set()  # the replacement hangs in its replay
            if cause == "node_gone" and count == kill_at:
                await servers[1].close()

        leased = len(source.circuits)
        task = asyncio.create_task(
            _answer(source, head, ids, on_token, timings=timings, stall_s=30)
        )
        try:
            await _hang_up_when(task, lambda: len(source.circuits) == leased + 2)
        finally:
            replica.thawed.set()
    (left,) = timings.failovers
    assert (left.code == "outpriced") == (cause == "outpriced") and left.hops == (1,)
    served = len(ids) + (kill_at - 1 if cause == "node_gone" else 3)
    assert left.served == served and left.replayed == 0


async def test_failover_policy_backoff_doubles_and_is_capped():
    policy = FailoverPolicy(backoff_s=0.1, backoff_max_s=0.3)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]


class _StaleOnce:
    """A next-hop policy whose view does not list the first next hop it is asked about yet (a
    committee view read just before that node registered or moved), then does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.refused: list[str] = []

    async def check(self, hop: Any) -> None:
        from protocol.stream import NextHopNotAllowedError

        if not self.refused:
            self.refused.append(hop.url)
            raise NextHopNotAllowedError(f"{hop.url} is not a routable compute node (yet)")
        await self.inner.check(hop)


async def test_failover_next_hop_refused_by_policy_replaces_the_next_hop_not_the_refuser(
    aiohttp_server, tiny
):
    """Issue 44: a hop that refuses its open with `next_hop_not_allowed` followed its policy;
    the hop it names (its next) is replaced, and only briefly suspected (not avoided: the
    refuser's word); the refuser stays. Tokens unchanged."""
    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    stale = _StaleOnce(servers[0].app[STATE_KEY].next_hops)
    servers[0].app[STATE_KEY].next_hops = stale
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)
        tokens, timings = await _answer(source, head, ids)
    assert tokens == _expected(model, ids)
    assert [(f.code, f.hops) for f in timings.failovers] == [("next_hop_not_allowed", (1,))]
    first, second = source.circuits
    assert first[1].url == stale.refused[0] and second[1] != first[1]
    assert second[0] == first[0]  # the refuser stays
    assert not source._avoided(first[1]) and not source._avoided(first[0])


async def test_failover_a_hop_naming_next_hops_twice_is_replaced_itself(aiohttp_server, tiny):
    """A hop refusing every next hop (`next_hop_not_allowed`, e.g. hostile) is believed once
    per answer: the second time it names one, it is replaced too, as failed, so it cannot fail
    answers for free while the hops it names sit out."""
    from protocol.stream import NextHopNotAllowedError

    _, model, manifest = tiny
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 0, 1]
    servers, _ = await _nodes(aiohttp_server, manifest, shards)
    hops = _hops(servers, shards)
    hostile: list[str] = []  # the shard-0 node the first circuit goes through refuses all

    class _RefusesAll:
        def __init__(self, url: str, inner: Any) -> None:
            self.url, self.inner = url, inner

        async def check(self, hop: Any) -> None:
            if not hostile:
                hostile.append(self.url)
            if hostile[0] == self.url:
                raise NextHopNotAllowedError(f"{hop.url} is not a routable compute node")
            await self.inner.check(hop)

    for server, hop in zip(servers[:2], hops[:2], strict=True):
        state = server.app[STATE_KEY]
        state.next_hops = _RefusesAll(hop.url, state.next_hops)
    async with aiohttp.ClientSession() as http:
        source = _source(http, manifest, hops)
        tokens, timings = await _answer(source, head, ids)
    assert tokens == _expected(model, ids)
    assert [f.hops for f in timings.failovers] == [(1,), (0, 1)]
    assert source.circuits[0][0].url == hostile[0] != source.circuits[-1][0].url
    assert source._avoided(source.circuits[0][0])  # the refuser, as failed
    assert not source._avoided(source.circuits[0][1])  # the node it named: not avoided
