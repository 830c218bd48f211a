"""The rebalancing loop of a running node's agent and its move sequence (issue 44).

`Rebalancer.step(height)` runs in the agent's loop: every `every_blocks` blocks, and whenever
the pool it reads (every `watch_blocks`) changed, it reads the pool from the committee and asks
`rebalance.decide`; it logs one line per decision (stayed/moving, and why). A move runs as a
background task, so heartbeats go on meanwhile:

1. wait `jitter_s(node key)`, read the pool again and decide again (the nodes that saw the same
   loss do not all go);
1b. when the target's file is not on this machine, fetch it (`NodeHost.fetch`: chunk by chunk
   from the nodes the committee lists serving it, else the model's origin, each chunk checked
   against the manifest, resumable, at the rate the serving nodes allow; node/model/fetch.py),
   the old process serving meanwhile; a fetch that fails leaves the node where it is, with one
   line why, and that shard is not fetched again for `cooldown_s` (the `.part` file stays: the
   next try resumes it);
2. start a second compute node process for the new shard on a new port, the old one still
   serving its shard (make before break), and wait for its /health (`load_timeout_s`);
3. read the pool and decide once more: a shard another node filled while this one loaded is
   not joined (the new process is stopped, the node stays);
4. hand in the node's credits of the old shard (they are redeemable only while it is
   registered there), then send `move_shards` (new shard, new endpoint): from its block the
   committee lists the node on the new shard only, so no new session reaches the old process;
5. adopt the new process (joined.json names it), then drain the old one: it answers for
   `linger_s` at least (a client that read the pool just before the move may still open a
   session there), and its live sessions may finish for `drain_s`; what is still open then is
   cut, and its clients go on at
   another replica through their failover (a session is never left to hang);
6. stop the old process.

A failure at 1b-4 stops the new process (if started) and leaves the node where it was. At
most one move per `cooldown_s` (`rebalance.RebalancePolicy`).

The swaps it leads are remembered (swap_memory.py, `<home>/run/swap_memory.json`, kept across
restarts with the time of its last move): before each decision the memory sees the pool (a
swap followed, or not followed within its deadline: its partner backed off for
`swap_backoff_s` and the move back weighed), each change one line, e.g. `rebalance: swap with
node 676b8bb84ce7 not followed in 720 s; … moving back to shard 1 when the cooldown allows and
that restores the pool`. It also notes when it saw each node of the pool change shards (the
partner's remaining cooldown, for a swap's deadline). The processes are behind
`NodeHost` (node_host.py spawns real ones; the tests use fakes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from node.agent import swap_memory
from node.agent.placement import MalformedPoolAnswer, PoolNode, PoolQuery, read_floor, read_pool
from node.agent.rebalance import (
    Decision,
    RebalancePolicy,
    decide,
    jitter_s,
    pool_fingerprint,
)
from node.retry import sleep_or_stop
from protocol.committee.registry import MoveShards
from protocol.errors import RemoteError, UnavailableError

log = logging.getLogger("node.agent.rebalance")
OK = 0


@dataclass(frozen=True, slots=True)
class Replacement:
    """A compute node process started for another shard, not yet the registered one."""

    shard: int
    endpoint: str
    handle: Any


class FetchFailed(Exception):
    """A target shard's file could not be fetched: `why` says so in one line."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class NodeHost(Protocol):
    """The compute node processes of this operator home."""

    def available(self, shard: int) -> bool: ...  # `shard`'s file is on this machine
    def has_origin(self) -> bool: ...  # the model's origin is known (a fetch may fall back)
    async def fetch(self, shard: int) -> str: ...  # → what was fetched; raises FetchFailed
    async def start(self, shard: int) -> Replacement: ...
    async def healthy(self, replacement: Replacement) -> bool: ...
    async def live_sessions(self, old: Any) -> int | None: ...  # held by the old process
    async def discard(self, replacement: Replacement) -> None: ...
    async def adopt(self, replacement: Replacement) -> Any: ...  # → the old process's handle
    async def stop(self, old: Any) -> None: ...


class Chain(Protocol):
    """What the move sequence asks of the agent: send a tx and wait for its code."""

    async def send(self, body: Any) -> tuple[int, str]: ...


class Rebalancer:
    def __init__(
        self,
        *,
        key: str,
        model: str,
        shard_count: int,
        link: PoolQuery,
        host: NodeHost,
        chain: Chain,
        policy: RebalancePolicy,
        before_move: Callable[[], Awaitable[None]] | None = None,
        on_moved: Callable[[int, str], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        watch_blocks: int = 2,
        memory_path: Path | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.key = key
        self.model = model
        self.shard_count = shard_count
        self.link = link
        self.host = host
        self.chain = chain
        self.policy = policy
        self.before_move = before_move
        self.on_moved = on_moved
        self.clock = clock
        self.watch_blocks = watch_blocks
        self.floor: int | None = None
        self.last_move_s: float | None = None
        self.fetch_failed: dict[int, float] = {}  # shard → when its fetch failed (clock())
        self.last_decision_height: int | None = None
        self.last_watch_height: int | None = None
        self.fingerprint: Any = None
        self.task: asyncio.Task[bool] | None = None
        self.decisions: list[Decision] = []  # every decision logged (tests and status read it)
        self.moves = 0
        self.poll_s = 0.5  # how often a loading or draining node is looked at
        # the swaps it led (swap_memory.py), in `memory_path` (None: in this process only);
        # its times are `wall`'s (the file outlives the process), the cooldown `clock`'s
        self.wall = wall
        self.memory_path = memory_path
        self.memory = swap_memory.SwapMemory()
        if memory_path is not None:
            self.memory = swap_memory.load(memory_path)
        if self.memory.last_move is not None:  # the cooldown goes on across a restart
            ago = self.wall() - self.memory.last_move
            if 0 <= ago < policy.cooldown_s:
                self.last_move_s = self.clock() - ago
        self.shards_seen: dict[str, tuple[int, ...]] = {}
        self.moved_seen: dict[str, float] = {}  # node key → when it was seen changing shards

    async def step(self, height: int, stop: asyncio.Event) -> Decision | None:
        """One look at the pool when due; starts a move in the background when it gains.
        Returns the decision taken now, if any. A committee that does not answer, or answers
        oddly, is a decision not taken this time (never an error of the agent)."""
        if self.task is not None:
            if not self.task.done():
                return None
            self.task = None
        due = self.last_decision_height is None or (
            height - self.last_decision_height >= self.policy.every_blocks
        )
        watch = self.last_watch_height is None or (
            height - self.last_watch_height >= self.watch_blocks
        )
        if not (due or watch):
            return None
        self.last_watch_height = height
        try:
            nodes = await read_pool(self.link, self.model)
            if self.floor is None:
                self.floor = await read_floor(self.link)
        except (UnavailableError, RemoteError, MalformedPoolAnswer) as error:
            log.warning("rebalance: could not read the pool: %s", error.message)
            return None
        self._observe(nodes)
        fingerprint = pool_fingerprint(nodes)
        changed = self.fingerprint is not None and fingerprint != self.fingerprint
        self.fingerprint = fingerprint
        pending = self.memory.pending
        overdue = pending is not None and self.wall() >= pending.deadline
        if not (due or changed or overdue):
            return None
        self.last_decision_height = height
        decision = self._decide(nodes)
        why = "pool changed" if changed else "a swap's deadline" if overdue else "periodic"
        self._note(decision, why)
        self._weighed_back(decision)
        if decision.move:
            self.task = asyncio.create_task(self.move(decision, stop))
        return decision

    def _decide(self, nodes: Sequence[PoolNode]) -> Decision:
        now = self.wall()
        memory, lines = swap_memory.settle(
            self.memory, nodes, self.key, self.shard_count, now, self.policy
        )
        for line in lines:
            log.info("%s", line)
        self._remember(memory)
        return decide(
            self.key,
            nodes,
            self.shard_count,
            self.floor or 1,
            now_s=self.clock(),
            last_move_s=self.last_move_s,
            policy=self.policy,
            available=self.host.available,
            origin=self.host.has_origin(),
            fetch_failed=self._recent_fetch_failures(),
            back=memory.move_back(now),
            avoid=memory.backed_off(now),
        )

    def _weighed_back(self, decision: Decision) -> None:
        """A move back weighed outside the cooldown and no move taken: given up (the pool it
        would have restored changed)."""
        back = self.memory.back
        cooling = self.last_move_s is not None and (
            self.clock() - self.last_move_s < self.policy.cooldown_s
        )
        if back is None or cooling or decision.move:
            return  # a move clears it once it commits (swap_memory.moved)
        log.info(
            "rebalance: swap with node %s not followed; no move back to shard %d: it would not "
            "restore the pool now",
            back.partner[:12],
            back.source,
        )
        self._remember(swap_memory.given_up(self.memory))

    def _remember(self, memory: swap_memory.SwapMemory) -> None:
        if memory == self.memory:
            return
        self.memory = memory
        if self.memory_path is None:
            return
        try:
            swap_memory.save(self.memory_path, memory)
        except OSError as error:
            log.warning("rebalance: could not write %s: %s", self.memory_path, error)

    def _observe(self, nodes: Sequence[PoolNode]) -> None:
        """Note when each node of the pool was seen on other shards than before."""
        now = self.wall()
        seen = {n.key: n.shards for n in nodes}
        for key, shards in seen.items():
            if key in self.shards_seen and self.shards_seen[key] != shards:
                self.moved_seen[key] = now
        self.moved_seen = {k: t for k, t in self.moved_seen.items() if k in seen}
        self.shards_seen = seen

    def _recent_fetch_failures(self) -> set[int]:
        now = self.clock()
        return {s for s, at in self.fetch_failed.items() if now - at < self.policy.cooldown_s}

    def _note(self, decision: Decision, why: str) -> None:
        self.decisions.append(decision)
        log.info("%s (%s)", decision.line(), why)

    async def _again(self, what: str) -> Decision:
        try:
            nodes = await read_pool(self.link, self.model)
        except (UnavailableError, RemoteError, MalformedPoolAnswer) as error:
            return Decision(False, -1, -1, f"could not read the pool {what}: {error.message}")
        self._observe(nodes)
        self.fingerprint = pool_fingerprint(nodes)
        return self._decide(nodes)

    # -- the move sequence ---------------------------------------------------------------------

    async def move(self, decision: Decision, stop: asyncio.Event) -> bool:
        """Move to `decision.target` as the module docstring says; True when the node moved."""
        delay = jitter_s(self.key, self.policy.max_jitter_s)
        if await sleep_or_stop(stop, delay):
            return False
        again = await self._again(f"after a {delay:.1f} s delay")
        if not again.move or again.target != decision.target:
            self._note(again, f"re-read after a {delay:.1f} s delay")
            return False
        target = decision.target
        if again.fetch and not await self._fetch(decision):
            return False
        replacement = await self.host.start(target)
        try:
            moved = await self._switch(decision, replacement, stop)
        except BaseException:  # cancelled (the agent stops) or a bug: never leave it running
            await self.host.discard(replacement)
            raise
        if not moved:
            await self.host.discard(replacement)
            return False
        self.last_move_s = self.clock()
        self.moves += 1
        partner = decision.swap.partner if decision.swap is not None else ""
        self._remember(
            swap_memory.moved(
                self.memory, decision, self.wall(), self.policy, self.moved_seen.get(partner)
            )
        )
        log.info(
            "rebalance: moved shard %d -> %d, registered at %s",
            decision.current,
            target,
            replacement.endpoint,
        )
        if self.on_moved is not None:
            await self.on_moved(target, replacement.endpoint)
        old = await self.host.adopt(replacement)
        try:
            await self._drain(decision.current, old)
        finally:  # also when the agent stops meanwhile: the old process never outlives it
            await self.host.stop(old)
        return True

    async def _fetch(self, decision: Decision) -> bool:
        """Step 1b: the target's file onto this machine, the old process serving meanwhile."""
        target, stay = decision.target, decision.current
        log.info(
            "rebalance: fetching shard %d's file before the move; shard %d still served",
            target,
            stay,
        )
        try:
            fetched = await self.host.fetch(target)
        except FetchFailed as failure:
            self.fetch_failed[target] = self.clock()
            why = f"could not fetch shard {target}'s file: {failure.why}"
            self._note(Decision(False, stay, stay, why), "move abandoned")
            return False
        log.info("rebalance: fetched shard %d's file: %s", target, fetched)
        return True

    async def close(self) -> None:
        """Stop a move in progress (the agent stops): a new process not adopted is stopped."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _switch(
        self, decision: Decision, replacement: Replacement, stop: asyncio.Event
    ) -> bool:
        """Steps 2-4: the new process loaded, the gain still there, `move_shards` committed."""
        target = decision.target
        log.info(
            "rebalance: loading shard %d at %s; shard %d still served meanwhile",
            target,
            replacement.endpoint,
            decision.current,
        )
        stay = decision.current
        if not await self._loaded(replacement, stop):
            why = f"shard {target} did not load within {self.policy.load_timeout_s:.0f} s"
            self._note(Decision(False, stay, stay, why), "move abandoned")
            return False
        again = await self._again("after loading")
        if not again.move or again.target != target:
            self._note(again, f"re-read after loading shard {target}; move abandoned")
            return False
        if self.before_move is not None:
            await self.before_move()
        code, text = await self.chain.send(MoveShards((target,), replacement.endpoint))
        if code != OK:
            why = f"the committee refused move_shards: code {code} {text}"
            self._note(Decision(False, stay, stay, why), "move abandoned")
            return False
        return True

    async def _loaded(self, replacement: Replacement, stop: asyncio.Event) -> bool:
        deadline = self.clock() + self.policy.load_timeout_s
        while self.clock() < deadline:
            if await self.host.healthy(replacement):
                return True
            if await sleep_or_stop(stop, self.poll_s):
                return False
        return False

    async def _drain(self, shard: int, old: Any) -> None:
        """Let the old process's live sessions finish, within `drain_s`."""
        started = self.clock()
        sessions = await self.host.live_sessions(old)
        first = sessions
        linger = min(self.policy.linger_s, self.policy.drain_s)
        while (sessions or self.clock() - started < linger) and (
            self.clock() - started < self.policy.drain_s
        ):
            await asyncio.sleep(self.poll_s)
            sessions = await self.host.live_sessions(old)
        waited = self.clock() - started
        if not sessions:
            log.info(
                "rebalance: old node of shard %d drained (%s live sessions finished in %.1f s)",
                shard,
                first or 0,
                waited,
            )
        else:
            log.info(
                "rebalance: old node of shard %d still holds %d sessions after %.0f s; stopping "
                "it (their clients fail over to another replica)",
                shard,
                sessions,
                waited,
            )
