"""What a hop is expected to cost, from what the client observed; and the choice among replicas.

**Prefix-aware** (issue 44): a node's /info also advertises the prompt prefixes its prefix cache
holds (`prefix_routes`, protocol/prefix_routes.py; a summary out of shape is refused by name,
`bad_prefix_summary`, and the node counts as holding nothing). `choose(..., prefer=)` then picks
among the near-cheapest those holding the most leading blocks of the question's prompt: the
load decides first, the prefix only among nodes the load allows. A node that lies about what
it holds only draws questions it then prefills cold, within the band its cost earns it.

Per node (keyed by its URL) the book keeps exponentially weighted moving averages (EWMA,
weight `alpha` for the newest sample) of

- `rtt_s`: the round trip of its GET /info (the HTTP exchange includes the node's event-loop
  lag, so a loaded node answers later too);
- `step_s`: its compute per decode step, from its /info counters: Δ`load.decode_s` /
  Δ`load.decode_batches` between two answers (one decode forward — a batch of sessions' steps —
  runs all of the node's layers once; prefill chunks, whose cost grows with their length, are
  left out);

and the latest load it reported: frames `queued` for its forward thread, open `sessions`, and
the caps `max_batch`, `max_queued`, `max_sessions`. The expected seconds one hop adds to a token
(the Petals route cost: half a round trip plus compute; Parallax's load term):

    cost_s = rtt_s / 2 + step_s × (1 + queued / max_batch) × (1 + sessions / max_sessions)

A node whose queue or session table is full is **overloaded** and treated as unreachable
(Parallax). A node never observed gets `DEFAULT_RTT_S` and the median step of the others, so
it is tried. `choose` picks uniformly at random among the candidates whose cost is within
`near` × the cheapest (+ `slack_s`): equal replicas share the load and no node always gets a
user's position, while a node several times slower than its replicas is left out.

Only the round trip is the client's own measurement; the compute term comes from the node's
own counters, and a stranger can lie there (zero step, empty queue) to draw every user's
positions to itself — the privacy seed's adversary wants exactly that. So in `choose` a node's
compute term counts as at least the median of its replicas' terms ÷ `near`: a liar lands in
the near-equal band and gets its random share, not the whole load; a really faster node gets
the same share (the price of not trusting the claim), a really slower one is still left out.
The floor needs `FLOOR_MIN_REPLICAS` candidates: between two, "a liar and an honest node" and
"a fast node and one 3× slower" report the same numbers, and leaving the slow one out wins.

**Claims checked against what the client saw.** Each generation tells the book how long its
decode passes took through its circuit (`observe_circuit`, the client's own clock; EWMA per
node, forgotten after `SEEN_TTL_S`). Replicas of a shard are paired with the other shards'
nodes alike, so what a circuit adds beyond one node's own cost — the other hops, the links,
the client — is common to them: `shared` = min over the seen nodes of (seen − claimed cost),
and a node's cost is at least seen − shared. An honest node's claim explains its passes; a
node claiming less than it costs explains less, so `shared` comes from an honest one and the
liar is priced at what it does (a liar as fast as it claims is not lying). A node not seen
lately beside seen ones counts as the cheapest and is tried first (not on a coin flip among
the near-equal), then measured. A node
claiming *more* than it costs can only flatten the choice toward uniform, never draw load.

**Trials back off.** Each such trial costs the user whose question it is: a node 3× slower than
its replica, tried once a minute, puts its slow steps into that minute's p99. So a node picked
while not seen lately (a trial) is not counted as the cheapest again before `TRIAL_BACKOFF_S`
× 2^(trials in a row), at most `MAX_TRIAL_BACKOFF_S`; meanwhile its claim prices it like any
node's. A pick while it is seen (it is among the near-equal) ends the row; a node seen outside
the band counts as one failed trial (`_seen_slow`). A node the client
saw slow stays out longer and longer; a liar claiming to be cheap is still picked by its own
claim and measured again as soon as its passes age out; one trial at a time, however many
questions start together.
"""

from __future__ import annotations

import logging
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from protocol.open_features import (
    OLD_NODE,
    BadOpenFeaturesError,
    OpenFeatures,
    open_features_of,
)
from protocol.prefix_routes import (
    BadPrefixSummaryError,
    PrefixRoutes,
    matched_blocks,
    parse_prefix_routes,
    route_keys,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RTT_S = 0.15  # an unmeasured round trip (Petals' default)
ALPHA = 0.3  # weight of the newest sample in the averages
NEAR = 1.5  # candidates within this factor of the cheapest are "near-equal" ...
SLACK_S = 0.01  # ... plus this many seconds (the noise of a shared machine's step times)
STALE_S = 2.0  # stats older than this are refreshed before (or while) choosing
FLOOR_MIN_REPLICAS = 3  # the claim floor needs ≥ 2 other replicas to take a median of
SEEN_TTL_S = 60.0  # a node's observed passes older than this are forgotten (it is explored again)
MOVE_FACTOR = 2.0  # a node on trial is left mid-answer beyond this × the cheapest (+ slack_s)
TRIAL_BACKOFF_S = 60.0  # after a trial, not counted as the cheapest for this × 2^trials ...
MAX_TRIAL_BACKOFF_S = 600.0  # ... at most this long


@dataclass
class NodeStats:
    rtt_s: float | None = None
    step_s: float | None = None
    queued: int = 0
    sessions: int = 0
    max_batch: int = 1
    max_queued: int = 0  # 0: unknown
    max_sessions: int = 0  # 0: unknown
    decode_s: float | None = None  # the node's counters at the last answer
    decode_batches: int | None = None
    updated_s: float = float("-inf")
    seen_s: float | None = None  # EWMA of the decode passes of circuits through this node
    seen_at_s: float = float("-inf")
    trials: int = 0  # picks in a row while not seen lately (module docstring)
    trial_after_s: float = float("-inf")  # not counted as the cheapest before this
    # the prompt prefixes its prefix cache holds (protocol/prefix_routes.py), from its /info;
    # None: none advertised, or its summary was refused (`prefix_refused` counts those)
    prefix_routes: PrefixRoutes | None = None
    prefix_refused: int = 0
    # the open fields it takes beyond the first open, from its /info (protocol/open_features.py;
    # OLD_NODE: none advertised, or the advertisement was refused): `next.alternates` goes
    # only to a previous hop that takes it
    open_features: OpenFeatures = OLD_NODE

    @property
    def overloaded(self) -> bool:
        return (0 < self.max_sessions <= self.sessions) or (0 < self.max_queued <= self.queued)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and 0 <= value < 1e12 else None  # no NaN, no junk


def _count(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None else 0


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class CostBook:
    """Observed costs per node URL. Plain Python; clock and randomness injectable."""

    def __init__(
        self,
        *,
        alpha: float = ALPHA,
        near: float = NEAR,
        slack_s: float = SLACK_S,
        clock: Callable[[], float] = time.monotonic,
        rng: Any = None,
    ) -> None:
        self.alpha = alpha
        self.near = near
        self.slack_s = slack_s
        self._clock = clock
        self._random = rng or secrets.SystemRandom()
        self.stats: dict[str, NodeStats] = {}

    def get(self, url: str) -> NodeStats:
        return self.stats.setdefault(url, NodeStats())

    def stale(self, url: str) -> bool:
        return self._clock() - self.get(url).updated_s > STALE_S

    def observe_info(self, url: str, info: Any, rtt_s: float) -> None:
        """A node's GET /info answered `info` after `rtt_s` seconds (untrusted: anything that
        is not a sane number counts as unknown)."""
        stats = self.get(url)
        stats.rtt_s = _ewma(stats.rtt_s, max(rtt_s, 0.0), self.alpha)
        stats.updated_s = self._clock()
        if not isinstance(info, dict):
            return
        load = info.get("load") if isinstance(info.get("load"), dict) else {}
        busy, steps = _number(load.get("decode_s")), _number(load.get("decode_batches"))
        if busy is not None and steps is not None:
            if stats.decode_s is not None and stats.decode_batches is not None:
                forwards = steps - stats.decode_batches
                if forwards > 0 and busy >= stats.decode_s:
                    step = (busy - stats.decode_s) / forwards
                    stats.step_s = _ewma(stats.step_s, step, self.alpha)
            stats.decode_s, stats.decode_batches = busy, int(steps)
        stats.queued = _count(load.get("queued"))
        stats.sessions = _count(info.get("sessions"))
        stats.max_batch = max(1, _count(info.get("max_batch")))
        stats.max_queued = _count(info.get("max_queued"))
        stats.max_sessions = _count(info.get("max_sessions"))
        try:
            stats.prefix_routes = parse_prefix_routes(info.get("prefix_routes"))
        except BadPrefixSummaryError as error:
            stats.prefix_routes = None
            stats.prefix_refused += 1
            log.warning("node's prefix summary refused url=%s %s: %s", url, error.code, error)
        try:
            stats.open_features = open_features_of(info)
        except BadOpenFeaturesError as error:  # counted as a node of before
            stats.open_features = OLD_NODE
            log.warning("node's open features refused url=%s %s: %s", url, error.code, error)

    def observe_circuit(self, urls: Sequence[str], pass_s: float) -> None:
        """A circuit through `urls` took `pass_s` seconds per decode pass (the client's own
        clock, send to answer): counted for each of its nodes."""
        if not 0 <= pass_s < 1e6:
            return
        now = self._clock()
        for url in dict.fromkeys(urls):
            stats = self.get(url)
            fresh = now - stats.seen_at_s <= SEEN_TTL_S
            stats.seen_s = _ewma(stats.seen_s if fresh else None, pass_s, self.alpha)
            stats.seen_at_s = now

    def _seen(self, url: str) -> float | None:
        stats = self.get(url)
        return stats.seen_s if self._clock() - stats.seen_at_s <= SEEN_TTL_S else None

    def observe_failure(self, url: str) -> None:
        """The node did not answer: its round trip counts as unknown-and-slow until it does."""
        stats = self.get(url)
        stats.rtt_s = _ewma(stats.rtt_s, 2 * DEFAULT_RTT_S, self.alpha)
        stats.updated_s = self._clock()

    def compute_s(self, url: str, default_step_s: float = 0.0) -> float:
        """The compute term of a hop's cost: its step, stretched by its queue and sessions."""
        stats = self.get(url)
        step = default_step_s if stats.step_s is None else stats.step_s
        waiting = 1 + stats.queued / stats.max_batch
        sharing = 1 + (stats.sessions / stats.max_sessions if stats.max_sessions else 0.0)
        return step * waiting * sharing

    def cost_s(
        self,
        url: str,
        default_step_s: float = 0.0,
        default_rtt_s: float = DEFAULT_RTT_S,
        floor_s: float = 0.0,
    ) -> float:
        """rtt / 2 + compute, the compute term no lower than `floor_s` (see `choose`)."""
        stats = self.get(url)
        rtt = default_rtt_s if stats.rtt_s is None else stats.rtt_s
        return rtt / 2 + max(self.compute_s(url, default_step_s), floor_s)

    @staticmethod
    def _checked(costs: list[float], seen: list[float | None], triable: list[bool]) -> list[float]:
        """The claimed costs checked against what the client saw (module docstring); a node
        not seen lately counts as the cheapest when `triable`."""
        measured = {i: value for i, value in enumerate(seen) if value is not None}
        if not measured or len(seen) == 1:
            return costs
        if len(measured) < len(seen):  # not seen lately: as cheap as the cheapest, so tried
            cheapest = min(costs)
            costs = [
                cost if i in measured or not triable[i] else cheapest
                for i, cost in enumerate(costs)
            ]
        if len(measured) < 2:
            return costs
        # what a circuit adds beyond one node's own cost, from the node whose claim explains
        # the most of what was seen (an under-claimer explains less: never the one)
        shared = min(value - costs[i] for i, value in measured.items())
        return [
            max(cost, measured[i] - shared) if i in measured else cost
            for i, cost in enumerate(costs)
        ]

    def overloaded(self, url: str) -> bool:
        return self.get(url).overloaded

    def choose(
        self,
        candidates: Sequence[T],
        url: Callable[[T], str],
        prefer: Callable[[T], int] | None = None,
    ) -> T | None:
        """One of `candidates` (see the module docstring); None when there is none. Overloaded
        ones only when every candidate is. `prefer` (a question's prefix: how many leading
        blocks of its prompt a candidate's prefix cache holds, protocol/prefix_routes.py):
        among the near-cheapest, those holding the most are chosen from, so a prefix moves
        a question only when the load allows."""
        if not candidates:
            return None
        usable = [c for c in candidates if not self.overloaded(url(c))] or list(candidates)
        now = self._clock()
        seen = [self._seen(url(c)) for c in usable]
        triable = [now >= self.get(url(c)).trial_after_s for c in usable]
        costs = self._priced(usable, url, seen, triable)
        limit = min(costs) * self.near + self.slack_s
        near = [i for i, cost in enumerate(costs) if cost <= limit]
        due: list[int] = []
        if any(value is not None for value in seen):
            # explore first: a node due for a trial is tried now, not on a coin flip, and
            # before any prefix preference (a new node holds no prefix: it would never be tried)
            due = [i for i in near if seen[i] is None and triable[i]]
            for i, cost in enumerate(costs):
                if seen[i] is not None and cost > limit:
                    self._seen_slow(url(usable[i]))
        if due:
            near = due
        elif prefer is not None and len(near) > 1:
            held = [prefer(usable[i]) for i in near]
            if max(held) > 0:
                near = [i for i, count in zip(near, held, strict=True) if count == max(held)]
        pick = near[self._random.randrange(len(near))]
        trial = seen[pick] is None and any(value is not None for value in seen)
        self._count_trial(url(usable[pick]), trial, now)
        return usable[pick]

    def outpriced(self, candidates: Sequence[T], url: Callable[[T], str], node: T) -> bool:
        """Whether `node`, picked on trial and now seen, costs more than `MOVE_FACTOR` × the
        cheapest of `candidates` (its shard's, itself among them; at least the near band): the
        client moves off it mid-answer instead of finishing the answer on it. Wider than the
        band, because a move costs a replay and three passes on a busy machine are noisy.
        Nodes not seen lately count at their claims here (no trial is made by asking)."""
        if self.get(url(node)).trials == 0 or self._seen(url(node)) is None:
            return False
        usable = [c for c in candidates if not self.overloaded(url(c))]
        if node not in usable or len(usable) < 2:
            return False
        seen = [self._seen(url(c)) for c in usable]
        costs = self._priced(usable, url, seen, [False] * len(usable))
        return costs[usable.index(node)] > min(costs) * max(self.near, MOVE_FACTOR) + self.slack_s

    def _priced(
        self,
        usable: Sequence[T],
        url: Callable[[T], str],
        seen: list[float | None],
        triable: list[bool],
    ) -> list[float]:
        """Each usable candidate's expected cost, its claim floored and checked (docstring)."""
        known = [s.step_s for c in usable if (s := self.get(url(c))).step_s is not None]
        default_step = statistics.median(known) if known else 0.0
        # a node not measured yet costs what the typical measured one does: it gets its turns
        # (and its measurements) instead of starving behind a guess
        rtts = [s.rtt_s for c in usable if (s := self.get(url(c))).rtt_s is not None]
        default_rtt = statistics.median(rtts) if rtts else DEFAULT_RTT_S
        # the compute term is self-reported: a node may claim no queue and a zero step. It is
        # floored at the median of its replicas' terms / `near`, so a claim can buy a place
        # among the near-equal (a share of the load), never the whole load
        computes = [self.compute_s(url(c), default_step) for c in usable]
        costs = [
            self.cost_s(
                url(c),
                default_step,
                default_rtt,
                statistics.median(computes[:i] + computes[i + 1 :]) / self.near
                if len(usable) >= FLOOR_MIN_REPLICAS
                else 0.0,
            )
            for i, c in enumerate(usable)
        ]
        return self._checked(costs, seen, triable)

    def _seen_slow(self, url: str) -> None:
        """A node the client's own passes put outside the band counts as a failed trial: once
        its passes age out it is not counted as the cheapest for `TRIAL_BACKOFF_S` × 2 more
        (a node first met slow on a cold start, before anything else was seen, is otherwise
        tried again as soon as its passes are forgotten)."""
        stats = self.get(url)
        if stats.trials == 0:
            stats.trials = 1
            due = stats.seen_at_s + SEEN_TTL_S + TRIAL_BACKOFF_S * 2
            stats.trial_after_s = max(stats.trial_after_s, due)

    def _count_trial(self, url: str, trial: bool, now: float) -> None:
        """A pick of a node not seen lately beside seen ones is a trial: back off the next."""
        stats = self.get(url)
        if not trial:
            stats.trials = 0
            return
        stats.trials += 1
        wait = TRIAL_BACKOFF_S * 2 ** min(stats.trials, 16)
        stats.trial_after_s = now + min(wait, MAX_TRIAL_BACKOFF_S)


def prefix_preference(
    book: CostBook, prompt: Sequence[int], upstream: Sequence[str], url: Callable[[T], str]
) -> Callable[[T], int]:
    """`choose`'s `prefer` for a question: how many leading blocks of `prompt` a candidate
    advertises holding behind the hops at `upstream` (protocol/prefix_routes.py)."""

    def held(candidate: T) -> int:
        routes = book.get(url(candidate)).prefix_routes
        if routes is None:
            return 0
        return matched_blocks(routes, route_keys(routes.salt, list(upstream), prompt))

    return held
