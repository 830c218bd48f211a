"""A verifier's one-hop probe: how fast ONE node runs its shard, on the verifier's own clock.

Whole circuits' times cannot tell how a circuit's time divides between its shards
(speeds.py, step 3); one node timed alone can. The verifier holds every shard (it recomputes
spot-check tickets with them), so it computes a shard's input itself, opens a session at the
node as the circuit's LAST hop (an `open` without `next`: every node serves as a last hop,
node/server/next_hops.py) and steps `positions` positions through it one at a time, as a
decode does:

    probe = HopProbe(node=key, shard=k, layers=manifest_layers[k], positions=16)
    timed = await time_hop(probe, step, check)           # HopResult(seconds, clean)
    speeds.note_hop(probe.node, probe.shard, probe.layers, probe.positions,
                    timed.seconds, timed.clean)

`step(i)` sends position i's frame and awaits the node's answer; `check(i, answer)` compares
the answer's output with the verifier's own recomputation of that position (the calibrated
tolerance of the shard's quantization). The time runs from before the first `step` to after
the last answer, on `clock` (the verifier's monotonic clock). Nothing the node says is read
but the outputs `check` judges: a node that reports how long it took, which layers it holds or
how fast it is changes nothing (the layers are the verifier's manifest's, the key the one it
dialled); a node that answers fast with wrong outputs is not clean, and a probe that is not
clean is credited nothing (`note_hop` drops it). A node that answers slowly on purpose is
timed slowly: only its own probe, and so only its own speed, is slower.

Not wired yet: the worker does not open these sessions (the live `step`/`check` over a node's
link, and paying a charging node for them, are issue 44's next step).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Step = Callable[[int], Awaitable[object]]  # send position i, await the node's answer
Check = Callable[[int, object], bool]  # the answer's output is the verifier's own for position i
Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class HopProbe:
    """Which node the verifier times and on what: its key (the one dialled), the shard sent,
    that shard's layer count from the verifier's manifest, the positions to step."""

    node: str
    shard: int
    layers: int
    positions: int


@dataclass(frozen=True, slots=True)
class HopResult:
    """The probe's seconds on the verifier's clock and whether every output was right."""

    seconds: float
    clean: bool


async def time_hop(
    probe: HopProbe, step: Step, check: Check, clock: Clock = time.monotonic
) -> HopResult:
    """Step the probe's positions through the node one at a time; the time they took and
    whether every answer passed `check` (the first wrong one ends the probe, not clean)."""
    started = clock()
    for position in range(probe.positions):
        answer = await step(position)
        if not check(position, answer):
            return HopResult(clock() - started, clean=False)
    return HopResult(clock() - started, clean=True)
