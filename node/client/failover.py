"""Failover mid-answer: a generation that outlives the nodes of its circuit.

What the client keeps is the **token history** (the prompt and every token it fed since), not
each hop's inputs. In a circuit the hops forward to each other (client → A → B → C → client),
so the client never sees a hop's input activations; keeping them would mean asking every hop
to copy its output back on every step. The history costs nothing while all goes well, and
replaying it recomputes every hop's inputs: the replacement circuit's first hop gets the
embeddings of the history, each hop feeds the next, exactly as the first time.

When a session fails — a link closed (`kill -9`), a hop refused (`busy`, `session_expired`;
`downstream_unavailable`, `next_hop_not_allowed` and `node_key_mismatch` name the hop after it:
node/client/circuit.py `NEXT_HOP_FAULTS`), the last hop answered badly, or no answer
came within `stall_s` (a node frozen by SIGSTOP: the hops that do not answer GET /health
within `probe_timeout_s` are the suspects) — the loop

1. asks its `CircuitSource` for a circuit with the suspect hops replaced (the gateway: the
   router's next-cheapest node for that shard, the failed node cooling down; `planet ask`: a
   spare of the nodes file), after a backoff of `backoff_s · 2^(n-1)` (at most
   `backoff_max_s`), at most `attempts` times per generation;
2. opens a new session on it (a new secret, so every hop gets a fresh capability) and replays
   the history as a prefill **at the same positions 0 … N-1** (the prompt in its original
   chunks, so its KV is computed exactly as before, then the fed tokens);
3. continues at position N: the replay's last output is the hidden state the next token is
   chosen from, so no token is chosen twice and a sampler's random stream goes on where it
   was. (Petals #587 is the warning: there the replacement session kept position 0 after the
   replay and every later step failed; here every frame names its start and a node refuses a
   gap by name.)

Greedy output equals a run without failure as long as the replay's floating-point results
pick the same argmax: the prompt's frames are the same as the first time; the fed tokens are
computed as one chunk instead of one step each, which changes results only in the last bits
(the same caveat as batched decode steps, docs/compute.md).

What does not fail over: the wallet's or the user's limit (`OutOfCreditsError`,
`PriceTooHighError`) and a `payment_required` for positions the client sent unpaid to a node it
knew charges (`UnpaidError`: it pays no node, and every node it could be sent to instead charges
too) end the question by name at once, no node blamed (node/client/paying.py). A
`payment_required` from a node the client did pay is that node's failure (it did not count what
it was paid) and is replaced like any other.

**A hop's word about its next hop** (issue 44). A hop that names its next hop as the fault
followed its own rules (its committee view did not list a node that moved a moment ago, or it
could not reach it), so the named hop is replaced, not the refuser; but the refuser could be
lying about an honest node. So the named hop is only `accused` (`CircuitSource.lease`): the
gateway cools it for a few seconds (node/gateway/router.py `ACCUSED_COOLDOWN_S`), `planet ask`
does not avoid it; and a node that names a next hop a second time in one answer is replaced as
well, as failed (a hop refusing every next hop would otherwise fail answers without ever being
avoided).

Every surviving hop is in the new session too (its old session was fed by, or fed into, the
failed hop); they recompute the history, and are credited for it (`Failover.served`).

**Moving off a slow hop on trial.** Load-aware choice tries a node it has not seen lately
(node/client/costs.py); if that node is much slower than its replicas, the question it was
tried on would run every step at its pace. So after a circuit's first `MIN_OBSERVED_PASSES`
decode passes the loop tells the source what the median one took (one hiccup in three
passes does not count) and asks which hops on trial now cost more than twice the cheapest
replica (`CircuitSource.outpriced`); those are replaced the same
way — a new circuit, the history replayed, the same positions — without a backoff, without
counting as a failure or being avoided, at most `attempts` times per generation, recorded as a
failover with the code `outpriced` (so each circuit is paid what it served). A trial costs
its user a few slow steps and one replay instead of a whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import numpy as np

from node.client.capabilities import new_session_id
from node.client.paying import FINAL_PAYMENT_ERRORS
from node.client.ring import ring_tokens
from node.client.sampling import SamplingConfig, sample
from node.client.speculation import Drafter, SpeculationConfig, SpeculationStats, verify
from node.client.types import Failover, Head, Hop, Timings
from node.links import link_ssl
from protocol.errors import BusyError, PlanetError, ProtocolError, RemoteError, UnavailableError

log = logging.getLogger(__name__)

# what a failed hop (not the caller) can make a session raise
FAILURES = (UnavailableError, BusyError, RemoteError, ProtocolError)
MIN_OBSERVED_PASSES = 3  # a circuit's passes tell the cost book something from this many on


class BadRingEndError(ProtocolError):
    """A ring session's tokens stopped before a stop id or the token limit (its first hop
    closed it without a refusal)."""

    code = "bad_answer"


class Outpriced(Exception):
    """Hops picked on trial turned out slow (`CircuitSource.outpriced`): move off them."""

    def __init__(self, hops: set[int]) -> None:
        super().__init__(sorted(hops))
        self.hops = hops


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    attempts: int = 4  # replacement circuits per generation (0: the first failure is final)
    backoff_s: float = 0.1  # wait before the n-th replacement: backoff_s · 2^(n-1) ...
    backoff_max_s: float = 2.0  # ... at most this (seconds)
    # an answer slower than this means a stalled circuit (seconds; None: the client's own
    # request timeout)
    stall_s: float | None = 10.0
    probe_timeout_s: float = 2.0  # a hop that does not answer /health within this is a suspect

    def delay(self, failures: int) -> float:
        return min(self.backoff_s * 2 ** max(failures - 1, 0), self.backoff_max_s)


NO_FAILOVER = FailoverPolicy(attempts=0, stall_s=None)


class Circuit(Protocol):
    """What the loop needs of a circuit client (node.client.circuit.CircuitClient)."""

    hops: tuple[Hop, ...]
    bytes_sent: int
    bytes_received: int

    def new_sid(self) -> int: ...

    async def open(
        self,
        secret: str,
        sid: int | None = None,
        *,
        wait: bool = True,
        prompt: Sequence[int] | None = None,
    ) -> int: ...

    async def close(self, sid: int) -> None: ...

    async def prefill(
        self,
        sid: int,
        ids_hidden: np.ndarray,
        start: int = 0,
        *,
        last_only: bool = True,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        split_at: int | None = None,
        timeout_s: float | None = None,
    ) -> np.ndarray: ...

    async def send(
        self,
        sid: int,
        start: int,
        hidden: np.ndarray,
        last_only: bool = True,
        *,
        rewind: bool = False,
    ) -> None: ...

    async def receive(
        self, sid: int, start: int, count: int, timeout_s: float | None = None
    ) -> np.ndarray: ...

    async def logits(self, head: Head, hidden_last: np.ndarray) -> np.ndarray: ...

    def suspects(self, sid: int) -> set[int]: ...

    def named_by(self, sid: int) -> int | None: ...


class CircuitSource(Protocol):
    """Where a generation gets its circuit, and replacements for the hops that failed."""

    def lease(
        self,
        replace: frozenset[int],
        *,
        failed: bool = True,
        accused: frozenset[int] = frozenset(),
    ) -> AbstractAsyncContextManager[Circuit]:
        """A live circuit, held while the block runs: the first call's (`replace` empty), then
        the last one with the hops at the indices in `replace` replaced (empty after a failure
        that named nobody: any circuit); `failed=False`: they did not fail, they were
        `outpriced` (not avoided, not counted against them); `accused`: those of `replace`
        only another hop named as the fault (`Circuit.named_by`): avoided briefly, not for
        the time a failure the client saw costs. A failure to build or dial it
        raises a FAILURES error (counted as one attempt) or, when nothing can serve a shard, a
        final error."""
        ...

    def outpriced(self, hops: Sequence[Hop]) -> set[int]:
        """Indices of `hops` (the last leased circuit's) picked on trial that the client's own
        passes now price above `MOVE_FACTOR` × their shard's cheapest (node/client/costs.py
        `outpriced`): the generation moves off them instead of finishing on them."""
        ...

    async def probe(self) -> set[int]:
        """Indices of the last leased circuit's hops that do not answer GET /health in time."""
        ...

    def observe(self, urls: Sequence[str], pass_s: float) -> None:
        """A leased circuit through `urls` took `pass_s` seconds per decode pass (its mean,
        measured by this client): what load-aware choice checks the nodes' claims against
        (node/client/costs.py `observe_circuit`)."""
        ...


class FixedCircuit:
    """One circuit, never replaced (`CircuitClient.generate`)."""

    def __init__(self, client: Circuit) -> None:
        self.client = client

    def lease(
        self,
        replace: frozenset[int],
        *,
        failed: bool = True,
        accused: frozenset[int] = frozenset(),
    ) -> AbstractAsyncContextManager[Circuit]:
        return contextlib.nullcontext(self.client)

    async def probe(self) -> set[int]:
        return set()

    def outpriced(self, hops: Sequence[Hop]) -> set[int]:
        return set()  # one circuit: nowhere to move

    def observe(self, urls: Sequence[str], pass_s: float) -> None:
        pass  # one circuit: nothing to choose between


async def unhealthy_hops(
    http: aiohttp.ClientSession, hops: Sequence[Hop], timeout_s: float
) -> set[int]:
    """Indices of `hops` whose GET /health does not answer 200 within `timeout_s` (a frozen
    node accepts the connection and never answers)."""

    async def healthy(hop: Hop) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                # pinned to the hop's key over https; a plaintext probe carries no data
                pin = link_ssl(hop.url, hop.key, plaintext_ok=True)
                async with http.get(f"{hop.url}/health", allow_redirects=False, ssl=pin) as answer:
                    return answer.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError, PlanetError):
            return False

    answers = await asyncio.gather(*(healthy(hop) for hop in hops))
    return {index for index, ok in enumerate(answers) if not ok}


@dataclass
class _Recovery:
    """A failover in progress: from the failure seen to the next token chosen."""

    code: str
    hops: tuple[int, ...]
    served: int
    seen_s: float
    replayed: int = 0
    replay_ms: float = 0.0

    def done(self) -> Failover:
        return Failover(
            code=self.code,
            hops=self.hops,
            served=self.served,
            replayed=self.replayed,
            replay_ms=round(self.replay_ms, 2),
            recovery_ms=round((time.perf_counter() - self.seen_s) * 1000, 2),
        )


async def generate(
    source: CircuitSource,
    head: Head,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    timings: Timings | None = None,
    stop_on_eos: bool = True,
    prefill_last_only: bool = True,
    on_prefill: Callable[[int, np.ndarray], None] | None = None,
    on_logits: Callable[[np.ndarray], None] | None = None,
    policy: FailoverPolicy | None = None,
    speculation: SpeculationConfig | None = None,
    stats: SpeculationStats | None = None,
    ring: bool = False,
) -> AsyncIterator[int]:
    """Yield new token ids as they are chosen (see CircuitClient.generate for the arguments),
    replacing failed hops as the module docstring says. `timings.failovers` records each
    recovery; the last failure is raised once `policy.attempts` replacements were used.
    `on_prefill` may see a chunk again when the prompt's own prefill was interrupted.
    `speculation`: several tokens per pass (node/client/speculation.py): each decode frame
    carries the last chosen token and the guesses, with the rewind flag; `stats` counts the
    passes. The history holds only chosen tokens, so a replay never replays a guess.
    `ring`: where every hop of the circuit takes it (`CircuitClient.ring_ready`), the first hop
    runs the decode loop (node/client/ring.py); a circuit that fails is replaced as always, the
    history replayed into the replacement's ring (greedy; a sampled answer goes on in the
    client's own loop, whose Generator the ring's draws have kept in step). Not with
    `speculation`."""
    policy = policy or FailoverPolicy()
    sampling = (sampling or SamplingConfig()).validate()
    if speculation is not None:
        speculation = speculation.validate()
        stats = stats if stats is not None else SpeculationStats()
    drafter = Drafter(speculation) if speculation is not None else None
    rng = sampling.rng()
    timings = timings if timings is not None else Timings()
    timings.begin(len(prompt_ids))
    prompt = list(prompt_ids)
    fed: list[int] = []  # tokens yielded and sent on: the circuit must hold their positions
    chosen = 0
    failures = 0
    moves = 0  # circuits left because a hop on trial was outpriced (not failures)
    replace: frozenset[int] = frozenset()
    accused: frozenset[int] = frozenset()
    accusations: dict[str, int] = {}  # node URL → its refusals naming its next hop
    moved = False
    recovering: _Recovery | None = None
    try:
        while True:
            client: Circuit | None = None
            sid = 0
            served = 0  # positions the current session answered
            try:
                async with source.lease(replace, failed=not moved, accused=accused) as client:
                    sid = client.new_sid()
                    sent0, received0 = client.bytes_sent, client.bytes_received
                    passes, passes_s = 0, 0.0  # decode passes on this circuit, and their time
                    first_passes: list[float] = []  # the first ones' times, to judge a trial on
                    checked = False  # its first passes observed and its hops on trial judged
                    try:
                        opened_s = time.perf_counter()
                        if (
                            ring
                            and drafter is None
                            and client.ring_ready()
                            and (sampling.greedy or chosen == 0)
                        ):
                            history = prompt + fed
                            first = chosen == 0
                            served = len(history)
                            tokens = ring_tokens(
                                client,
                                sid,
                                head,
                                history,
                                max_new=max_new_tokens - chosen,
                                stop=head.eos_token_ids if stop_on_eos else frozenset(),
                                sampling=sampling,
                                rng=rng,
                                split_at=len(prompt),
                                prefill_last_only=prefill_last_only if first else True,
                                on_prefill=on_prefill if first else None,
                                timeout_s=policy.stall_s,
                            )
                            async with contextlib.aclosing(tokens):
                                async for token, logits in tokens:
                                    if recovering is not None:
                                        recovering.replayed = len(history)
                                        recovering.replay_ms = (
                                            time.perf_counter() - opened_s
                                        ) * 1000
                                        timings.failovers.append(recovering.done())
                                        recovering = None
                                    if on_logits is not None:
                                        on_logits(logits)
                                    chosen += 1
                                    timings.chose(chosen)
                                    if stop_on_eos and token in head.eos_token_ids:
                                        return
                                    timings.new_tokens += 1
                                    yield token
                                    if chosen == max_new_tokens:
                                        return
                                    fed.append(token)
                                    served = len(prompt) + len(fed)
                            raise BadRingEndError("the ring ended before its last token")
                        await client.open(new_session_id(), sid, wait=False, prompt=prompt)
                        history = prompt + fed
                        first = chosen == 0
                        out = await client.prefill(
                            sid,
                            head.embed_np(history),
                            last_only=prefill_last_only if first else True,
                            on_chunk=on_prefill if first else None,
                            split_at=len(prompt),
                            timeout_s=policy.stall_s,
                        )
                        served = position = len(history)
                        if recovering is not None:
                            recovering.replayed = position
                            recovering.replay_ms = (time.perf_counter() - opened_s) * 1000
                        logits = await client.logits(head, out[0, -1])
                        rows = logits[None, :]  # the logits each token of `pass_tokens` comes from
                        pass_tokens = [sample(logits, sampling, rng)]
                        while True:
                            # a pass rejecting a guess yields fewer tokens than it has rows
                            for row, token in zip(rows, pass_tokens, strict=False):
                                if on_logits is not None:
                                    on_logits(row)
                                chosen += 1
                                timings.chose(chosen)
                                if recovering is not None:
                                    timings.failovers.append(recovering.done())
                                    recovering = None
                                if stop_on_eos and token in head.eos_token_ids:
                                    return
                                timings.new_tokens += 1
                                yield token
                                if chosen == max_new_tokens:
                                    return
                                fed.append(token)
                            if passes == MIN_OBSERVED_PASSES and not checked:
                                # a hop on trial is judged on its first passes, not the whole answer
                                checked = True
                                # the median: one hiccup (a page-in, a GC, the box's other load)
                                # in three passes does not move a question off an equal replica
                                typical = statistics.median(first_passes)
                                source.observe([hop.url for hop in client.hops], typical)
                                passes, passes_s = 0, 0.0
                                slow = set()
                                if moves < policy.attempts:
                                    slow = source.outpriced(client.hops)
                                if slow:
                                    raise Outpriced(slow)
                            # the circuit holds `position` positions; the last chosen token is next
                            guesses: list[int] = []
                            if drafter is not None:
                                left = max_new_tokens - chosen - 1  # wanted after this pass's first
                                guesses = drafter.draft(prompt + fed, left)
                            feed = [fed[-1], *guesses]
                            sent_s = time.perf_counter()
                            await client.send(
                                sid,
                                position,
                                head.embed_np(feed),
                                last_only=not guesses,
                                rewind=speculation is not None,
                            )
                            out = await client.receive(sid, position, len(feed), policy.stall_s)
                            took_s = time.perf_counter() - sent_s
                            passes, passes_s = passes + 1, passes_s + took_s
                            if not checked:
                                first_passes.append(took_s)
                            if guesses:
                                rows = head.logits_batch_np(out[0])
                                pass_tokens = verify(rows, guesses, sampling, rng)
                            else:
                                rows = (await client.logits(head, out[0, -1]))[None, :]
                                pass_tokens = [sample(rows[0], sampling, rng)]
                            if drafter is not None:
                                drafter.observe(len(guesses), len(pass_tokens) - 1, took_s)
                            if stats is not None:
                                stats.passes += 1
                                stats.proposed += len(guesses)
                                stats.accepted += len(pass_tokens) - 1
                            position += len(pass_tokens)  # the fed token and the kept guesses
                            served = position
                    finally:
                        timings.wire_bytes_sent += client.bytes_sent - sent0
                        timings.wire_bytes_received += client.bytes_received - received0
                        if passes >= MIN_OBSERVED_PASSES:
                            source.observe([hop.url for hop in client.hops], passes_s / passes)
                        await client.close(sid)
            except FINAL_PAYMENT_ERRORS:
                # the wallet's or the user's limit, or nodes that charge a client paying none
                # (`UnpaidError`): another try would pay nothing better; no node is blamed
                raise
            except Outpriced as slow:
                moves += 1
                if recovering is not None:
                    timings.failovers.append(recovering.done())
                # recorded like a failover (what each circuit served is paid from these records)
                recovering = _Recovery(
                    code="outpriced",
                    hops=tuple(sorted(slow.hops)),
                    served=served,
                    seen_s=time.perf_counter(),
                )
                log.info(
                    "hops on trial slower than their replicas; moving off them "
                    "hops=%s positions=%d",
                    list(recovering.hops),
                    len(prompt) + len(fed),
                )
                replace, moved, accused = frozenset(slow.hops), True, frozenset()
                continue
            except FAILURES as error:
                seen_s = time.perf_counter()
                failures += 1
                suspects = client.suspects(sid) if client is not None else set()
                accused = frozenset()
                accuser = client.named_by(sid) if client is not None else None
                if client is not None and accuser is not None:
                    # a hop's word about its next hop: that one is replaced and avoided only
                    # briefly (`accused`); a node that names a next hop a second time in one
                    # answer is replaced too, as failed (one refusing every next hop must not
                    # fail answers for free while honest nodes cool down)
                    url = client.hops[accuser].url
                    accusations[url] = accusations.get(url, 0) + 1
                    accused = frozenset({accuser + 1})
                    if accusations[url] > 1:
                        suspects = suspects | {accuser}
                if not suspects and failures <= policy.attempts:
                    suspects = await source.probe()
                failed = _Recovery(
                    code=error.code,
                    hops=tuple(sorted(suspects)),
                    served=served,
                    seen_s=seen_s,
                )
                if recovering is not None:  # the replacement failed too: one record per circuit
                    timings.failovers.append(recovering.done())
                recovering = failed
                if failures > policy.attempts:
                    raise  # its record: `finally` below
                log.warning(
                    "circuit failed; replaying on a replacement attempt=%d hops=%s positions=%d "
                    "error=%s",
                    failures,
                    list(failed.hops),
                    len(prompt) + len(fed),
                    error.message,
                )
                replace, moved = frozenset(suspects), False
                await asyncio.sleep(policy.delay(failures))
    finally:
        # the question ended while it was leaving a circuit (the client hung up, the wallet ran
        # out, no replacement, the last attempt failed): that circuit's record still counts
        if recovering is not None:
            timings.failovers.append(recovering.done())
