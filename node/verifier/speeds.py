"""A verifier's measurement of the nodes' decode speed (issue 44), reported in its vote extension.

The verifier times nothing it does not ask: each sampled challenge (sampled.py) is an ordinary
user's completion of `sampled_tokens` tokens through one circuit (one node per shard), and the
asker times the completion request itself (`Asked.seconds`: from sending it to reading the whole
answer, the deposit before it not counted) on its own monotonic clock. An answer is one timed
observation of its circuit,

    y = seconds / checked tokens        (seconds per token of the whole circuit)

where `checked tokens` are the positions the replay checked (`SampledCheck.observed`), counted
only when the answer scored clean (credibility 10^6: a circuit that answered fast by not
computing must not be credited its speed) and at least `MIN_TIMED_TOKENS` positions were
checked (a two-token answer times mostly the prompt's prefill and the hops).

Per node, not per circuit. With one session a pipeline's time per token is the sum of its
stages' times, so each observation is one linear equation

    y_circuit = Σ_{node n of the circuit} t_n

in the nodes' own seconds per token `t_n` (`stage_times`). The client head, the gateway, the
hops and the prompt's prefill (amortised over the tokens) are not estimated apart: they are
in y and so in the nodes' t, split between the circuit's stages like the rest. The estimate:

1. identical circuits are merged, keeping the fastest answer (a delay only ever adds time);
2. least squares over all kept circuits, the solution nearest each node's *prior* (an equal
   share of its fastest circuit, `y / len(circuit)`) among those that fit equally well;
3. the *gauge*: circuits that always hold one node per shard fix every difference between two
   nodes of one shard that some circuits connect, and the sum over shards, but never how a
   circuit's time divides between shards (add δ to every node of shard 0, take δ from every
   node of shard 1: every circuit's sum is unchanged). No estimator can learn it from whole
   circuits' times. This one assumes the shards cost alike: the fastest node of every shard
   gets the same time, so a circuit's common time is split evenly and only measured
   differences separate nodes. A node seen at two shard positions (it moved within the
   window) ties them: positions so tied shift together, and their difference is measured
   (the node's time taken as the same on either shard). With circuits of different lengths
   there is no such shift and step 2's prior decides;
4. bounds: a node is never slower than its fastest circuit (t_n ≤ min y: the old rule's value
   is a floor on its speed), and never faster than `MAX_SKEW` × an even share of the fastest
   circuit the verifier saw (t_n ≥ min y / (L × MAX_SKEW)), so noise in a fit cannot credit a
   node any speed up to the chain's bound.

One-hop probes separate the shards. Whole circuits never tell step 3's gauge; a verifier's
own timing of ONE node does (`HopTimed`, measured by hop_probe.py): the verifier computes a
shard's input itself (it holds every shard for its spot checks), opens a few sessions at that
one node as the circuit's last hop (an `open` without `next`), steps them at once, each one
position at a time, and times them on its own monotonic clock, from the first frame sent to
the last output read: several sessions in flight keep the node computing while frames travel,
so the time is the node's compute plus about one round trip. The probe counts only when every
output matched its own recomputation (`clean`) and the node computed at least
`MIN_TIMED_TOKENS` positions. Normalized by the work,

    u = seconds / (positions × layers)      (seconds per position per layer of the shard)

with `positions` all the probe's sessions' together and `layers` the shard's layer count from
the verifier's own manifest (never the node's /info), a node's probes at different shards
compare (it moved within the window). Its time on its shard is `min u × layers` of its latest
probe's shard: its stage time (plus a round trip spread over the probe's positions), no share
of head, gateway or hops. Used so:

5. a probed node's time IS its probe's (step 4's bounds still apply): nothing another node
   does, in a circuit or elsewhere, moves it, and the only way for a node to move its own
   value is how fast it answers the verifier (slow on purpose: slower; fast: by computing);
6. the gauge of step 3 is anchored, per group of positions with a probed node, to the probes:
   the group's nodes shift together by the median of (probe − fit) over its probed nodes, so
   an unprobed node is read beside its shard's probed ones at the difference the circuits
   measured. A group with no probed node keeps step 3's even split.

Nothing a node says is read: the node key and shard are those the verifier dialled and sent,
the layers its manifest's, the seconds its clock's, the outputs its recomputation's.

What it needs: to tell two nodes of one shard apart, circuits that differ in them (and share
the rest, or are linked by a chain of such) must have been timed: several sampled challenges,
or the last `WINDOW_EPOCHS` epochs together (`EpochSpeeds.carry`). A node only ever seen in
one circuit gets that circuit's time split evenly between its nodes: a fast node beside a slow
one then reads the same, and only a circuit that swaps one of them tells them apart. The
reported value is still an integer

    speed = ⌊1 / t_n⌋ tokens/s, clamped to [1, 100 000] (protocol/speeds.py)

now a node's own stage rate (with its share of head and hops), no longer a whole circuit's.
The speeds of the nodes the epoch's report scores go into `reputation_scores.json` (report.py)
and from there into the validator's vote extension; the committee keeps the lower median over
verifiers (abci_app/speeds.py). `circuit_speeds` keeps the old rule (each node credited its
best circuit's speed: step 4's floor) for comparison (bench/placement.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from protocol.speeds import MAX_SPEED, MIN_SPEED

MIN_TIMED_TOKENS = 8  # checked positions an answer needs for its time to count
WINDOW_EPOCHS = 4  # epochs of observations one estimate uses (this one and the 3 before)
MAX_CIRCUITS = 512  # distinct circuits kept (the newest): bounds the solve, not the answer
SLOWEST_S = 1e6  # seconds per token above which every value is the chain's floor anyway
COUNT_CAP = 10**18  # checked tokens beyond this are taken as this many
MAX_SKEW = 8  # no node is credited more than 8 × an even share of the fastest circuit seen
MAX_HOPS = 1024  # one-hop probes kept (the newest)


def decode_speed(tokens: int, seconds: float) -> int:
    """Tokens/s of `tokens` decoded in `seconds`, floored and clamped to the chain's bounds."""
    if not seconds > 0:  # 0, negative or not a number
        return MAX_SPEED
    return max(MIN_SPEED, min(MAX_SPEED, int(min(tokens, COUNT_CAP) / seconds)))


def rate(seconds_per_token: float) -> int:
    """⌊1 / t⌋ tokens/s, clamped to the chain's bounds (t ≤ 0: the upper bound)."""
    if seconds_per_token <= 1.0 / MAX_SPEED:
        return MAX_SPEED
    per_second = round(1.0 / seconds_per_token, 6)  # 47.9999999 of a float sum is 48
    return max(MIN_SPEED, min(MAX_SPEED, int(per_second)))


@dataclass(frozen=True, slots=True)
class Timed:
    """One clean timed answer: its circuit (node keys, shard order), checked tokens, seconds."""

    nodes: tuple[str, ...]
    tokens: int
    seconds: float

    @property
    def per_token(self) -> float:
        """Seconds per token, within [0, `SLOWEST_S`] (a non-positive time reads 0: the circuit
        is credited the chain's top speed, as `decode_speed` does; a count past 10^18 reads as
        10^18, which already rounds any time to the top speed)."""
        seconds = min(max(0.0, self.seconds), SLOWEST_S * COUNT_CAP)
        return min(seconds / min(self.tokens, COUNT_CAP), SLOWEST_S)


@dataclass(frozen=True, slots=True)
class HopTimed:
    """One clean one-hop probe the verifier timed itself: the node it dialled, the shard it sent
    (its position in the model), that shard's layer count (the verifier's manifest), the
    positions the node computed (all the probe's sessions'), the seconds on the verifier's
    clock."""

    node: str
    shard: int
    layers: int
    positions: int
    seconds: float

    @property
    def per_unit(self) -> float:
        """Seconds per position per layer, within [0, `SLOWEST_S`] (as `Timed.per_token`)."""
        seconds = min(max(0.0, self.seconds), SLOWEST_S * COUNT_CAP)
        return min(seconds / min(self.positions * self.layers, COUNT_CAP), SLOWEST_S)


def hop_times(hops: Iterable[HopTimed]) -> dict[str, float]:
    """Each probed node's seconds per token on its latest probe's shard: its fastest probe's
    time per position per layer × that shard's layers (at most `SLOWEST_S`); probes without a
    finite time, a positive position count or a positive layer count are dropped."""
    unit: dict[str, float] = {}
    layers: dict[str, int] = {}
    for hop in hops:
        if hop.positions <= 0 or hop.layers <= 0 or not math.isfinite(hop.seconds):
            continue
        unit[hop.node] = min(unit.get(hop.node, math.inf), hop.per_unit)
        layers[hop.node] = hop.layers  # the latest probe's shard
    return {n: min(u * layers[n], SLOWEST_S) for n, u in sorted(unit.items())}


def _circuits(observations: Iterable[Timed]) -> dict[tuple[str, ...], float]:
    """Each distinct circuit's fastest per-token time, the newest `MAX_CIRCUITS` circuits;
    answers without a finite time or a positive token count are dropped."""
    fastest: dict[tuple[str, ...], float] = {}
    for timed in observations:
        if not timed.nodes or timed.tokens <= 0 or not math.isfinite(timed.seconds):
            continue
        y = timed.per_token
        seen = fastest.pop(timed.nodes, None)  # re-inserted: the newest circuits last
        fastest[timed.nodes] = y if seen is None else min(seen, y)
    kept = list(fastest.items())[-MAX_CIRCUITS:]
    return dict(kept)


def circuit_speeds(observations: Iterable[Timed]) -> dict[str, int]:
    """The old rule: every node credited its fastest circuit's speed (a lower bound on its
    own; kept for comparison and as `stage_times`' floor)."""
    best: dict[str, int] = {}
    for nodes, y in _circuits(observations).items():
        for node in nodes:
            best[node] = max(best.get(node, MIN_SPEED), rate(y))
    return dict(sorted(best.items()))


@dataclass(frozen=True, slots=True)
class _Groups:
    """Shard positions joined by the nodes seen at more than one of them."""

    of_position: tuple[int, ...]  # position -> its group
    of_node: dict[str, int]  # node -> the group of the positions it was seen at


def _position_groups(circuits: Sequence[tuple[str, ...]]) -> _Groups | None:
    """The groups of shard positions, when every circuit has the same length; positions a node
    links (seen at both) are one group. Shifting every node of group g by δ_g keeps every
    circuit's time when Σ_g δ_g × |g| = 0: the gauge the circuits leave free. None when the
    circuits differ in length (no such shift)."""
    widths = {len(c) for c in circuits}
    if len(widths) != 1:
        return None
    (width,) = widths
    parent = list(range(width))

    def root(p: int) -> int:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    first: dict[str, int] = {}
    for circuit in circuits:
        for index, node in enumerate(circuit):
            parent[root(index)] = root(first.setdefault(node, index))
    return _Groups(
        of_position=tuple(root(p) for p in range(width)),
        of_node={node: root(index) for node, index in first.items()},
    )


def _equal_shards(t: np.ndarray, nodes: Sequence[str], groups: _Groups) -> np.ndarray:
    """The gauge: shift each group of positions so that its fastest node has the same time,
    the fastest circuit's time split evenly between the positions (every sum unchanged)."""
    members: dict[int, list[int]] = {}
    for j, node in enumerate(nodes):
        members.setdefault(groups.of_node[node], []).append(j)
    fastest = {g: float(min(t[j] for j in js)) for g, js in members.items()}
    width = len(groups.of_position)
    common = sum(groups.of_position.count(g) * fastest[g] for g in members) / width
    shifted = t.copy()
    for g, js in members.items():
        for j in js:
            shifted[j] = t[j] - fastest[g] + common
    return shifted


def _anchored(
    t: np.ndarray, nodes: Sequence[str], groups: _Groups, probed: Mapping[str, float]
) -> np.ndarray:
    """Step 6: each group of positions with a probed node shifted by the median of (probe −
    fit) over its probed nodes; groups without one unchanged."""
    offsets: dict[int, list[float]] = {}
    for j, node in enumerate(nodes):
        if node in probed:
            offsets.setdefault(groups.of_node[node], []).append(probed[node] - float(t[j]))
    shifted = t.copy()
    for j, node in enumerate(nodes):
        found = offsets.get(groups.of_node[node])
        if found:
            shifted[j] = t[j] + float(np.median(found))
    return shifted


def stage_times(observations: Iterable[Timed], hops: Iterable[HopTimed] = ()) -> dict[str, float]:
    """Each node's own seconds per token, estimated from every circuit it was timed in and the
    verifier's one-hop probes (the module docstring: least squares, the gauge, the probes,
    the bounds)."""
    circuits = _circuits(observations)
    probed = hop_times(hops)
    if not circuits:
        return probed
    rows = list(circuits)
    nodes = sorted({n for c in rows for n in c})
    column = {n: j for j, n in enumerate(nodes)}
    a = np.zeros((len(rows), len(nodes)))
    for i, circuit in enumerate(rows):
        for node in circuit:
            a[i, column[node]] += 1.0
    y = np.array([circuits[c] for c in rows])
    upper = np.full(len(nodes), np.inf)  # t_n ≤ its fastest circuit's time
    prior = np.full(len(nodes), np.inf)  # an equal share of that circuit
    for i, circuit in enumerate(rows):
        for node in circuit:
            j = column[node]
            upper[j] = min(upper[j], y[i])
            prior[j] = min(prior[j], y[i] / len(circuit))
    lower = float(y.min()) / (max(len(c) for c in rows) * MAX_SKEW)
    residual = y - a @ prior
    shift, *_ = np.linalg.lstsq(a, residual, rcond=None)  # the least-norm fit: nearest the prior
    t = prior + shift
    groups = _position_groups(rows)
    if groups is not None:
        t = _equal_shards(t, nodes, groups)
        t = _anchored(t, nodes, groups, probed)
    for node, seconds in probed.items():  # step 5: a probed node's own measurement
        if node in column:
            t[column[node]] = seconds
    t = np.minimum(np.maximum(t, lower), upper)
    times = {node: float(t[column[node]]) for node in nodes}
    return {**probed, **times}


def node_speeds(observations: Iterable[Timed], hops: Iterable[HopTimed] = ()) -> dict[str, int]:
    """Each node's own decode rate (tokens/s, integers within the chain's bounds)."""
    return {node: rate(t) for node, t in stage_times(observations, hops).items()}


@dataclass
class EpochSpeeds:
    """The clean timed answers and one-hop probes one epoch's estimate uses: this epoch's and
    those carried from the `WINDOW_EPOCHS - 1` epochs before (`carry`)."""

    epoch: int = 0
    timed: list[tuple[int, Timed]] = field(default_factory=list)  # (epoch, answer), oldest first
    hops: list[tuple[int, HopTimed]] = field(default_factory=list)  # (epoch, probe), oldest first

    def note(
        self, nodes: Sequence[str], tokens: int, seconds: float, clean: bool, *, moved: bool = False
    ) -> int | None:
        """Keep one timed answer of the circuit `nodes`; the circuit's speed, or None when it
        does not count (not clean, fewer than MIN_TIMED_TOKENS checked positions, or `moved`:
        a failover moved part of the answer to another node, so `nodes` names a node that may
        have served none of the timed positions, and the time holds the move's)."""
        if moved or not clean or tokens < MIN_TIMED_TOKENS or not nodes:
            return None
        if not math.isfinite(seconds):
            return None
        self.timed.append((self.epoch, Timed(tuple(nodes), tokens, seconds)))
        del self.timed[: -MAX_CIRCUITS * 2]
        return decode_speed(tokens, seconds)

    def note_hop(
        self, node: str, shard: int, layers: int, positions: int, seconds: float, clean: bool
    ) -> int | None:
        """Keep one one-hop probe (hop_probe.py: `node` the key the verifier dialled, `shard`
        the one it sent, `layers` that shard's in the verifier's manifest, `positions` the
        probe's `work`); the node's speed on it, or None when it does not count (not clean,
        fewer than MIN_TIMED_TOKENS positions, no layers, a time that is not a number)."""
        if not clean or positions < MIN_TIMED_TOKENS or layers <= 0 or not node:
            return None
        if not math.isfinite(seconds):
            return None
        hop = HopTimed(node, shard, layers, positions, seconds)
        self.hops.append((self.epoch, hop))
        del self.hops[:-MAX_HOPS]
        return rate(hop.per_unit * layers)

    def carry(self, epoch: int) -> EpochSpeeds:
        """The speeds of `epoch`, starting from this one's answers and probes still within the
        window."""
        kept = [(e, t) for e, t in self.timed if epoch - WINDOW_EPOCHS < e <= epoch]
        hops = [(e, h) for e, h in self.hops if epoch - WINDOW_EPOCHS < e <= epoch]
        return EpochSpeeds(epoch, kept, hops)

    def of(self, scored: Mapping[str, int]) -> dict[str, int]:
        """The speeds to report beside `scored` (the report's scores): its nodes only."""
        speeds = node_speeds((t for _, t in self.timed), (h for _, h in self.hops))
        return {node: speed for node, speed in speeds.items() if node in scored}
