"""Where a joining compute node goes: the shard of a model's pool that raises the pool's
end-to-end throughput most (`planet join --model M` without `--shard`, or `--shard auto`).

A question passes every shard of the model in turn, so the pool answers no faster than its
weakest shard: pool throughput = min over shards of (the shard's routable replicas × their
speed). Adding a node to any other shard leaves that minimum where it is, so the node takes the
weakest shard: a shard nobody serves first (the pool answers nothing until every shard has a
node), then the one with the fewest replicas, or the slowest ones when speeds are measured.

    weakest by (above the floor, throughput, pending, index)
      above the floor  whether the shard's routable + pending nodes reach the chain's
                  `replica_floor` (genesis, default 2; `/params`): a shard below it is filled
                  first, however fast its one node, since a node that stalls leaves it with
                  nobody (issue 44)
      throughput  sum of the routable replicas' measured speeds when every one is measured,
                  else the count of routable replicas. The speeds are the committee's: each
                  `/nodes` entry's `speed` (tokens/s, the lower median of the verifiers'
                  measurements, abci_app/speeds.py; null while none is recent)
      pending     nodes registered on the shard (JOIN or SERVING) that are not routable yet:
                  among equally weak shards, the one fewer nodes are on their way to
      index       the lowest shard index: the same pool state gives every joiner the same
                  answer

A node key the committee already lists for the model keeps its registered shard (a running node
moves only by rebalancing, node/agent/rebalance.py and mover.py: `move_shards`).

The committee's answer is untrusted input (a validator's RPC is a peer): `parse_nodes` turns
the `/nodes?model=M&role=compute` answer into typed `PoolNode`s at this one boundary or refuses
it as `MalformedPoolAnswer`, naming the field (a `speed` that is not null or an integer in
[1, 100 000] included; a `rebalances` that is not absent, true or false too). Pure: no I/O,
no clock; `read_pool` takes any object with the `CommitteeLink.query` coroutine.

**Spans** (`planet join --shards N`): a node may serve N consecutive shards as one hop
(node/server/span_backend.py). `choose_span` takes the window of N consecutive shards that is
weakest by the same key: its shards' keys, weakest first, compared in order (so the window
holding the weakest shard wins, then the one whose second-weakest is weaker, …), ties to the
lowest first shard.

**`--shards auto`** (`choose_auto_span`) sizes the span from the node's memory and the pool:

    fits        the span's resident weights (each shard file's bytes × its quantization's
                factor, node/server/seats.py `resident_weight_bytes`) + the node's KV caps
                (one process: counted once) ≤ the machine's available memory − a headroom
    unserved    a shard with no routable and no pending node: the pool answers nothing until
                it has one. The node takes the longest run of consecutive unserved shards it
                fits (ties to the lowest first shard): a fresh pool's first node with memory
                for the whole model serves all of it, so the model answers at once
    all served  one shard, the weakest (`choose_shard`): a span raises the pool's throughput
                only when the node is faster than each of its shards' replicas by the span's
                length, which a joining node does not know before the verifiers measure it
    no fit      not even the chosen shard fits: `NotEnoughMemory` (error + hint)

`planet join --model M` with neither `--shard` nor `--shards` stays one shard (`choose_shard`,
no memory read): nodes joining a fresh pool one by one each take a shard, as before spans.

Several models in one node: node/server/host.py. Rebalancing a running node: rebalance.py (the
rule, over `pool_supply`; a span is not moved), mover.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from node.chain.committee_pages import BadPage, TooManyPages, read_nodes
from protocol.errors import ProtocolError, UsageError
from protocol.spans import ShardSpan
from protocol.speeds import MAX_SPEED, MIN_SPEED, is_speed

MAX_SHARDS = 65536  # shard indexes are 0 … 65535 (register_node)
MAX_NODES = 100_000  # entries one /nodes answer may list before it is refused as malformed
MAX_SHARDS_PER_NODE = 256  # register_node's limit
STATUSES = ("JOIN", "SERVING", "DOWN", "LEFT")
DEFAULT_REPLICA_FLOOR = 2  # the chain's genesis default (abci_app/genesis.py)
MAX_REPLICA_FLOOR = 64
PENDING = ("JOIN", "SERVING")  # registered and not (yet) routable: on its way
_KEY = re.compile(r"[0-9a-f]{64}\Z")


class ModelNotRegistered(UsageError):
    code = "model_not_registered"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model {model} is not registered in the ModelRegistry on chain: it has no pool to "
            "place a node in",
            hint="join a model the network serves (`planet devnet status` lists the devnet's)",
        )
        self.model = model


class MalformedPoolAnswer(ProtocolError):
    code = "malformed_committee_answer"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the committee's /nodes answer is malformed: {what}",
            hint="ask another validator (--committee-rpc), or pick the shard yourself: --shard K",
        )


class PoolQuery(Protocol):
    async def query(self, path: str, **params: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class PoolNode:
    """One compute node of the model as the committee lists it."""

    key: str
    shards: tuple[int, ...]
    status: str
    routable: bool
    speed: int | None = None  # measured tokens/s (the committee's median), None: not measured
    # whether its agent rebalances, as it registered: False pinned to its shard (`--shard K`),
    # None unannounced (an older release's registration: unknown)
    rebalances: bool | None = None


@dataclass(frozen=True, slots=True)
class ShardSupply:
    """What one shard of the pool has."""

    shard: int
    replicas: int  # routable nodes serving it
    throughput: int  # their summed measured speed (tokens/s), or `replicas` when not measured
    pending: int  # registered on it, not routable (yet)

    def to_json(self) -> dict[str, int]:
        return {
            "shard": self.shard,
            "replicas": self.replicas,
            "throughput": self.throughput,
            "pending": self.pending,
        }


@dataclass(frozen=True, slots=True)
class Placement:
    """The shard chosen (a span's first, with `last`), the pool it was chosen from, and the
    one-line reason."""

    model: str
    shard: int
    supply: tuple[ShardSupply, ...]
    measured: bool  # throughput is measured speed (else: counts of routable replicas)
    reason: str
    basis: str = ""  # whether speeds were measured, in words (`speed_basis`)
    last: int | None = None  # a span's last shard (`choose_span`); None: `shard` alone

    @property
    def span(self) -> ShardSpan:
        return ShardSpan(self.shard, self.shard if self.last is None else self.last)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "shard": self.shard,
            "span": list(self.span.shards),
            "shards": len(self.supply),
            "measured": self.measured,
            "reason": self.reason,
            "basis": self.basis,
            "supply": [s.to_json() for s in self.supply],
        }


# -- the boundary: the committee's answer → typed values -----------------------------------------


def parse_nodes(answer: Any, model: str) -> tuple[PoolNode, ...]:
    """`/nodes?model=M&role=compute` → its nodes, or `MalformedPoolAnswer` naming what is wrong."""
    if not isinstance(answer, dict) or not isinstance(answer.get("nodes"), list):
        raise MalformedPoolAnswer("expected an object with a `nodes` list")
    entries = answer["nodes"]
    if len(entries) > MAX_NODES:
        raise MalformedPoolAnswer(f"{len(entries)} nodes listed, more than {MAX_NODES}")
    return tuple(_parse_node(entry, i, model) for i, entry in enumerate(entries))


def _parse_node(entry: Any, index: int, model: str) -> PoolNode:
    where = f"nodes[{index}]"
    if not isinstance(entry, dict):
        raise MalformedPoolAnswer(f"{where}: expected an object")
    key = entry.get("key")
    if not isinstance(key, str) or not _KEY.match(key):
        raise MalformedPoolAnswer(f"{where}.key: expected 64 lowercase hex digits")
    if entry.get("model") != model:
        raise MalformedPoolAnswer(f"{where}.model: a node of another model than the one asked")
    if entry.get("role") != "compute":
        raise MalformedPoolAnswer(f"{where}.role: expected compute (the role asked)")
    status = entry.get("status")
    if status not in STATUSES:
        raise MalformedPoolAnswer(f"{where}.status: expected one of {', '.join(STATUSES)}")
    routable = entry.get("routable")
    if not isinstance(routable, bool):
        raise MalformedPoolAnswer(f"{where}.routable: expected true or false")
    shards = entry.get("shards")
    if (
        not isinstance(shards, list)
        or not 1 <= len(shards) <= MAX_SHARDS_PER_NODE
        or not all(type(s) is int and 0 <= s < MAX_SHARDS for s in shards)
        or shards != sorted(set(shards))
    ):
        raise MalformedPoolAnswer(
            f"{where}.shards: expected 1-{MAX_SHARDS_PER_NODE} ascending shard indexes "
            f"0-{MAX_SHARDS - 1}"
        )
    speed = entry.get("speed")
    if speed is not None and not is_speed(speed):
        raise MalformedPoolAnswer(
            f"{where}.speed: expected null or an integer in [{MIN_SPEED}, {MAX_SPEED}] tokens/s"
        )
    rebalances = entry.get("rebalances")
    if rebalances is not None and not isinstance(rebalances, bool):
        raise MalformedPoolAnswer(f"{where}.rebalances: expected absent, true or false")
    return PoolNode(
        key=key,
        shards=tuple(shards),
        status=status,
        routable=routable,
        speed=speed,
        rebalances=rebalances,
    )


def parse_floor(params: Any) -> int:
    """The chain's `replica_floor` from its `/params` answer (absent: the default, a chain from
    before the floor), or `MalformedPoolAnswer`."""
    genesis = params.get("genesis") if isinstance(params, dict) else None
    if not isinstance(genesis, dict):
        raise MalformedPoolAnswer("/params: expected an object with a `genesis` object")
    floor = genesis.get("replica_floor", DEFAULT_REPLICA_FLOOR)
    if type(floor) is not int or not 1 <= floor <= MAX_REPLICA_FLOOR:
        raise MalformedPoolAnswer(f"genesis.replica_floor: expected 1-{MAX_REPLICA_FLOOR}")
    return floor


async def read_floor(link: PoolQuery) -> int:
    """The committee's replica floor (`CommitteeLink` or anything with its `query`)."""
    return parse_floor(await link.query("/params"))


async def read_pool(link: PoolQuery, model: str) -> tuple[PoolNode, ...]:
    """The model's compute nodes from the committee (`CommitteeLink` or anything with its
    `query`), every page of `/nodes` (`read_nodes`), parsed; a malformed page or a list past
    `NODE_PAGES` pages is `MalformedPoolAnswer`."""
    try:
        entries = await read_nodes(link.query, model=model, role="compute")
    except (BadPage, TooManyPages) as error:
        raise MalformedPoolAnswer(error.message) from None
    return parse_nodes({"nodes": entries}, model)


# -- the choice ----------------------------------------------------------------------------------


def pool_supply(
    nodes: Sequence[PoolNode], shard_count: int, speeds: Mapping[str, int] | None = None
) -> tuple[tuple[ShardSupply, ...], bool]:
    """Per shard: routable replicas, their throughput, pending nodes; and whether throughput is
    measured speed (`speeds`: node key → tokens/s, used only when it covers every routable
    node; None: the speeds the committee listed, `pool_speeds`). Shards a node lists beyond
    `shard_count` are not the registered model's: skipped."""
    if speeds is None:
        speeds = pool_speeds(nodes)
    routable = [n for n in nodes if n.routable]
    measured = bool(routable) and all(
        isinstance(speeds.get(n.key), int) and speeds[n.key] > 0 for n in routable
    )
    replicas = [0] * shard_count
    throughput = [0] * shard_count
    pending = [0] * shard_count
    for node in nodes:
        for shard in node.shards:
            if shard >= shard_count:
                continue
            if node.routable:
                replicas[shard] += 1
                throughput[shard] += speeds[node.key] if measured else 1
            elif node.status in PENDING:
                pending[shard] += 1
    supply = tuple(
        ShardSupply(shard, replicas[shard], throughput[shard], pending[shard])
        for shard in range(shard_count)
    )
    return supply, measured


def pool_speeds(nodes: Sequence[PoolNode]) -> dict[str, int]:
    """node key → measured tokens/s, of the nodes the committee lists a speed for."""
    return {n.key: n.speed for n in nodes if n.speed is not None}


def speed_basis(nodes: Sequence[PoolNode], speeds: Mapping[str, int], measured: bool) -> str:
    """What the choice weighed, in words: measured speeds, or replica counts and why."""
    if measured:
        return "weighed by the speeds the verifiers measured (tokens/s, the committee's median)"
    routable = [n for n in nodes if n.routable]
    if not routable:
        return "weighed by replica counts (no routable node to measure yet)"
    unmeasured = sum(1 for n in routable if n.key not in speeds)
    return (
        f"weighed by replica counts: {unmeasured} of {len(routable)} routable "
        f"node{'' if len(routable) == 1 else 's'} {'has' if unmeasured == 1 else 'have'} no "
        "measured speed yet"
    )


def choose_shard(
    model: str,
    shard_count: int,
    nodes: Sequence[PoolNode],
    *,
    own_key: str | None = None,
    speeds: Mapping[str, int] | None = None,
    floor: int = DEFAULT_REPLICA_FLOOR,
) -> Placement:
    """The shard a new node of `model` (`shard_count` shards in the ModelRegistry; 0: not
    registered) should serve, and why (`floor`: the chain's replica floor)."""
    if shard_count == 0:
        raise ModelNotRegistered(model)
    if not 0 < shard_count <= MAX_SHARDS:
        raise UsageError(f"model {model}: {shard_count} shards is not a shard count")
    if speeds is None:
        speeds = pool_speeds(nodes)
    supply, measured = pool_supply(nodes, shard_count, speeds)
    basis = speed_basis(nodes, speeds, measured)
    own = next((n for n in nodes if n.key == own_key), None) if own_key else None
    if own is not None and own.shards[0] < shard_count:
        shard = own.shards[0]
        reason = (
            f"shard {shard} of {shard_count}: this node key is already registered for it "
            "(it moves only by rebalancing: `move_shards`, node/agent/mover.py)"
        )
        return Placement(model, shard, supply, measured, reason, basis)

    def filled(s: ShardSupply) -> bool:
        return s.replicas + s.pending >= floor

    weakest = min(supply, key=lambda s: (filled(s), s.throughput, s.pending, s.shard))
    reason = _reason(weakest, supply, measured)
    slowest = min(supply, key=lambda s: (s.throughput, s.pending, s.shard))
    if slowest.shard != weakest.shard:  # the floor decided, not the throughput
        reason += (
            f"; below the replica floor of {floor} (shard {slowest.shard} has "
            f"{_amount(slowest, measured)}, at or above it)"
        )
    return Placement(model, weakest.shard, supply, measured, reason, basis)


def choose_span(
    model: str,
    shard_count: int,
    nodes: Sequence[PoolNode],
    size: int,
    *,
    own_key: str | None = None,
    speeds: Mapping[str, int] | None = None,
    floor: int = DEFAULT_REPLICA_FLOOR,
) -> Placement:
    """The `size` consecutive shards a new node of `model` should serve as one hop (module
    docstring, *Spans*), and why; `size` 1 is `choose_shard`."""
    if size == 1:
        return choose_shard(model, shard_count, nodes, own_key=own_key, speeds=speeds, floor=floor)
    if shard_count == 0:
        raise ModelNotRegistered(model)
    if not 1 <= size <= min(shard_count, MAX_SHARDS_PER_NODE):
        raise UsageError(
            f"--shards {size}: the model has {shard_count} shards",
            hint=f"serve 1 to {min(shard_count, MAX_SHARDS_PER_NODE)} consecutive shards",
        )
    if speeds is None:
        speeds = pool_speeds(nodes)
    supply, measured = pool_supply(nodes, shard_count, speeds)
    basis = speed_basis(nodes, speeds, measured)
    own = next((n for n in nodes if n.key == own_key), None) if own_key else None
    if own is not None and len(own.shards) == size and own.shards[-1] < shard_count:
        span = ShardSpan(own.shards[0], own.shards[-1])
        reason = f"shards {span} of {shard_count}: this node key is already registered for them"
        return Placement(model, span.first, supply, measured, reason, basis, last=span.last)

    def key(s: ShardSupply) -> tuple[bool, int, int, int]:
        return (s.replicas + s.pending >= floor, s.throughput, s.pending, s.shard)

    windows = [supply[first : first + size] for first in range(shard_count - size + 1)]
    chosen = min(windows, key=lambda w: (sorted(key(s)[:3] for s in w), w[0].shard))
    weakest = min(chosen, key=key)
    span = ShardSpan(chosen[0].shard, chosen[-1].shard)
    reason = (
        f"shards {span} of {shard_count} as one hop: the {size} consecutive shards that are "
        f"weakest together; its weakest, {_reason(weakest, supply, measured)}"
    )
    return Placement(model, span.first, supply, measured, reason, basis, last=span.last)


class NotEnoughMemory(UsageError):
    """Not even one shard of the pool fits in what the machine has (`choose_auto_span`)."""

    code = "not_enough_memory"

    def __init__(self, shard: int, need: int, fit: MemoryFit) -> None:
        super().__init__(
            f"shard {shard} needs {_size(need)} (weights {_size(need - fit.kv_bytes)} + KV caps "
            f"{_size(fit.kv_bytes)}); this machine has {fit.said()}",
            hint="free memory or join from a larger machine; --shard K or --shards 1 joins "
            "without this check",
        )


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """What a joining node can hold: the machine's available memory and the headroom kept
    back (bytes), each shard's resident weights (bytes, by shard index) and the node's KV caps
    (bytes, one process: counted once whatever its span)."""

    available: int
    headroom: int
    shard_bytes: tuple[int, ...]
    kv_bytes: int

    @property
    def usable(self) -> int:
        return max(0, self.available - self.headroom)

    def cost(self, first: int, last: int) -> int:
        return sum(self.shard_bytes[first : last + 1]) + self.kv_bytes

    def fits(self, first: int, last: int) -> bool:
        return self.cost(first, last) <= self.usable

    def said(self, first: int | None = None, last: int | None = None) -> str:
        """'1.1 GiB of 5.8 GiB available less 1.0 GiB headroom' (without a span: no need)."""
        room = f"{_size(self.available)} available less {_size(self.headroom)} headroom"
        if first is None or last is None:
            return room
        return f"{_size(self.cost(first, last))} with its KV caps, of {room}"


def choose_auto_span(
    model: str,
    shard_count: int,
    nodes: Sequence[PoolNode],
    fit: MemoryFit,
    *,
    own_key: str | None = None,
    speeds: Mapping[str, int] | None = None,
    floor: int = DEFAULT_REPLICA_FLOOR,
) -> Placement:
    """`--shards auto`: the span (or shard) a new node of `model` should serve, sized by what it
    fits (`fit`) and what the pool lacks (module docstring), and why; `NotEnoughMemory` when not
    even the shard it would take fits."""
    if shard_count == 0:
        raise ModelNotRegistered(model)
    if len(fit.shard_bytes) != shard_count:
        raise UsageError(
            f"model {model}: the manifest has {len(fit.shard_bytes)} shards, the ModelRegistry "
            f"{shard_count}",
            hint="use the manifest of the model as registered (`planet devnet status`)",
        )
    own = next((n for n in nodes if n.key == own_key), None) if own_key else None
    if own is not None and own.shards[-1] < shard_count:  # keeps its registration
        kept = choose_span(
            model, shard_count, nodes, len(own.shards), own_key=own_key, speeds=speeds, floor=floor
        )
        return _fitting(kept, fit, kept.reason)
    if speeds is None:
        speeds = pool_speeds(nodes)
    supply, measured = pool_supply(nodes, shard_count, speeds)
    basis = speed_basis(nodes, speeds, measured)
    unserved = [s.replicas + s.pending == 0 for s in supply]
    if not any(unserved):
        one = choose_shard(model, shard_count, nodes, speeds=speeds, floor=floor)
        reason = (
            f"{one.reason}; one shard ({fit.said(one.shard, one.shard)}): every shard has a "
            "node, and a span raises the pool's throughput only where this node is faster than "
            "each of its shards' replicas by the span's length, which a joining node does not "
            "know before the verifiers measure it (--shards N serves N)"
        )
        return _fitting(one, fit, reason)
    best: tuple[int, int] | None = None  # (first, last)
    for first in range(shard_count):
        if not unserved[first] or not fit.fits(first, first):
            continue
        last = first
        while (
            last + 1 < shard_count
            and unserved[last + 1]
            and last + 1 - first < MAX_SHARDS_PER_NODE
            and fit.fits(first, last + 1)
        ):
            last += 1
        if best is None or last - first > best[1] - best[0]:
            best = (first, last)
    if best is None:
        smallest = min(
            (s for s in range(shard_count) if unserved[s]), key=lambda s: fit.shard_bytes[s]
        )
        raise NotEnoughMemory(smallest, fit.cost(smallest, smallest), fit)
    first, last = best
    span = ShardSpan(first, last)
    missing = [s for s in range(shard_count) if unserved[s]]
    lack = (
        f"{'shard' if len(missing) == 1 else 'shards'} {_shards(missing)} of {shard_count} "
        f"{'has' if len(missing) == 1 else 'have'} no node"
    )
    serving = f"serving {'it' if len(missing) == 1 else 'them'}"
    if span.size < len(missing):
        serving = f"serving {'shard' if span.size == 1 else 'shards'} {span}"
    if span.size > 1:
        serving += " as one hop"
    room = fit.said(first, last)
    if span.size == len(missing):
        why = "makes the model answerable" if span.size == shard_count else "completes the pool"
        reason = f"{lack}; {serving} ({room}) {why}"
    else:
        reason = (
            f"{lack}; {serving}, the longest run of them this machine holds ({room}); the rest "
            "still need nodes"
        )
    return Placement(
        model, first, supply, measured, reason, basis, last=last if last > first else None
    )


def _fitting(placement: Placement, fit: MemoryFit, reason: str) -> Placement:
    span = placement.span
    if not fit.fits(span.first, span.last):
        raise NotEnoughMemory(span.first, fit.cost(span.first, span.last), fit)
    return replace(placement, reason=reason)


def _shards(shards: list[int]) -> str:
    """[2] → '2'; [0, 1, 2] → '0-2'; [0, 2, 3] → '0, 2-3' (runs of consecutive shards)."""
    runs: list[list[int]] = []
    for shard in shards:
        if runs and shard == runs[-1][-1] + 1:
            runs[-1].append(shard)
        else:
            runs.append([shard])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _size(count: int) -> str:
    if count < 1024**3:
        return f"{count / 1024**2:.0f} MiB"
    return f"{count / 1024**3:.1f} GiB"


# -- the reason, in one line ---------------------------------------------------------------------


def _reason(chosen: ShardSupply, supply: tuple[ShardSupply, ...], measured: bool) -> str:
    head = f"shard {chosen.shard} of {len(supply)}"
    if len(supply) == 1:
        return f"{head}: the model has one shard"
    others = [s for s in supply if s.shard != chosen.shard]
    tied = any((s.throughput, s.pending) == (chosen.throughput, chosen.pending) for s in others)
    if all((s.throughput, s.pending) == (chosen.throughput, chosen.pending) for s in others):
        every = (
            "no shard has a routable node yet"
            if chosen.replicas == 0
            else f"every shard has {_amount(chosen, measured)}"
        )
        return f"{head}: {every}; ties go to the lowest shard index"
    line = f"{head}: it has {_amount(chosen, measured)}{_joining(chosen.pending)} "
    line += f"({_summary(others, measured)})"
    return line + ("; ties go to the lowest shard index" if tied else "")


def _amount(supply: ShardSupply, measured: bool) -> str:
    nodes = f"{supply.replicas} routable node{'' if supply.replicas == 1 else 's'}"
    return f"{supply.throughput} tokens/s over {nodes}" if measured else nodes


def _joining(pending: int) -> str:
    return f" + {pending} joining" if pending else ""


def _summary(others: list[ShardSupply], measured: bool) -> str:
    """'shards 0 and 1 have 1 each', 'shard 0 has 2, shard 1 has 1 + 1 joining'."""
    groups: dict[tuple[int, int, int], list[int]] = {}
    for s in others:
        groups.setdefault((s.throughput, s.replicas, s.pending), []).append(s.shard)
    parts = []
    for (throughput, replicas, pending), shards in sorted(groups.items(), key=lambda g: g[1][0]):
        amount = f"{throughput} tokens/s over {replicas}" if measured else str(replicas)
        if len(shards) == 1:
            parts.append(f"shard {shards[0]} has {amount}{_joining(pending)}")
        else:
            parts.append(f"shards {_listing(shards)} have {amount} each{_joining(pending)}")
    return ", ".join(parts)


def _listing(shards: list[int]) -> str:
    """[0, 1] → '0 and 1'; [0, 1, 2, 5, 7, 8] → '0-2, 5, 7-8' (long lists stay short)."""
    if len(shards) <= 3:
        return ", ".join(map(str, shards[:-1])) + f" and {shards[-1]}"
    return _shards(shards)
