"""Which nodes a verifier times alone each epoch, and how much work each timing is (issue 44).

A one-hop probe (hop_probe.py, hop_session.py) costs the verifier CPU (it computes the probed
shard's inputs and outputs with its own copies of the shards) and, at a charging node, credits.
So each epoch it times a bounded number of nodes, `HopSettings.per_epoch`, drawn so:

- among the `/nodes` entries of its model that are routable now, with a well-formed key, a
  dialable endpoint (`allowed`: the verifier's address policy) and one shard of the model or a
  span of its consecutive shards (`candidates`; a span is timed as one hop: its first shard's
  inputs in, its last shard's outputs checked, its speed the tokens/s through all its layers,
  reported under the node's key as every speed is);
- a charging node (a price registered on the chain, > 0, on any shard of it) only when the verifier
  has credits to pay it with (`can_pay`); a node with no registered price is probed unpaid (the
  chain redeems nothing there: such a node is routed only while it asks nothing; if it charges
  anyway it refuses the probe and gets no timing);
- first the nodes with no probe in the speed window (`recent`: the probes `EpochSpeeds`
  still holds), then the others; within each, in the order of
  `sha256("planet/hop-probe/v1" ‖ seed ‖ epoch ‖ key)` with the epoch's secret seed (the
  one this verifier committed for the epoch): deterministic for the verifier, unpredictable
  to the nodes until the seed is revealed, and a new order each epoch.

Each probe is `sessions` sessions of `positions` positions at first; `saturate` doubles the
sessions up to `most_sessions` while the time per position still drops (hop_probe.py). The
verifier's CPU for one node is then at most (sessions + 2·sessions + … + most_sessions) ×
positions positions through the shards up to the probed one and then the probed shard (a
span's shards) for its own outputs; `most_sessions == sessions` is one probe.

The tokens each session steps are drawn from the same seed (`probe_tokens`), fresh for every
node, round and session: a node never sees the same input twice, so it cannot answer from a
cache of an earlier probe.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Any

from node.client.chain_prices import chain_price
from node.verifier.speeds import MIN_TIMED_TOKENS
from protocol.spans import NonContiguousSpanError, ShardSpan, span_of

KEY = re.compile(r"[0-9a-f]{64}")
ENDPOINT = re.compile(r"https?://[^/?#@\s]{1,250}")
DOMAIN = b"planet/hop-probe/v1"
MOST_PER_EPOCH = 64
MOST_SESSIONS = 32
MOST_POSITIONS = 256


@dataclass(frozen=True, slots=True)
class HopSettings:
    """How many nodes a verifier times alone each epoch and the work of each probe."""

    per_epoch: int = 2  # nodes timed alone per epoch (0: none)
    sessions: int = 4  # sessions of the first probe
    most_sessions: int = 16  # `saturate` doubles up to this (== sessions: one probe)
    positions: int = 8  # positions each session steps
    timeout_s: float = 60.0  # one node's probes, opens included: past it, no timing

    def problem(self) -> str | None:
        """Why these settings cannot run (None: they can)."""
        if not 0 <= self.per_epoch <= MOST_PER_EPOCH:
            return f"nodes timed per epoch must be 0 … {MOST_PER_EPOCH}"
        if not 1 <= self.sessions <= self.most_sessions <= MOST_SESSIONS:
            return f"sessions must be 1 … most sessions … {MOST_SESSIONS}"
        if not 1 <= self.positions <= MOST_POSITIONS:
            return f"positions must be 1 … {MOST_POSITIONS}"
        if self.sessions * self.positions < MIN_TIMED_TOKENS:
            return f"sessions × positions must be at least {MIN_TIMED_TOKENS} (a timing counts)"
        if not 0 < self.timeout_s <= 3600:
            return "the probe timeout must be 0 … 3600 seconds"
        return None


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """A node to time: its key, endpoint, shard (a span's first) and chain price (positions per
    credit; 0 free, None none registered); a span's last shard and the price of each of its
    shards after the first (a span hop is paid per shard)."""

    key: str
    endpoint: str
    shard: int
    price: int | None
    last: int | None = None  # None: `shard` alone
    later_prices: tuple[int | None, ...] = ()  # shards shard+1 … last, in order

    @property
    def span(self) -> ShardSpan:
        return ShardSpan(self.shard, self.shard if self.last is None else self.last)

    def prices(self) -> tuple[tuple[int, int | None], ...]:
        """(shard, its chain price) for every shard the probe runs through (a later price not
        given: None, none registered)."""
        later = (*self.later_prices, *(None,) * self.span.size)[: self.span.size - 1]
        return tuple(zip(self.span.shards, (self.price, *later), strict=True))

    @property
    def charging(self) -> bool:
        return any(price for _, price in self.prices())


def candidates(entries: Iterable[Any], shard_count: int) -> list[ProbeTarget]:
    """The routable, well-formed `/nodes` entries of one shard of the model or one contiguous
    span of its shards (others skipped)."""
    out: list[ProbeTarget] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("routable") is not True:
            continue
        key, endpoint, shards = entry.get("key"), entry.get("endpoint"), entry.get("shards")
        if not isinstance(key, str) or not KEY.fullmatch(key):
            continue
        if not isinstance(endpoint, str) or not ENDPOINT.fullmatch(endpoint.rstrip("/")):
            continue
        try:
            span = span_of(shards)
        except NonContiguousSpanError:
            continue
        if span.last >= shard_count:
            continue
        out.append(
            ProbeTarget(
                key,
                endpoint.rstrip("/"),
                span.first,
                chain_price(entry, span.first),
                last=span.last if span.size > 1 else None,
                later_prices=tuple(chain_price(entry, s) for s in span.shards[1:]),
            )
        )
    return out


def draw(seed: bytes, epoch: int, key: str) -> bytes:
    """`key`'s place in `epoch`'s order (module docstring)."""
    return hashlib.sha256(DOMAIN + seed + epoch.to_bytes(8, "big") + bytes.fromhex(key)).digest()


def choose(
    found: Iterable[ProbeTarget],
    *,
    seed: bytes,
    epoch: int,
    count: int,
    recent: Container[str],
    can_pay: bool,
    allowed: Callable[[str], bool] = lambda _: True,
) -> list[ProbeTarget]:
    """At most `count` of `found` to time this epoch (module docstring), each key once."""
    eligible: dict[str, ProbeTarget] = {}
    for target in found:
        if target.key in eligible or (target.charging and not can_pay):
            continue
        if allowed(target.endpoint):
            eligible[target.key] = target
    ordered = sorted(eligible.values(), key=lambda t: (t.key in recent, draw(seed, epoch, t.key)))
    return ordered[: max(0, count)]


def probe_tokens(
    seed: bytes, epoch: int, key: str, round_: int, sessions: int, positions: int, vocab: int
) -> list[list[int]]:
    """Each session's token ids for `key`'s probe round `round_` (fresh per node, round and
    session; ids 0 … vocab−1)."""
    out: list[list[int]] = []
    for session in range(sessions):
        base = draw(seed, epoch, key) + round_.to_bytes(4, "big") + session.to_bytes(4, "big")
        ids: list[int] = []
        block = 0
        while len(ids) < positions:
            digest = hashlib.sha256(base + block.to_bytes(4, "big")).digest()
            ids += [int.from_bytes(digest[i : i + 4], "big") % vocab for i in range(0, 32, 4)]
            block += 1
        out.append(ids[:positions])
    return out
