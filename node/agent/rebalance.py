"""Whether a running node should move to another shard of its model's pool (issue 44,
rebalancing): a pure decision over the committee's view of the pool, logged one line a time.

A node that joined with auto placement (or with `--rebalance`) re-evaluates every
`every_blocks` blocks and whenever the pool it reads changes (a node joins, leaves, goes DOWN or
comes back). It moves from its shard S to a shard T only when one of these gains holds, in this
order of preference, and never when the move lowers the pool's weakest shard (but by less than
`gain_percent` to fill a shard below the floor, and as a swap's first half, which its second
half lifts above where it started):

    empty        T has no routable node and none in JOIN (the pool answers nothing until every
                 shard has one) and S keeps at least one routable node after it leaves; a
                 SERVING node that is not routable (its stake not agreed yet, or dropped for
                 work it did not commit) does not hold T: T answers nothing now
    below floor  T's routable + joining nodes are below the chain's `replica_floor`, and S keeps
                 at least `floor` routable nodes after it leaves (a move that only swaps which
                 shard is short is no gain); the floor first: the move may lower the pool's
                 weakest shard, by less than `gain_percent` (so a swap whose first half leaves
                 the pool a little above where its second half ends is completed)
    weakest      T is the pool's weakest shard, nobody is joining it, S keeps the floor after
                 it leaves (or T is below it), and the move raises the pool's weakest shard
                 (min over shards of routable throughput) by at least `gain_percent` — in
                 measured tokens/s when the committee lists a speed for every routable node
                 (`/nodes` `speed`: the verifiers' median, abci_app/speeds.py), else in counts
    swap         no node of the pool has a move above, none is joining, and the speeds are
                 measured: this node S -> T, then a node B of T -> S, the pair raising the
                 weakest shard by `gain_percent` (counts stay: the floor holds after it). B
                 is not told: this node goes first only when, with it on T, another node's own
                 rule moves and every move the others' rules would then take keeps the weakest
                 shard at the gain; of the two orders the one lowering the weakest shard less
                 in between leads (tie: the lower key), and its cooldown holds it on T while B
                 follows. The first half is the only move that may leave S below the floor
                 (`_swaps`). Never with a partner registered as pinned (`/nodes`
                 `rebalances` false: `--shard K` without `--rebalance`) nor one the node's swap
                 memory backs off (`avoid`: it did not follow a swap this node led); such a
                 pair that would lift the pool is the stayed line's reason ("node <key> is
                 pinned to its shard; no swap with it"). A pinned node's own gains do not hold
                 the swaps back (it never takes them), and it follows none
    back         (before the swaps, after the single moves) a swap this node led was not
                 followed within its deadline (swap_memory.py, `back`): it moves back T -> S
                 when that raises the pool's weakest shard, nobody is joining S, and T keeps
                 the floor after it leaves (or S is below it); the cooldown and the rest of
                 the rules hold as for any move

Among the shards that gain, the kind above wins, then the shard with the least routable +
joining supply, then (at an equal kind and supply: equal gain) a shard whose file is already on
this machine before one that must be fetched, then a hash of (node key, shard): equal shards
are ranked differently by different nodes, so two nodes that see the same short shards do not
all pick the same one, and one node always picks the same one (deterministic per node key).

A target whose file is not on disk is fetched before the move (mover.py, node/model/fetch.py:
chunk by chunk from the nodes serving it, checked against the manifest). So it counts only when
the file has a source: another node the committee lists SERVING it (routable or not: a node
whose stake is not agreed yet still serves its chunks; a DOWN or joining node does not count),
or the model's origin given to `planet join --origin`. A shard with neither (an empty shard
whose last node went DOWN, and no origin) cannot be moved to: the node stays, and the line
says so. Nor one whose fetch failed within `cooldown_s` (a failing source is not asked again at
every look; the `.part` file is resumed when it is).

Bounded churn: at most one move per node per `cooldown_s` (and the chain refuses a second move
within `MOVE_COOLDOWN_BLOCKS`, abci_app/registry.py); a node that decides to move first waits
`jitter_s(key)`, a delay in [0, max_jitter_s) drawn from its node key, then reads the pool
again and decides again, so the nodes that saw the same loss do not stampede to one shard.

Not moved: a node the committee does not list, or lists as not routable (it does not count
where it is), a node serving a span of several shards, and a node alone on its shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from node.agent.placement import PoolNode, ShardSupply, pool_speeds, pool_supply

EMPTY, BELOW_FLOOR, WEAKEST, BACK, SWAP = 0, 1, 2, 3, 4  # the kinds of gain, by preference


@dataclass(frozen=True, slots=True)
class RebalancePolicy:
    """How often a node looks, how much gain moves it, and the bounds on churn and moving."""

    every_blocks: int = 30  # re-evaluate at least this often (and whenever the pool changes)
    cooldown_s: float = 600.0  # at most one move per node in this many seconds
    max_jitter_s: float = 10.0  # a move waits jitter_s(key) in [0, this) before it goes
    gain_percent: int = 10  # a `weakest` move or a swap raises the weakest shard by at least this
    drain_s: float = 60.0  # live sessions on the old shard may finish this long, then are cut
    linger_s: float = 5.0  # the old process answers at least this long (clients that read the
    # pool just before the move may still open a session there), unless drain_s is shorter
    load_timeout_s: float = 300.0  # the new shard's node must answer /health within this
    follow_margin_s: float = 120.0  # a swap's partner follows within its remaining cooldown
    # (as this node saw it move) plus this, else the swap was not followed (swap_memory.py)
    swap_backoff_s: float = 6 * 3600.0  # a partner that did not follow is not chosen again
    # for a swap this long


@dataclass(frozen=True, slots=True)
class Decision:
    """Stay on `current`, or move to `target` (== current when staying), and why."""

    move: bool
    current: int
    target: int
    reason: str
    fetch: bool = False  # the target's file is not on disk: the move fetches it first
    swap: Swap | None = None  # the move is a swap's first half: its partner, what it lifts
    back: Back | None = None  # the move undoes a swap its partner did not follow

    def line(self) -> str:
        if self.move:
            fetch = " (its file fetched first)" if self.fetch else ""
            return f"rebalance: moving shard {self.current} -> {self.target}{fetch}: {self.reason}"
        return f"rebalance: stayed on shard {self.current}: {self.reason}"


def jitter_s(key: str, max_s: float) -> float:
    """The node's delay before a move: in [0, max_s), the same for the same node key."""
    if max_s <= 0:
        return 0.0
    draw = int.from_bytes(hashlib.sha256(f"planet rebalance jitter/{key}".encode()).digest()[:8])
    return (draw % 1_000_000) / 1_000_000 * max_s


def tie_rank(key: str, shard: int) -> bytes:
    """Order among equally good shards, different per node key."""
    return hashlib.sha256(f"planet rebalance tie/{key}/{shard}".encode()).digest()


Fingerprint = tuple[tuple[str, tuple[int, ...], str, bool], ...]


def pool_fingerprint(nodes: Sequence[PoolNode]) -> Fingerprint:
    """What a change of the pool is measured by: who serves what, with which status."""
    return tuple(sorted((n.key, n.shards, n.status, n.routable) for n in nodes))


def decide(
    key: str,
    nodes: Sequence[PoolNode],
    shard_count: int,
    floor: int,
    *,
    now_s: float,
    last_move_s: float | None,
    policy: RebalancePolicy,
    speeds: Mapping[str, int] | None = None,
    available: Callable[[int], bool] | None = None,
    origin: bool = False,
    fetch_failed: Collection[int] = (),
    back: Back | None = None,
    avoid: Mapping[str, str] | None = None,
) -> Decision:
    """Stay or move, for the node `key` in the pool `nodes` (`shard_count` shards, the chain's
    `floor`); `last_move_s`: when it last moved (same clock as `now_s`), None: never;
    `available(shard)`: whether that shard's file is on this machine (None: every one is);
    `origin`: whether the model's origin is known (a shard no node serves is fetched there);
    `fetch_failed`: shards whose fetch failed within the cooldown (not tried again before);
    `back`: a swap this node led that was not followed (it moves back when that restores the
    pool); `avoid`: partners it does not swap with (node key → why, its swap memory)."""
    own = next((n for n in nodes if n.key == key), None)
    if own is None:
        return Decision(False, -1, -1, "the committee does not list this node yet")
    current = own.shards[0]
    if len(own.shards) != 1:
        return Decision(False, current, current, f"it serves a span of shards {list(own.shards)}")
    if not own.routable:
        return Decision(
            False, current, current, f"this node is not routable ({own.status}): it counts nowhere"
        )
    if speeds is None:
        speeds = pool_speeds(nodes)  # the committee's measured speeds
    supply, measured = pool_supply(nodes, shard_count, speeds)
    if current >= shard_count:
        return Decision(False, current, current, f"shard {current} is not one of the model's")
    me = speeds[key] if measured else 1
    source = supply[current]
    if source.throughput - me <= 0:
        return Decision(False, current, current, "it is the only routable node of its shard")
    best: tuple[int, tuple[int, ...], bool, bytes, ShardSupply] | None = None
    sourceless: tuple[ShardSupply, bool] | None = None  # a gain whose file it cannot get
    partner: Swap | None = None
    options, notes = _options(
        key, nodes, supply, measured, speeds, floor, policy.gain_percent, back, avoid or {}
    )
    for kind, supplied, tie, target, swap in options:
        fetch = available is not None and not available(target.shard)
        failed = fetch and target.shard in fetch_failed
        if failed or (fetch and not (origin or _serves(nodes, key, target.shard))):
            sourceless = sourceless or (target, failed)
            continue
        rank = (kind, supplied, fetch, tie, target)
        if best is None or rank[:4] < best[:4]:
            best, partner = rank, swap
    if best is None:
        if sourceless is not None:
            return Decision(False, current, current, _no_source(*sourceless, policy.cooldown_s))
        if notes:
            return Decision(False, current, current, "; ".join(notes))
        return Decision(False, current, current, _no_gain(source, supply, measured, floor))
    kind, _, fetch, _, target = best
    undo = back if kind == BACK else None
    why = _why(kind, source, target, measured, floor, partner, undo, supply)
    if last_move_s is not None and now_s - last_move_s < policy.cooldown_s:
        wait = policy.cooldown_s - (now_s - last_move_s)
        return Decision(
            False,
            current,
            current,
            f"shard {target.shard} would gain ({why}), but this node moved "
            f"{now_s - last_move_s:.0f} s ago: at most one move per {policy.cooldown_s:.0f} s "
            f"(next in {wait:.0f} s)",
        )
    return Decision(True, current, target.shard, why, fetch=fetch, swap=partner, back=undo)


@dataclass(frozen=True, slots=True)
class Swap:
    """The second half of a swap: the node that moves back to this node's shard, and what the
    pair does to the pool's weakest shard (tokens/s: before, between the two moves, after;
    `goal`: the gain threshold over `before`, rounded up)."""

    partner: str
    speed: int
    before: int
    between: int
    after: int
    goal: int = 0


@dataclass(frozen=True, slots=True)
class Back:
    """A swap this node led whose partner did not follow (swap_memory.py): the shard it left,
    the partner, and how long it waited for it."""

    shard: int
    partner: str
    waited_s: float


Option = tuple[int, tuple[int, ...], bytes, ShardSupply, "Swap | None"]
MAX_NOTES = 3  # lines why a swap is not led, at most, in one decision


def _options(
    key: str,
    nodes: Sequence[PoolNode],
    supply: Sequence[ShardSupply],
    measured: bool,
    speeds: Mapping[str, int],
    floor: int,
    gain_percent: int,
    back: Back | None,
    avoid: Mapping[str, str],
) -> tuple[list[Option], list[str]]:
    """The moves of `key` that gain, each (kind, rank, tie rank, target, swap): its single
    moves; else the move back of a swap not followed (`back`) when it restores the pool; when
    no node of the pool has a move, the first halves of the swaps it leads. And why a swap
    that would lift the pool is not led (its partner pinned, or in `avoid`), one line each.
    A node registered as not rebalancing (pinned) moves by no rule: it neither blocks the
    swaps (its moves are never taken) nor follows one."""
    joining = [0] * len(supply)
    for n in nodes:
        for shard in n.shards:
            if n.status == "JOIN" and shard < len(supply):
                joining[shard] += 1
    placed = [n for n in nodes if n.routable and len(n.shards) == 1 and n.shards[0] < len(supply)]
    rate = {n.key: speeds[n.key] if measured else 1 for n in placed}
    own = next(n for n in placed if n.key == key)
    movers = [n for n in placed if n.key == key or n.rebalances is not False]
    pool = _Pool(supply, joining, floor, gain_percent)
    singles = pool.singles(key, own.shards[0], rate[key])
    if singles:
        return [(kind, (s,), tie, target, None) for kind, s, tie, target in singles], []
    if back is not None:
        target = pool.back(own.shards[0], back.shard, rate[key])
        if target is not None:
            supplied = target.throughput + target.pending * rate[key]
            return [(BACK, (supplied,), tie_rank(key, target.shard), target, None)], []
    if not measured:
        return [], []
    if any(joining) or any(pool.singles(n.key, n.shards[0], rate[n.key]) for n in movers):
        return [], []  # a node is joining, or has a move of its own: no swap before they settle
    return _swaps(own, movers, placed, rate, pool, avoid)


@dataclass(frozen=True, slots=True)
class _Pool:
    """The pool as the rule weighs it: each shard's supply, the nodes joining each shard."""

    supply: Sequence[ShardSupply]
    joining: Sequence[int]
    floor: int
    gain_percent: int

    def singles(self, key: str, current: int, me: int) -> list[tuple[int, int, bytes, ShardSupply]]:
        """The single moves of `key` (`me` tokens/s, or 1 in counts, on `current`) that gain:
        (kind, the target's routable + joining supply, tie rank, target)."""
        source = self.supply[current]
        if source.throughput - me <= 0:
            return []
        gains = []
        for target in self.supply:
            if target.shard == current:
                continue
            joining = self.joining[target.shard]
            kind = _gain(source, target, self.supply, me, self.floor, self.gain_percent, joining)
            if kind is not None:
                supplied = target.throughput + target.pending * me
                gains.append((kind, supplied, tie_rank(key, target.shard), target))
        return gains

    def back(self, current: int, there: int, me: int) -> ShardSupply | None:
        """`there` when moving back to it (a swap not followed) restores the pool: it raises
        the pool's weakest shard, nobody is joining `there`, and `current` keeps the floor
        after it leaves (or `there` is below it); else None. Not when alone on `current`."""
        if there == current or there >= len(self.supply) or self.joining[there]:
            return None
        source, target = self.supply[current], self.supply[there]
        if source.throughput - me <= 0:
            return None
        after = self.moved(current, there, me)
        short = target.replicas + target.pending < self.floor
        keeps_floor = source.replicas - 1 >= self.floor or short
        if _weakest(after) <= _weakest(self) or not keeps_floor:
            return None
        return target

    def moved(self, current: int, there: int, me: int) -> _Pool:
        """The pool once a routable node of `me` tokens/s moved from `current` to `there`."""
        supply = list(self.supply)
        for shard, sign in ((current, -1), (there, 1)):
            s = supply[shard]
            supply[shard] = replace(
                s, replicas=s.replicas + sign, throughput=s.throughput + sign * me
            )
        return replace(self, supply=tuple(supply))


def _swaps(
    own: PoolNode,
    movers: Sequence[PoolNode],
    placed: Sequence[PoolNode],
    rate: Mapping[str, int],
    pool: _Pool,
    avoid: Mapping[str, str],
) -> tuple[list[Option], list[str]]:
    """The first halves of the swaps `own` leads: it moves S -> T, then a node B of T moves
    T -> S. Only where the pair raises the pool's weakest shard by the gain threshold (the
    counts stay, so the floor holds after it); once this node is on T some other node's rule
    moves (B's T -> S, or another node's move
    the new weakest shard draws) and every move the other nodes' rules would then take leaves
    the pool's weakest shard at the threshold or above: B follows by its own rule, not told,
    and whoever moves instead lifts the pool as much; and of the two orders that do so, this one
    lowers the weakest shard less in between (at a tie, the lower node key leads): one of the
    two starts it. Never with a partner registered as pinned (it cannot follow) nor one in
    `avoid` (it did not follow lately): such a pair that would lift the pool is a line why not.
    `movers`: the nodes whose rules move (`placed`: every routable one-shard node)."""
    key, current, me = own.key, own.shards[0], rate[own.key]
    before = [s.throughput for s in pool.supply]
    old_min = min(before)
    options: list[Option] = []
    notes: list[str] = []
    seen: set[tuple[int, int]] = set()
    for b in sorted(placed, key=lambda n: n.key):
        there, them = b.shards[0], rate[b.key]
        if b.key == key or there == current or them == me or (there, them) in seen:
            continue  # equal speeds swap nothing; like partners weigh alike
        after = list(before)
        after[current] += them - me
        after[there] += me - them
        if min(after) * 100 < old_min * (100 + pool.gain_percent):
            continue
        if b.rebalances is False or b.key in avoid:
            why = avoid.get(b.key, "is pinned to its shard; no swap with it")
            if len(notes) < MAX_NOTES:
                notes.append(f"node {b.key[:12]} {why}")
            continue  # an equal partner that may follow is still weighed
        seen.add((there, them))
        goal = -(-old_min * (100 + pool.gain_percent) // 100)  # the threshold, rounded up
        first = pool.moved(current, there, me)  # this node leads
        if not _followers_lift(first, movers, rate, key, goal):
            continue
        second = pool.moved(there, current, them)  # B leads
        dip, other = _weakest(first), _weakest(second)
        if (dip, b.key) < (other, key) and _followers_lift(second, movers, rate, b.key, goal):
            continue  # B leading lowers the weakest shard less in between: B leads
        swap = Swap(b.key, them, old_min, dip, min(after), goal)
        rank = (-min(after), -dip)  # the highest weakest shard after, then in between
        options.append((SWAP, rank, tie_rank(key, there), pool.supply[there], swap))
    return options, notes


def _weakest(pool: _Pool) -> int:
    return min(s.throughput for s in pool.supply)


def _followers_lift(
    between: _Pool, movers: Sequence[PoolNode], rate: Mapping[str, int], key: str, goal: int
) -> bool:
    """Whether, with `key` moved (`between`), some other node's rule then moves, and every move
    the other nodes' rules then take leaves the pool's weakest shard at `goal` or above."""
    followed = False
    for n in movers:
        if n.key == key:
            continue  # it just moved: its cooldown holds it
        gains = between.singles(n.key, n.shards[0], rate[n.key])
        if not gains:
            continue
        target = min(gains, key=lambda g: g[:3])[3].shard
        after = between.moved(n.shards[0], target, rate[n.key])
        if _weakest(after) < goal:
            return False
        followed = True
    return followed


def _serves(nodes: Sequence[PoolNode], key: str, shard: int) -> bool:
    """Another node the committee lists SERVING `shard` (routable or not): it serves the
    shard's chunks (node/server/shards.py)."""
    return any(n.key != key and n.status == "SERVING" and shard in n.shards for n in nodes)


def _no_source(target: ShardSupply, failed: bool, cooldown_s: float) -> str:
    if failed:
        return (
            f"shard {target.shard} would gain, but fetching its file failed less than "
            f"{cooldown_s:.0f} s ago: not tried again before then"
        )
    return (
        f"shard {target.shard} would gain, but its file is not on this machine, no node serves "
        "it and no origin is known (`planet join --origin`): it cannot be fetched, so no move"
    )


def _gain(
    source: ShardSupply,
    target: ShardSupply,
    supply: Sequence[ShardSupply],
    me: int,
    floor: int,
    gain_percent: int,
    joining: int,
) -> int | None:
    """The kind of gain a move from `source` to `target` brings, or None (`joining`: nodes in
    JOIN on `target`)."""
    before = [s.throughput for s in supply]
    after = list(before)
    after[source.shard] -= me
    after[target.shard] += me
    old_min, new_min = min(before), min(after)
    if target.replicas + joining == 0 and new_min >= old_min:
        return EMPTY
    if (
        target.replicas + target.pending < floor
        and source.replicas - 1 >= floor
        and new_min * 100 > old_min * (100 - gain_percent)
    ):
        return BELOW_FLOOR  # the floor first, at less than the gain threshold's cost
    if new_min < old_min:
        return None
    keeps_floor = source.replicas - 1 >= floor or target.replicas + target.pending < floor
    if (
        target.pending == 0
        and keeps_floor
        and target.throughput == old_min
        and new_min > old_min
        and new_min * 100 >= old_min * (100 + gain_percent)
    ):
        return WEAKEST
    return None


def _amount(supply: ShardSupply, measured: bool) -> str:
    nodes = f"{supply.replicas} routable"
    joining = f" + {supply.pending} joining" if supply.pending else ""
    return (f"{supply.throughput} tokens/s over " if measured else "") + nodes + joining


def _why(
    kind: int,
    source: ShardSupply,
    target: ShardSupply,
    measured: bool,
    floor: int,
    swap: Swap | None = None,
    back: Back | None = None,
    supply: Sequence[ShardSupply] = (),
) -> str:
    if back is not None:
        weakest = min(s.throughput for s in supply)
        return (
            f"swap with node {back.partner[:12]} not followed in {back.waited_s:.0f} s; moving "
            f"back to shard {back.shard} (the pool's weakest shard is {weakest}"
            f"{' tokens/s' if measured else ' routable'} and rises)"
        )
    if swap is not None:
        return (
            f"a swap with node {swap.partner[:12]} ({swap.speed} tokens/s on shard "
            f"{target.shard}) raises the pool's weakest shard {swap.before} -> {swap.after} "
            f"tokens/s; this node moves first ({swap.between} between), that node's own rule "
            f"moves it to shard {source.shard} next"
        )
    left = f"shard {source.shard} keeps {source.replicas - 1} routable"
    if kind == EMPTY:
        return f"shard {target.shard} has no routable node and none joining; {left}"
    if kind == BELOW_FLOOR:
        return (
            f"shard {target.shard} has {_amount(target, measured)}, below the replica floor "
            f"of {floor}; {left} (>= the floor)"
        )
    return (
        f"shard {target.shard} is the weakest ({_amount(target, measured)}); the move raises "
        f"the pool's weakest shard; {left}"
    )


def _no_gain(source: ShardSupply, supply: Sequence[ShardSupply], measured: bool, floor: int) -> str:
    weakest = min(supply, key=lambda s: (s.throughput + s.pending, s.shard))
    if weakest.shard == source.shard:
        return f"its shard is the weakest ({_amount(source, measured)})"
    return (
        f"no shard gains enough from a move (its shard has {_amount(source, measured)}, the "
        f"weakest, shard {weakest.shard}, has {_amount(weakest, measured)}; floor {floor})"
    )
