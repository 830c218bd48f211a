"""The pool that bench/placement.py places nodes in: machines of mixed speeds join one model's
pool one after another through the product's own rules (node/agent/placement.py
`choose_shard`, node/agent/rebalance.py `decide`), and the result is compared with the best
assignment an exhaustive search finds for the same machines.

What is modelled here (what bench/placement.py measures is the per-shard decode time):

- a machine serving shard s takes `slowdown × shard_s[s]` seconds per decoded token (its own
  rate on that shard is the inverse);
- the committee's `/nodes` `speed` of a node is what the verifiers would report, computed by
  the verifier's own code (node/verifier/speeds.py `EpochSpeeds`) from timed circuits: each
  circuit decodes `TIMED_TOKENS` tokens in that many times (the client head's per-token time +
  one stage per shard + `hop_s` per stage); the bench assumes the verifiers' sampled challenges
  over the estimate's window went through every combination of one node per shard, each once,
  clean and without timing noise, and that they probed every placed node alone once
  (hop_probe.py: sessions at once of `PROBE_POSITIONS` positions each, one at a time, on a
  node that computes one frame after another: `probe_s`; the sessions doubled from 4 as
  `saturate` does; `LAYERS` layers a shard). `rule="nodes"`: each node's own
  estimated rate from circuits and probes (`EpochSpeeds.of`, the product's rule);
  `rule="probed_one_circuit"`: the same estimate when the verifiers probed only the nodes of
  one circuit (the first combination: one node per shard) and the rest are read from the
  circuits beside them (speeds.py step 6); `rule="fit"`: the estimate from circuits alone (no
  probe: the shards' split assumed even); `rule="circuits"`: the old rule, each node credited
  its best circuit's speed (`circuit_speeds`); `rule="split"`, a diagnostic: the circuit-only
  estimate with the one thing whole circuits cannot tell given from the truth (each shard's
  fastest node its true stage time + an even share of head and hops; the differences within a
  shard stay the estimator's); `rule="own"`: each node's true rate (no verifier). Until every
  shard has a node there is no circuit, so no node has a speed (placement weighs replica
  counts then);
- the pool's throughput is placement.py's: min over shards of the summed rates of the shard's
  routable replicas, here with each machine's own rate on its shard (the capacity the pool
  really has, whatever the committee's speeds said);
- "settled" joins: each node joins after the earlier ones are routable and measured; "burst":
  each joins while the earlier ones are still registering (JOIN, not routable, no speed);
- rebalancing: after the last join every node, in join order, runs `decide` on the pool as the
  committee would then list it, a move applied at once; a pass lasts half the policy's
  cooldown, so a node that moved sits out the next pass (the churn bound, as the agent keeps
  it: what lets a swap's partner follow before its leader could move again); until a whole
  pass moves nobody and holds nobody back (the fixed point) or `MAX_PASSES` passes;
- nodes that do not rebalance (issue 44): `pinned` ones joined where placement put them and
  never move, registered as pinned (`rebalances` false: never a swap's partner); `silent` ones
  never move either but do not say so (an older release); `cooling` ones rebalance with a
  cooldown `COOLING_FACTOR` times the policy's (a partner still cooling when its leader's
  margin runs out). Each rebalancing node keeps its swap memory (node/agent/swap_memory.py:
  a swap not followed within its deadline is undone when that restores the pool, and its
  partner is not chosen again for the back-off), settled on the pool before each decision as
  the agent does; a pass with a swap still waited for, or a move back still pending, is not
  the fixed point. `memory=False` runs the rule as it was before the memory: no memory, and
  no node says whether it rebalances.

Pure: no I/O, no clock, no randomness but the caller's seeded draws.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from node.agent import swap_memory
from node.agent.placement import DEFAULT_REPLICA_FLOOR, PoolNode, choose_shard
from node.agent.rebalance import RebalancePolicy, decide
from node.verifier.hop_probe import HopResult, saturate
from node.verifier.speeds import EpochSpeeds, circuit_speeds, rate, stage_times

MODEL = "placement-bench"
# the committee's speeds: estimated per node (circuits and every node probed), the same with
# one circuit's nodes probed, from circuits alone, the old rule, circuits alone with the shards'
# split known, each node's true rate
RULES = ("nodes", "probed_one_circuit", "fit", "circuits", "split", "own")
TIMED_TOKENS = 32  # tokens of one timed sampled challenge (the verifier's `sampled_tokens`)
LAYERS = 10  # layers of every shard (the 3-part SmolLM2-135M: 30 layers)
PROBE_POSITIONS = 8  # positions each session of a one-hop probe steps
MAX_PASSES = 100  # rebalancing passes before a pool that keeps moving is called unconverged
COOLING_FACTOR = 4  # a `cooling` node's cooldown, in the policy's


@dataclass(frozen=True, slots=True)
class Machine:
    """One compute node: its key and how many times slower than the measured machine it is."""

    key: str
    slowdown: float


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per decoded token: each shard's stage (`shard_s`), the client head, one hop."""

    shard_s: tuple[float, ...]
    head_s: float
    hop_s: float

    @property
    def shards(self) -> int:
        return len(self.shard_s)

    def stage_s(self, machine: Machine, shard: int) -> float:
        return machine.slowdown * self.shard_s[shard]

    def rate(self, machine: Machine, shard: int) -> float:
        """The machine's own tokens/s on `shard`."""
        return 1.0 / self.stage_s(machine, shard)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where the rule put every node and what that placement is worth."""

    joined: dict[str, int]  # node key -> shard after the last join
    final: dict[str, int]  # after rebalancing
    moves: int
    passes: int
    converged: bool
    joined_tok_s: float  # pool throughput after the joins
    final_tok_s: float  # after rebalancing
    swaps_led: int = 0  # swaps' first halves
    swaps_led_again: int = 0  # of them, a (leader, partner, from, to) swap led before
    swaps_unfollowed: int = 0  # swaps whose deadline passed without a follower (the memory's)


def probe_s(sessions: int, stage_s: float, hop_s: float) -> float:
    """Seconds of one one-hop probe of `sessions` sessions on a node taking `stage_s` a
    position, `hop_s` each way: the node busy all along (the sessions' frames queue while
    others travel) or, with too few sessions for the round trip, the last session's positions
    each a round trip and a stage."""
    busy = sessions * PROBE_POSITIONS * stage_s + 2 * hop_s
    waiting = PROBE_POSITIONS * (stage_s + 2 * hop_s) + (sessions - 1) * stage_s
    return max(busy, waiting)


def probed(stage_s: float, hop_s: float) -> tuple[int, float]:
    """The sessions and seconds of the probe `saturate` keeps for such a node."""

    async def run(sessions: int) -> HopResult:
        return HopResult(probe_s(sessions, stage_s, hop_s), clean=True)

    kept = asyncio.run(saturate(run, PROBE_POSITIONS))
    assert kept is not None  # every modelled probe is clean
    return kept[0], kept[1].seconds


def machine_key(index: int) -> str:
    return hashlib.sha256(f"placement-bench node {index}".encode()).hexdigest()


def pool_tok_s(timing: Timing, machines: Sequence[Machine], assign: dict[str, int]) -> float:
    """min over shards of the summed own rates of the machines on it (0: a shard is empty)."""
    supply = [0.0] * timing.shards
    for machine in machines:
        if machine.key in assign:
            shard = assign[machine.key]
            supply[shard] += timing.rate(machine, shard)
    return min(supply)


def committee_speeds(
    timing: Timing, machines: Sequence[Machine], assign: dict[str, int], rule: str = "nodes"
) -> dict[str, int]:
    """The `speed` the committee lists per node, by the verifier's code from every circuit of
    one node per shard and the one-hop probes (`rule`: "nodes" every node probed,
    "probed_one_circuit" the first circuit's nodes probed, "fit" circuits alone, "circuits"
    the old best-circuit rule, "split" circuits alone with the shards' split known); empty
    while some shard has nobody."""
    placed = [m for m in machines if m.key in assign]
    by_shard = [[m for m in placed if assign[m.key] == s] for s in range(timing.shards)]
    if not all(by_shard):
        return {}
    measured = EpochSpeeds()
    for circuit in itertools.product(*by_shard):
        stages = sum(timing.stage_s(m, s) for s, m in enumerate(circuit))
        per_token = timing.head_s + stages + timing.shards * timing.hop_s
        keys = tuple(m.key for m in circuit)
        measured.note(keys, TIMED_TOKENS, TIMED_TOKENS * per_token, clean=True)
    if rule == "circuits":
        return circuit_speeds(timed for _, timed in measured.timed)
    if rule == "split":
        return _known_split(timing, by_shard, measured)
    if rule in ("nodes", "probed_one_circuit"):
        alone = placed if rule == "nodes" else [nodes[0] for nodes in by_shard]
        for m in alone:
            shard = assign[m.key]
            sessions, seconds = probed(timing.stage_s(m, shard), timing.hop_s)
            work = sessions * PROBE_POSITIONS
            measured.note_hop(m.key, shard, LAYERS, work, seconds, clean=True)
    return measured.of({m.key: 1 for m in placed})


def _known_split(
    timing: Timing, by_shard: Sequence[Sequence[Machine]], measured: EpochSpeeds
) -> dict[str, int]:
    """The per-node estimate, each shard's nodes shifted so that its fastest one reads its true
    stage time plus an even share of the head and the hops (what whole circuits cannot tell)."""
    times = stage_times(timed for _, timed in measured.timed)
    shared = (timing.head_s + timing.shards * timing.hop_s) / timing.shards
    speeds: dict[str, int] = {}
    for shard, nodes in enumerate(by_shard):
        estimated = min(times[m.key] for m in nodes)
        true = min(timing.stage_s(m, shard) for m in nodes) + shared
        for m in nodes:
            speeds[m.key] = rate(times[m.key] - estimated + true)
    return speeds


def own_speeds(
    timing: Timing, machines: Sequence[Machine], assign: dict[str, int]
) -> dict[str, int]:
    """Each node's own tokens/s on its shard, as integers: what a perfect per-node measurement
    would list (the comparison that separates the rule from the committee's measure)."""
    return {m.key: max(1, int(timing.rate(m, assign[m.key]))) for m in machines if m.key in assign}


def pool_view(
    machines: Sequence[Machine],
    assign: dict[str, int],
    speeds: dict[str, int],
    *,
    routable: bool = True,
    rebalances: dict[str, bool] | None = None,
) -> list[PoolNode]:
    """The committee's `/nodes` list of the placed machines (`rebalances`: what each node
    registered, absent: unannounced)."""
    flags = rebalances or {}
    return [
        PoolNode(
            key=m.key,
            shards=(assign[m.key],),
            status="SERVING" if routable else "JOIN",
            routable=routable,
            speed=speeds.get(m.key) if routable else None,
            rebalances=flags.get(m.key),
        )
        for m in machines
        if m.key in assign
    ]


def place(
    timing: Timing,
    machines: Sequence[Machine],
    *,
    burst: bool = False,
    rule: str = "nodes",
    floor: int = DEFAULT_REPLICA_FLOOR,
    policy: RebalancePolicy | None = None,
    pinned: frozenset[str] = frozenset(),
    silent: frozenset[str] = frozenset(),
    cooling: frozenset[str] = frozenset(),
    memory: bool = True,
) -> Outcome:
    """Join `machines` in their order (`burst`: nobody routable or measured before the last
    joins), then rebalance to the fixed point; `rule`: which speeds the rules see (`RULES`:
    the verifiers' per-node estimate, their old circuit rule, or each node's own); `pinned`,
    `silent`, `cooling`, `memory`: the nodes that do not rebalance or cool down longer, and
    whether the swap memory runs (the module docstring)."""
    if rule not in RULES:
        raise ValueError(f"rule {rule!r}: one of {RULES}")
    policy = policy or RebalancePolicy()
    slow = replace(policy, cooldown_s=COOLING_FACTOR * policy.cooldown_s)
    still = pinned | silent
    flags = {m.key: m.key not in still for m in machines if m.key not in silent}
    if not memory:
        flags = {}

    known: dict[tuple[tuple[str, int], ...], dict[str, int]] = {}

    def speeds_of(
        timing: Timing, machines: Sequence[Machine], assign: dict[str, int]
    ) -> dict[str, int]:
        """The committee's speeds of this assignment (the same assignment: the same speeds,
        computed once)."""
        seen = tuple(sorted(assign.items()))
        if seen not in known:
            if rule == "own":
                known[seen] = own_speeds(timing, machines, assign)
            else:
                known[seen] = committee_speeds(timing, machines, assign, rule)
        return known[seen]

    assign: dict[str, int] = {}
    for machine in machines:
        speeds = {} if burst else speeds_of(timing, machines, assign)
        view = pool_view(machines, assign, speeds, routable=not burst)
        chosen = choose_shard(MODEL, timing.shards, view, own_key=machine.key, floor=floor)
        assign[machine.key] = chosen.shard
    joined = dict(assign)
    moves = passes = unfollowed = 0
    converged = False
    moved_at: dict[str, float] = {}
    memories = {m.key: swap_memory.SwapMemory() for m in machines}
    led: Counter[tuple[str, str, int, int]] = Counter()
    pass_s = policy.cooldown_s / 2  # a node that moved sits out the next pass
    while passes < MAX_PASSES and not converged:
        passes += 1
        now_s = passes * pass_s
        converged = True
        for machine in machines:
            if machine.key in still:
                continue  # no agent moves it
            rules = slow if machine.key in cooling else policy
            view = pool_view(
                machines, assign, speeds_of(timing, machines, assign), rebalances=flags
            )
            held = memories[machine.key]
            if memory:
                pending = held.pending
                held, _ = swap_memory.settle(held, view, machine.key, timing.shards, now_s, rules)
                unfollowed += pending is not None and held.back == pending
            last = moved_at.get(machine.key)
            decision = decide(
                machine.key, view, timing.shards, floor,
                now_s=now_s, last_move_s=last, policy=rules,
                back=held.move_back(now_s), avoid=held.backed_off(now_s),
            )  # fmt: skip
            cooldown = last is not None and now_s - last < rules.cooldown_s
            if decision.move:
                assign[machine.key] = decision.target
                moved_at[machine.key] = now_s
                moves += 1
                converged = False
                swap = decision.swap
                if swap is not None:
                    led[(machine.key, swap.partner, decision.current, decision.target)] += 1
                if memory:
                    seen = moved_at.get(swap.partner) if swap is not None else None
                    held = swap_memory.moved(held, decision, now_s, rules, seen)
            elif cooldown:
                converged = False  # held by its cooldown, not settled: look again
            elif held.back is not None:
                held = swap_memory.given_up(held)
            if held.pending is not None or held.back is not None:
                converged = False  # a swap waited for, or a move back to weigh
            memories[machine.key] = held
    return Outcome(
        joined=joined,
        final=dict(assign),
        moves=moves,
        passes=passes,
        converged=converged,
        joined_tok_s=pool_tok_s(timing, machines, joined),
        final_tok_s=pool_tok_s(timing, machines, assign),
        swaps_led=sum(led.values()),
        swaps_led_again=sum(count - 1 for count in led.values()),
        swaps_unfollowed=unfollowed,
    )


def best_tok_s(
    timing: Timing,
    machines: Sequence[Machine],
    need: int = 0,
    fixed: dict[str, int] | None = None,
) -> tuple[float, dict[str, int]]:
    """The highest pool throughput over every assignment of the machines to shards (S^N of
    them; `need`: only those with at least that many nodes on every shard; `fixed`: machines
    that stay on the shard given), and one assignment that reaches it."""
    rates = [[timing.rate(m, s) for s in range(timing.shards)] for m in machines]
    fixed = fixed or {}
    held = [fixed.get(m.key) for m in machines]
    best, where = -1.0, ()
    for shards in itertools.product(range(timing.shards), repeat=len(machines)):
        if any(h is not None and h != s for h, s in zip(held, shards, strict=True)):
            continue
        if need and any(shards.count(s) < need for s in range(timing.shards)):
            continue
        supply = [0.0] * timing.shards
        for node, shard in enumerate(shards):
            supply[shard] += rates[node][shard]
        value = min(supply)
        if value > best:
            best, where = value, shards
    return best, {m.key: s for m, s in zip(machines, where, strict=True)}
