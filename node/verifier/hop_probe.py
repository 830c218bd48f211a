"""A verifier's one-hop probe: how much ONE node computes, on the verifier's own clock.

Whole circuits' times cannot tell how a circuit's time divides between its shards
(speeds.py, step 3); one node timed alone can. The verifier holds every shard (it recomputes
spot-check tickets with them), so it computes a shard's input itself, opens sessions at the
node as the circuit's LAST hop (an `open` without `next`: every node serves as a last hop,
node/server/next_hops.py) and steps positions through them one at a time, as a decode does:

    probe = HopProbe(node=key, shard=k, layers=manifest_layers[k], sessions=4, positions=8)
    timed = await time_hop(probe, step, check)           # HopResult(seconds, clean)
    speeds.note_hop(probe.node, probe.shard, probe.layers, probe.work,
                    timed.seconds, timed.clean)

`sessions` sessions run at once, each stepping its `positions` positions in order, so that the
node always has a frame to compute while others travel: the time is then the node's compute
over `sessions × positions` positions plus about one round trip, not `positions` round trips
(a probe of one session would time the link as much as the node: with a 10 ms round trip and
an 8 ms stage, a node 4× faster than another would read 2.3× faster). Enough sessions keep the
node busy through the round trip: `sessions ≥ 1 + round trip ÷ stage time`, which the verifier
does not know in advance, so `saturate` doubles them (4, 8, 16, 32) until the rate per
position stops improving by `SATURATED_GAIN` and keeps the fastest clean probe. No number of
sessions can make a node read faster than it computes (the time is at least its compute over
all the positions), so the choice only decides how close to its true rate the probe gets. A
node that batches concurrent sessions is timed at what it really serves, which is what a
pool's throughput counts.

`step(session, position)` sends that session's frame and awaits the node's answer;
`check(session, position, answer)` compares the answer's output with the verifier's own
recomputation (the calibrated tolerance of the shard's quantization). The time runs from
before the first `step` to after the last answer, on `clock` (the verifier's monotonic clock).
Nothing the node says is read but the outputs `check` judges: a node that reports how long it
took, which layers it holds or how fast it is changes nothing (the layers are the verifier's
manifest's, the key the one it dialled); a node that answers fast with wrong outputs is not
clean, and a probe that is not clean is credited nothing (`note_hop` drops it). A node that
answers slowly on purpose is timed slowly: only its own probe, and so only its own speed, is
slower. It cannot answer faster than it computes: every session's inputs are fresh and every
output is checked.

Run live by the worker each epoch: hop_session.py (`step`/`check` over a one-hop circuit),
hop_runner.py (one node, paid as any question), hop_schedule.py (which nodes, how much).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

FIRST_SESSIONS = 4  # sessions of the first probe `saturate` runs
MOST_SESSIONS = 32  # and the most it doubles to
SATURATED_GAIN = 0.10  # a doubling that improves the rate per position less than this stops

Step = Callable[[int, int], Awaitable[object]]  # send (session, position), await the answer
Check = Callable[[int, int, object], bool]  # that answer's output is the verifier's own
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class HopProbe:
    """Which node the verifier times and on what: its key (the one dialled), the shard sent,
    that shard's layer count from the verifier's manifest, the sessions run at once and the
    positions each steps."""

    node: str
    shard: int
    layers: int
    sessions: int
    positions: int

    @property
    def work(self) -> int:
        """Positions the node computes over the probe."""
        return self.sessions * self.positions


@dataclass(frozen=True, slots=True)
class HopResult:
    """The probe's seconds on the verifier's clock and whether every output was right."""

    seconds: float
    clean: bool


async def time_hop(
    probe: HopProbe, step: Step, check: Check, clock: Clock = time.monotonic
) -> HopResult:
    """Run the probe's sessions at once, each stepping its positions in order; the time they
    took together and whether every answer passed `check` (a session stops at its first wrong
    answer, and the probe is then not clean)."""

    async def session(index: int) -> bool:
        for position in range(probe.positions):
            if not check(index, position, await step(index, position)):
                return False
        return True

    started = clock()
    async with asyncio.TaskGroup() as group:
        runs = [group.create_task(session(i)) for i in range(probe.sessions)]
    seconds = clock() - started
    return HopResult(seconds, clean=probe.sessions > 0 and all(r.result() for r in runs))


async def saturate(
    run: Callable[[int], Awaitable[HopResult]],
    positions: int,
    first: int = FIRST_SESSIONS,
    most: int = MOST_SESSIONS,
) -> tuple[int, HopResult] | None:
    """`run(sessions)` probes the node with that many sessions of `positions` positions; the
    sessions are doubled from `first` up to `most` while a doubling makes the seconds per
    position at least `SATURATED_GAIN` smaller. The fastest clean probe per position and its
    sessions, or None at the first probe that is not clean (a wrong answer ends it)."""
    best: tuple[int, HopResult] | None = None
    sessions = first
    while sessions <= most:
        result = await run(sessions)
        if not result.clean:
            return None
        per_position = result.seconds / (sessions * positions)
        if best is not None:
            before = best[1].seconds / (best[0] * positions)
            if per_position < before:
                best = (sessions, result)
            if per_position > before * (1 - SATURATED_GAIN):
                break
        else:
            best = (sessions, result)
        sessions *= 2
    return best
