"""The move sequence of a rebalancing agent (node/agent/mover.py `Rebalancer`) with in-process
fakes of the committee, the chain and the node processes: make before break, the re-checks,
the drain bound, the churn bound, and when a decision is taken at all."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from node.agent.mover import FetchFailed, Rebalancer, Replacement
from node.agent.rebalance import RebalancePolicy
from protocol.committee.registry import MoveShards

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


ME = key("me")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Committee:
    """`/nodes` and `/params` of a pool held here (a list the test changes)."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.reads = 0

    async def query(self, path: str, **params: Any) -> Any:
        if path == "/params":
            return {"genesis": {"replica_floor": 2}}
        assert path == "/nodes" and params == {"model": MODEL, "role": "compute"}
        self.reads += 1
        return {"nodes": [dict(n) for n in self.nodes]}

    def add(self, name: str, shard: int, status: str = "SERVING") -> None:
        self.nodes.append(
            {
                "key": key(name),
                "model": MODEL,
                "role": "compute",
                "shards": [shard],
                "status": status,
                "routable": status == "SERVING",
            }
        )

    def set(self, name: str, **fields: Any) -> None:
        for node in self.nodes:
            if node["key"] == key(name):
                node.update(fields)


class Host:
    """Node processes as events; a new one answers /health after `load_polls` looks."""

    def __init__(self, clock: Clock, events: list[Any], *, load_polls: int = 3) -> None:
        self.clock = clock
        self.events = events
        self.load_polls = load_polls
        self.sessions = [2, 1, 0]  # the old process's live sessions, look by look
        self.on_health: Any = None

        self.missing: set[int] = set()  # shard files not on disk
        self.fetch_fails: str | None = None  # the reason a fetch fails, or None: it succeeds

    def available(self, shard: int) -> bool:
        return shard not in self.missing

    def has_origin(self) -> bool:
        return False

    async def fetch(self, shard: int) -> str:
        self.events.append(("fetch", shard))
        if self.fetch_fails is not None:
            raise FetchFailed(self.fetch_fails)
        self.missing.discard(shard)
        return "6 chunks"

    async def start(self, shard: int) -> Replacement:
        self.events.append(("start", shard))
        return Replacement(shard, f"https://127.0.0.1:{18200 + shard}", f"proc-{shard}")

    async def healthy(self, replacement: Replacement) -> bool:
        self.clock.t += 1
        self.load_polls -= 1
        if self.on_health is not None:
            self.on_health()
        return self.load_polls <= 0

    async def live_sessions(self, old: Any) -> int | None:
        self.clock.t += 1
        left = self.sessions.pop(0) if len(self.sessions) > 1 else self.sessions[0]
        self.events.append(("sessions", old, left))
        return left

    async def discard(self, replacement: Replacement) -> None:
        self.events.append(("discard", replacement.handle))

    async def adopt(self, replacement: Replacement) -> Any:
        self.events.append(("adopt", replacement.handle))
        return "proc-old"

    async def stop(self, old: Any) -> None:
        self.events.append(("stop", old))


class Chain:
    def __init__(self, committee: Committee, events: list[Any], code: int = 0) -> None:
        self.committee = committee
        self.events = events
        self.code = code

    async def send(self, body: Any) -> tuple[int, str]:
        self.events.append(("send", body))
        if self.code == 0:
            self.committee.set("me", shards=list(body.shards))
        return self.code, "" if self.code == 0 else "refused"


def setup(
    *, code: int = 0, policy: RebalancePolicy | None = None
) -> tuple[Rebalancer, Committee, Host, list[Any], Clock]:
    """me and n1 on shard 0, n2 on shard 1, shard 2's node DOWN: shard 2 is empty."""
    committee = Committee([])
    committee.add("me", 0)
    committee.add("n1", 0)
    committee.add("n2", 1)
    committee.add("gone", 2, "DOWN")
    clock, events = Clock(), []
    host = Host(clock, events)
    moved: list[Any] = []

    async def on_moved(shard: int, endpoint: str) -> None:
        events.append(("on_moved", shard, endpoint))
        moved.append(shard)

    rebalancer = Rebalancer(
        key=ME,
        model=MODEL,
        shard_count=3,
        link=committee,
        host=host,
        chain=Chain(committee, events, code),
        policy=policy or RebalancePolicy(max_jitter_s=0.0, drain_s=30.0),
        on_moved=on_moved,
        clock=clock,
    )
    rebalancer.poll_s = 0.0
    return rebalancer, committee, host, events, clock


async def _step_and_finish(rebalancer: Rebalancer, height: int) -> Any:
    decision = await rebalancer.step(height, asyncio.Event())
    if rebalancer.task is not None:
        await rebalancer.task
    return decision


def test_move_makes_before_it_breaks_and_drains_the_old_node() -> None:
    rebalancer, _, _, events, _ = setup()
    decision = asyncio.run(_step_and_finish(rebalancer, 10))
    assert decision.move and decision.target == 2
    kinds = [e[0] for e in events]
    # the new process loads first; the chain hears of the move only once it answers
    assert kinds[0] == "start" and events[1] == (
        "send",
        MoveShards((2,), "https://127.0.0.1:18202"),
    )
    assert kinds[2:4] == ["on_moved", "adopt"]
    # the old process's sessions finish (2, 1, 0), then it stops; the new one is never discarded
    looks = [e[2] for e in events if e[0] == "sessions"]
    assert looks[:3] == [2, 1, 0] and set(looks[3:]) <= {0}  # it lingers linger_s (5 s) at least
    assert 5 <= len(looks) <= 7
    assert events[-1] == ("stop", "proc-old") and "discard" not in kinds
    assert rebalancer.moves == 1


def test_a_shard_filled_while_loading_is_not_joined() -> None:
    rebalancer, committee, host, events, _ = setup()
    host.on_health = lambda: committee.set("gone", status="SERVING", routable=True)
    asyncio.run(_step_and_finish(rebalancer, 10))
    assert [e[0] for e in events] == ["start", "discard"]  # no move_shards sent
    assert not rebalancer.decisions[-1].move
    assert rebalancer.moves == 0


def test_a_refused_move_stops_the_new_process_and_keeps_the_old() -> None:
    rebalancer, _, _, events, _ = setup(code=101)
    asyncio.run(_step_and_finish(rebalancer, 10))
    assert [e[0] for e in events] == ["start", "send", "discard"]
    assert "refused move_shards: code 101" in rebalancer.decisions[-1].reason


def test_live_sessions_past_the_drain_bound_are_cut() -> None:
    rebalancer, _, host, events, _clock = setup()
    host.sessions = [3]  # they never finish
    asyncio.run(_step_and_finish(rebalancer, 10))
    looks = [e for e in events if e[0] == "sessions"]
    assert 25 <= len(looks) <= 35  # one a (fake) second for drain_s = 30
    assert events[-1] == ("stop", "proc-old")


def test_a_node_that_does_not_load_in_time_stays() -> None:
    policy = RebalancePolicy(max_jitter_s=0.0, load_timeout_s=5.0)
    rebalancer, _, host, events, _ = setup(policy=policy)
    host.load_polls = 1_000
    asyncio.run(_step_and_finish(rebalancer, 10))
    assert [e[0] for e in events] == ["start", "discard"]
    assert "did not load within 5 s" in rebalancer.decisions[-1].reason


def test_stopping_the_agent_mid_load_stops_the_new_process() -> None:
    async def scenario() -> list[Any]:
        rebalancer, _, host, events, _ = setup()
        rebalancer.poll_s = 0.01
        host.load_polls = 10**9
        await rebalancer.step(10, asyncio.Event())
        await asyncio.sleep(0.05)
        await rebalancer.close()
        return events

    events = asyncio.run(scenario())
    assert events[0] == ("start", 2) and events[-1] == ("discard", "proc-2")


def test_decisions_come_periodically_and_on_pool_changes_only() -> None:
    async def scenario() -> tuple[list[Any], Rebalancer, Committee]:
        rebalancer, committee, _, _, _ = setup(policy=RebalancePolicy(every_blocks=30))
        committee.set("gone", status="SERVING", routable=True)  # nothing to gain
        taken = [await rebalancer.step(h, asyncio.Event()) for h in range(1, 20)]
        committee.set("gone", status="DOWN", routable=False)  # the pool changes at height 20
        taken += [await rebalancer.step(h, asyncio.Event()) for h in (20, 21)]
        if rebalancer.task is not None:
            await rebalancer.close()
        return taken, rebalancer, committee

    taken, _rebalancer, committee = asyncio.run(scenario())
    made = [(h + 1, d) for h, d in enumerate(taken) if d is not None]
    # the first look, then the change, seen at the next watch (every 2 blocks: 1, 3, …, 21)
    assert [h for h, _ in made] == [1, 21]
    assert not made[0][1].move and made[1][1].move
    assert committee.reads == 11


def test_one_move_per_cooldown() -> None:
    rebalancer, committee, _, _events, clock = setup(
        policy=RebalancePolicy(max_jitter_s=0.0, cooldown_s=600.0, drain_s=1.0)
    )
    asyncio.run(_step_and_finish(rebalancer, 10))
    assert rebalancer.moves == 1
    committee.set("n2", status="DOWN", routable=False)  # now shard 1 is empty; me on 2, n1 on 0
    committee.add("n3", 2)
    decision = asyncio.run(_step_and_finish(rebalancer, 12))
    assert not decision.move and "at most one move per 600 s" in decision.reason
    clock.t += 600
    decision = asyncio.run(_step_and_finish(rebalancer, 50))
    assert decision.move and decision.target == 1 and rebalancer.moves == 2


def test_a_missing_target_file_is_fetched_before_the_new_process_starts() -> None:
    rebalancer, committee, host, events, _ = setup()
    committee.set("gone", status="SERVING", routable=False)  # serves chunks, not routable
    host.missing = {2}
    decision = asyncio.run(_step_and_finish(rebalancer, 10))
    assert decision.move and decision.target == 2 and decision.fetch
    kinds = [e[0] for e in events]
    assert kinds[:3] == ["fetch", "start", "send"]  # fetched while the old shard serves
    assert rebalancer.moves == 1 and events[-1] == ("stop", "proc-old")


def test_a_failed_fetch_leaves_the_node_where_it_is_with_one_line_why() -> None:
    rebalancer, committee, host, events, clock = setup()
    committee.set("gone", status="SERVING", routable=False)
    host.missing = {2}
    host.fetch_fails = "3 of 6 chunks of shard 2 are missing and no peer is left"
    asyncio.run(_step_and_finish(rebalancer, 10))
    assert events == [("fetch", 2)]  # nothing started, nothing sent, the old process untouched
    assert rebalancer.moves == 0 and rebalancer.last_move_s is None
    last = rebalancer.decisions[-1]
    assert not last.move and last.target == 0
    assert last.line() == (
        "rebalance: stayed on shard 0: could not fetch shard 2's file: 3 of 6 chunks of "
        "shard 2 are missing and no peer is left"
    )
    # the failing source is not asked again at every look: only after the cooldown
    clock.t += 60
    again = asyncio.run(_step_and_finish(rebalancer, 10 + 30))
    assert not again.move and "fetching its file failed less than 600 s ago" in again.line()
    clock.t += 600
    host.fetch_fails = None
    moved = asyncio.run(_step_and_finish(rebalancer, 10 + 60))
    assert moved.move and rebalancer.moves == 1


def test_an_empty_shard_whose_file_has_no_source_is_not_moved_to() -> None:
    rebalancer, _, host, events, _ = setup()  # shard 2's only node is DOWN, no origin
    host.missing = {2}
    decision = asyncio.run(_step_and_finish(rebalancer, 10))
    assert not decision.move and events == []
    assert "no node serves it and no origin is known" in decision.line()
