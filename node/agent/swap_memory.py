"""What a rebalancing node remembers of the swaps it led (issue 44), and its file.

A swap's leader moves S -> T first and its partner B, not told, follows T -> S by its own
rule (rebalance.py `_swaps`). A partner that never moves (an older release pinned with
`--shard K`, which does not say so at registration) or that is held by its own cooldown leaves
the pool in the in-between state; without a memory the leader, its cooldown over, would lead
the same swap again once per cooldown, for ever. So the agent remembers:

    last_move  when this node last moved (the cooldown survives an agent restart)
    pending    the swap it led and waits for: partner, S, T, when its move committed, the
               deadline, and the goal (the pool's weakest shard the pair is to reach, tokens/s)
    back       a swap not followed: the node moves back T -> S when its cooldown allows and
               the move back restores the pool (rebalance.py `BACK`: a normal move, the rules
               still apply; a decision taken outside the cooldown that does not move back
               drops it)
    backoff    partners not chosen again for a swap until a time (`swap_backoff_s` after the
               swap they did not follow)

`settle` turns the pool the committee lists into the memory's next state, each transition one
line: a swap is followed when its partner serves S, or when the pool's weakest shard reached
the goal (another node's rule lifted it as much); it is not followed when its deadline passed
or its partner left the pool: the partner is backed off and the move back is weighed. The
deadline, fixed when the move commits: the partner's remaining cooldown as this node saw it
move (`cooldown_s` after the move it saw; 0 when it saw none) plus `follow_margin_s`. A
partner that follows after its deadline, before the leader moved back, lifts its back-off.

Times are the agent's wall clock in seconds (time.time(): the file outlives the process); the
functions are pure, given the pool and the time, so the tests are exact.

The file, `<home>/run/swap_memory.json`, is written atomically (a temporary file, fsync,
rename) and parsed strictly (exact keys, 64-hex keys, shard indexes 0-65535, finite times, at
most `MAX_BACKOFF` partners, `MAX_FILE_BYTES`); a file that is not so is logged and ignored
(the agent starts with no memory), never fatal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from node.agent.placement import PoolNode, pool_supply
from node.agent.rebalance import Back, Decision, RebalancePolicy

log = logging.getLogger("node.agent.rebalance")

FILE = "swap_memory.json"
VERSION = 1
MAX_BACKOFF = 256  # partners backed off at once (the oldest go first beyond it)
MAX_FILE_BYTES = 64 * 1024
MAX_TIME = 1e11  # seconds since the epoch: year 5138
MAX_SHARD = 65535
_KEY = re.compile(r"[0-9a-f]{64}\Z")


class CorruptSwapMemory(Exception):
    """The memory file is not one this module wrote: `why` names the field."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class LedSwap:
    """A swap this node led: it moved `source` -> `target` at `at`; `partner` was to follow
    by `deadline`, lifting the pool's weakest shard to `goal` tokens/s."""

    partner: str
    source: int
    target: int
    at: float
    deadline: float
    goal: int


@dataclass(frozen=True, slots=True)
class SwapMemory:
    last_move: float | None = None
    pending: LedSwap | None = None
    back: LedSwap | None = None
    backoff: tuple[tuple[str, float], ...] = ()  # (partner, until), sorted by partner

    def backed_off(self, now: float) -> dict[str, str]:
        """Partners not chosen for a swap now → why, in words (rebalance.py `avoid`)."""
        return {
            partner: f"did not follow this node's swap; no swap with it for another "
            f"{until - now:.0f} s"
            for partner, until in self.backoff
            if until > now
        }

    def move_back(self, now: float) -> Back | None:
        """The swap not followed that the node moves back from (rebalance.py `back`)."""
        if self.back is None:
            return None
        return Back(self.back.source, self.back.partner, max(0.0, now - self.back.at))


def settle(
    memory: SwapMemory,
    nodes: Sequence[PoolNode],
    key: str,
    shard_count: int,
    now: float,
    policy: RebalancePolicy,
) -> tuple[SwapMemory, list[str]]:
    """The memory once the pool `nodes` is seen at `now`, and one line per change."""
    lines: list[str] = []
    backoff = tuple((p, until) for p, until in memory.backoff if until > now)
    memory = replace(memory, backoff=backoff)
    by_key = {n.key: n for n in nodes}
    own = by_key.get(key)
    weakest = _weakest(nodes, shard_count)
    pending = memory.pending
    if pending is not None:
        partner = by_key.get(pending.partner)
        name = pending.partner[:12]
        if own is not None and own.shards != (pending.target,):
            memory = replace(memory, pending=None)  # it moved on: nothing to wait for
        elif _followed(pending, partner, weakest):
            memory = replace(memory, pending=None)
            lines.append(f"rebalance: swap with node {name} followed: {_how(pending, partner)}")
        elif partner is None or partner.status == "LEFT" or now >= pending.deadline:
            until = now + policy.swap_backoff_s
            backoff = _add(backoff, pending.partner, until)
            memory = replace(memory, pending=None, back=pending, backoff=backoff)
            gone = "it left the pool" if partner is None or partner.status == "LEFT" else ""
            lines.append(
                f"rebalance: swap with node {name} not followed in {now - pending.at:.0f} s"
                f"{'; ' + gone if gone else ''}; no swap with it for {policy.swap_backoff_s:.0f}"
                f" s; moving back to shard {pending.source} when the cooldown allows and that "
                "restores the pool"
            )
    back = memory.back
    if back is not None:
        partner = by_key.get(back.partner)
        if own is not None and own.shards != (back.target,):
            memory = replace(memory, back=None)  # it moved (back or elsewhere)
        elif _followed(back, partner, weakest):
            kept = tuple((p, u) for p, u in memory.backoff if p != back.partner)
            memory = replace(memory, back=None, backoff=kept)
            lines.append(
                f"rebalance: swap with node {back.partner[:12]} followed after all: "
                f"{_how(back, partner)}; no move back"
            )
    return memory, lines


def moved(
    memory: SwapMemory,
    decision: Decision,
    now: float,
    policy: RebalancePolicy,
    partner_moved: float | None,
) -> SwapMemory:
    """The memory once the move `decision` committed at `now` (`partner_moved`: when this node
    saw the swap's partner move last, None: it did not)."""
    pending = None
    if decision.swap is not None:
        waits = 0.0
        if partner_moved is not None:
            waits = max(0.0, policy.cooldown_s - (now - partner_moved))
        pending = LedSwap(
            partner=decision.swap.partner,
            source=decision.current,
            target=decision.target,
            at=now,
            deadline=now + waits + policy.follow_margin_s,
            goal=decision.swap.goal,
        )
    return replace(memory, last_move=now, pending=pending, back=None)


def given_up(memory: SwapMemory) -> SwapMemory:
    """A decision weighed the move back (outside the cooldown) and did not take it."""
    return replace(memory, back=None)


def _followed(swap: LedSwap, partner: PoolNode | None, weakest: int | None) -> bool:
    if partner is not None and partner.shards == (swap.source,) and partner.status != "LEFT":
        return True
    return weakest is not None and swap.goal > 0 and weakest >= swap.goal


def _how(swap: LedSwap, partner: PoolNode | None) -> str:
    if partner is not None and partner.shards == (swap.source,):
        return f"it serves shard {swap.source} now"
    return f"the pool's weakest shard reached {swap.goal} tokens/s"


def _weakest(nodes: Sequence[PoolNode], shard_count: int) -> int | None:
    """The pool's weakest shard in measured tokens/s, None while not every node is measured."""
    supply, measured = pool_supply(nodes, shard_count)
    if not measured or not supply:
        return None
    return min(s.throughput for s in supply)


def _add(
    backoff: tuple[tuple[str, float], ...], partner: str, until: float
) -> tuple[tuple[str, float], ...]:
    entries = {p: u for p, u in backoff}
    entries[partner] = until
    kept = sorted(entries.items(), key=lambda e: (-e[1], e[0]))[:MAX_BACKOFF]
    return tuple(sorted(kept))


# -- the file ------------------------------------------------------------------------------------


def to_json(memory: SwapMemory) -> dict[str, Any]:
    return {
        "version": VERSION,
        "last_move": memory.last_move,
        "pending": _swap_json(memory.pending),
        "back": _swap_json(memory.back),
        "backoff": [{"partner": p, "until": u} for p, u in memory.backoff],
    }


def _swap_json(swap: LedSwap | None) -> dict[str, Any] | None:
    if swap is None:
        return None
    return {
        "partner": swap.partner,
        "source": swap.source,
        "target": swap.target,
        "at": swap.at,
        "deadline": swap.deadline,
        "goal": swap.goal,
    }


def parse(doc: Any) -> SwapMemory:
    """The file's JSON → a `SwapMemory`, or `CorruptSwapMemory` naming the field."""
    top = _exact(doc, "the file", {"version", "last_move", "pending", "back", "backoff"})
    if type(top["version"]) is not int or top["version"] != VERSION:
        raise CorruptSwapMemory(f"version: expected {VERSION}")
    last = top["last_move"]
    entries = top["backoff"]
    if not isinstance(entries, list) or len(entries) > MAX_BACKOFF:
        raise CorruptSwapMemory(f"backoff: expected a list of at most {MAX_BACKOFF}")
    backoff: dict[str, float] = {}
    for i, entry in enumerate(entries):
        e = _exact(entry, f"backoff[{i}]", {"partner", "until"})
        partner = _key(e["partner"], f"backoff[{i}].partner")
        if partner in backoff:
            raise CorruptSwapMemory(f"backoff[{i}].partner: listed twice")
        backoff[partner] = _time(e["until"], f"backoff[{i}].until")
    return SwapMemory(
        last_move=None if last is None else _time(last, "last_move"),
        pending=_swap(top["pending"], "pending"),
        back=_swap(top["back"], "back"),
        backoff=tuple(sorted(backoff.items())),
    )


def _swap(value: Any, where: str) -> LedSwap | None:
    if value is None:
        return None
    v = _exact(value, where, {"partner", "source", "target", "at", "deadline", "goal"})
    source, target = _shard(v["source"], f"{where}.source"), _shard(v["target"], f"{where}.target")
    if source == target:
        raise CorruptSwapMemory(f"{where}: source and target are one shard")
    goal = v["goal"]
    if type(goal) is not int or not 0 <= goal <= 10**12:
        raise CorruptSwapMemory(f"{where}.goal: expected an integer 0-10^12 (tokens/s)")
    return LedSwap(
        partner=_key(v["partner"], f"{where}.partner"),
        source=source,
        target=target,
        at=_time(v["at"], f"{where}.at"),
        deadline=_time(v["deadline"], f"{where}.deadline"),
        goal=goal,
    )


def _exact(value: Any, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != keys:
        raise CorruptSwapMemory(f"{where}: expected an object with {', '.join(sorted(keys))}")
    return value


def _key(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _KEY.match(value):
        raise CorruptSwapMemory(f"{where}: expected 64 lowercase hex digits")
    return value


def _shard(value: Any, where: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SHARD:
        raise CorruptSwapMemory(f"{where}: expected a shard index 0-{MAX_SHARD}")
    return value


def _time(value: Any, where: str) -> float:
    if type(value) is int:
        value = float(value) if 0 <= value <= MAX_TIME else math.nan
    if type(value) is not float or not math.isfinite(value) or not 0 <= value <= MAX_TIME:
        raise CorruptSwapMemory(f"{where}: expected seconds 0-{MAX_TIME:.0e}")
    return float(value)


def load(path: Path) -> SwapMemory:
    """The memory in `path`; none when the file is missing; none, with a warning, when it is
    unreadable, too large or not one `save` wrote."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return SwapMemory()
    except OSError as error:
        log.warning("rebalance: cannot read %s (%s); starting with no swap memory", path, error)
        return SwapMemory()
    try:
        if len(raw) > MAX_FILE_BYTES:
            raise CorruptSwapMemory(f"larger than {MAX_FILE_BYTES} bytes")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise CorruptSwapMemory("not UTF-8 JSON") from None
        return parse(doc)
    except CorruptSwapMemory as error:
        log.warning(
            "rebalance: ignoring the swap memory %s: %s; starting with none", path, error.why
        )
        return SwapMemory()


def save(path: Path, memory: SwapMemory) -> None:
    """Write `memory` to `path` atomically (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    data = (json.dumps(to_json(memory), sort_keys=True) + "\n").encode()
    with temporary.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
