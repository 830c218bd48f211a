"""One generation over a circuit, as a stream of token events.

Drives `node.client.circuit.CircuitClient` (client → A → B → C → client, one WebSocket per
link) through the gateway's `CircuitPool`: questions on the same circuit share one live client,
so their decode steps batch at the shards and at the LM head. Every question's prompt asks the
last node for all positions (`full_prefill`), so an echo request (a verifier's challenge) looks
like any other; logprobs come from the logits the client sampled the token from (`on_logits`).

Failover (node/client/failover.py): when a hop fails — before or after the first token reached
the user — the router replaces that hop (`Router.replace`: the failed node cools down, the next
choice for its shard takes its place), the answer's token history is replayed into the new
circuit at the same positions and the answer goes on, the same tokens a run without the
failure gives. At most `attempts` circuits per question (the first included); then the
question fails: `NodeFailed` (502), and the caller's payment state machine decides what is
charged (`payment_state.py`: what was delivered, or nothing). A shard left with no node
is `NoCircuit` (503) before the first token, `NodeFailed` after it.

Who served the answer: `Generation.circuit` lists the final circuit's nodes and then every node
that served a failed circuit before, in order of service; the receipt's circuit hash covers
that list. Nodes are paid as the answer runs, with credits on each hop's own link
(docs/credits.md); the gateway's work report names no node (node/gateway/settlement.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from node.client.failover import FAILURES, FailoverPolicy, generate
from node.client.paying import FINAL_PAYMENT_ERRORS
from node.client.sampling import SamplingConfig
from node.client.speculation import SpeculationConfig
from node.client.types import Head, Hop, Timings
from node.gateway.circuits import CircuitPool
from node.gateway.credit_holds import CircuitCover, CreditHold, session_positions
from node.gateway.errors import NoCircuit, NodeFailed
from node.gateway.router import Circuit, RoutableNode, Router
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

NODE_ERRORS = FAILURES
STALL_S = 10.0  # no answer for this long: the circuit is stalled (a frozen node)
# prompt positions per LM-head matmul of an echo: [64, V] float32 logits, 12.6 MB for SmolLM2
ECHO_ROWS = 64


class RouterCircuits:
    """The gateway's `CircuitSource`: circuits from the router, live clients from the pool
    (shared with the other questions on the same circuit), session slots held while used."""

    def __init__(
        self,
        router: Router,
        pool: CircuitPool,
        probe_timeout_s: float = 2.0,
        cover: Callable[[Sequence[str]], None] | None = None,
        prompt: Sequence[int] | None = None,
    ) -> None:
        self.router = router
        self.prompt = prompt  # the question's prompt: routed where its prefix is cached
        self.pool = pool
        self.probe_timeout_s = probe_timeout_s
        # before a circuit is used: its question holds the credits it can cost, by the circuit's
        # endpoints (credit_holds.py `CircuitCover`), or raises GatewayOutOfCredits
        self.cover = cover
        self.circuits: list[Circuit] = []  # every circuit leased, in order

    @contextlib.asynccontextmanager
    async def lease(
        self,
        replace: frozenset[int],
        *,
        failed: bool = True,
        accused: frozenset[int] = frozenset(),
    ) -> AsyncIterator[Any]:
        if self.circuits and replace:
            circuit = await self.router.replace(
                self.circuits[-1], replace, failed=failed, accused=accused
            )
        else:
            # NoCircuit (503) when a shard has none
            circuit = await self.router.circuit(self.prompt)
        if self.cover is not None:  # nothing was sent to its nodes yet
            self.cover([name for node in circuit.nodes for _, name, _ in node.payees()])
        self.circuits.append(circuit)
        if len(self.circuits) > 1:
            log.info(
                "replacement circuit leased circuits=%d shards=%s",
                len(self.circuits),
                sorted(replace),
            )
        hops = [
            Hop(url=n.endpoint, shard=n.shard, key=n.key, alternates=n.alternates, last=n.last)
            for n in circuit.nodes
        ]
        async with self.router.hold(circuit), self.pool.use(hops) as client:
            for hop in hops:  # so its open sends each node the prompt's route keys
                stats = self.router.costs.get(hop.url)
                if stats.prefix_routes is not None:
                    client.route_salts[hop.url] = stats.prefix_routes.salt
                # and next.alternates only to the previous hops whose /info takes them
                client.open_features[hop.url] = stats.open_features
            yield client

    def observe(self, urls: Sequence[str], pass_s: float) -> None:
        self.router.costs.observe_circuit(urls, pass_s)

    def outpriced(self, hops: Sequence[Hop]) -> set[int]:
        return self.router.outpriced(self.circuits[-1]) if self.circuits else set()

    async def probe(self) -> set[int]:
        if not self.circuits:
            return set()
        nodes = self.circuits[-1].nodes
        # through the router's reader of nodes (over the overlay with --relays: issue 43)
        answers = await asyncio.gather(
            *(self.router.healthy(n, self.probe_timeout_s) for n in nodes)
        )
        return {index for index, ok in enumerate(answers) if not ok}


def served_circuit(circuits: Sequence[Circuit], served: Sequence[int]) -> Circuit:
    """The answer's circuit for its receipt (module docstring): `circuits` leased in order (the
    last answered), `served[i]` the positions circuit i answered before it failed (as long as
    `circuits` when the last failed too: the question failed). The final circuit's nodes
    first, then every node of a failed circuit before, in order of service."""
    *failed, final = circuits
    if not failed and len(served) < len(circuits):
        return final
    nodes: dict[RoutableNode, None] = dict.fromkeys(final.nodes)
    for circuit in failed:
        nodes.update(dict.fromkeys(n for n in circuit.nodes if n not in nodes))
    return Circuit(tuple(nodes))


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token: int
    logprob: float | None  # of the chosen token under the model (temperature 1)
    top: tuple[tuple[int, float], ...]  # the `top_n` most likely (token, logprob)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    values = logits.astype(np.float64)
    shifted = values - values.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_event(token: int, logits: np.ndarray | None, want: bool, top_n: int) -> TokenEvent:
    if not want or logits is None:
        return TokenEvent(token, None, ())
    logp = log_softmax(logits)
    top: tuple[tuple[int, float], ...] = ()
    if top_n > 0:
        best = np.argpartition(-logp, top_n)[:top_n]
        best = best[np.argsort(-logp[best], kind="stable")]
        top = tuple((int(i), float(logp[i])) for i in best)
    return TokenEvent(token, float(logp[token]), top)


def echo_events(
    head: Head, ids: Sequence[int], hidden: np.ndarray, want: bool, top_n: int
) -> list[TokenEvent]:
    """One event per prompt token of an echo: `hidden` [T, H] the prefill's final hidden states
    of the prompt `ids` [T]; row i's logits give token i + 1's logprob (the first token has
    none). The logits come from the LM head in one matmul per ECHO_ROWS rows, not a
    matrix-vector product per row: each of those reads the whole [V, H] head (113 MB for
    SmolLM2), ~9x the CPU of a verifier's challenge (96 rows). None are computed without
    `want` (echo without logprobs)."""
    out = [TokenEvent(ids[0], None, ())]
    rows = len(ids) - 1
    if not want:
        return out + [TokenEvent(token, None, ()) for token in ids[1:]]
    for start in range(0, rows, ECHO_ROWS):
        stop = min(start + ECHO_ROWS, rows)
        logits = head.logits_batch_np(hidden[start:stop])
        for row in range(start, stop):
            out.append(token_event(ids[row + 1], logits[row - start], want, top_n))
    return out


class Generation:
    """One question: prompt ids in, token events out; `.circuit` is who answered (after a
    failover: every node that served, with the positions each computed)."""

    def __init__(
        self,
        router: Router,
        head: Head,
        circuits: CircuitPool,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingConfig,
        logprobs: bool,
        top_logprobs: int,
        attempts: int = 5,
        echo: bool = False,
        full_prefill: bool = True,
        stall_s: float = STALL_S,
        speculate: int = 0,
        credits: CreditHold | None = None,
        ring: bool = False,
    ) -> None:
        self.router = router
        self.head = head
        self.circuits = circuits
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.policy = FailoverPolicy(attempts=max(attempts - 1, 0), stall_s=stall_s)
        self.echo = echo
        self.speculation = SpeculationConfig(lookahead=speculate) if speculate else None
        self.ring = ring  # the first node's loop where the circuit takes it (failover.py)
        # every question's prompt frames ask the last node for all positions, so a question
        # with echo (a verifier's challenge, say) looks like any other to the nodes
        self.full_prefill = full_prefill
        self._prefill: dict[int, np.ndarray] = {}  # echo: final hidden states by chunk start
        self._logits: np.ndarray | None = None  # what the last token was sampled from
        cover = None
        if credits is not None:  # each circuit's session is covered before it is used
            positions = session_positions(len(self.prompt_ids), max_tokens, speculate)
            cover = CircuitCover(credits, router.prices, positions)
        self.source = RouterCircuits(router, circuits, cover=cover, prompt=self.prompt_ids)
        self.timings = Timings()
        self.delivered = False  # set by the caller once an event reached the user
        self.count = 0

    @property
    def started(self) -> bool:
        """A circuit was leased: the prompt went to nodes, which work for this client."""
        return bool(self.source.circuits)

    @property
    def circuit(self) -> Circuit | None:
        """Who answered (see `served_circuit`); None before the first circuit was leased."""
        leased = self.source.circuits
        if not leased:
            return None
        served = [f.served for f in self.timings.failovers]
        return served_circuit(leased, served)

    async def events(self) -> AsyncIterator[TokenEvent | None]:
        """Token events, going on over failures (module docstring). (`None`, "a retry starts
        over: drop what you collected", is no longer produced: a failover continues.)"""
        tokens = generate(
            self.source,
            self.head,
            self.prompt_ids,
            max_new_tokens=self.max_tokens,
            sampling=self.sampling,
            timings=self.timings,
            prefill_last_only=not (self.full_prefill or self.echo),
            on_prefill=self._keep_prefill if self.echo else None,
            on_logits=self._keep_logits if self.logprobs else None,
            policy=self.policy,
            speculation=self.speculation,
            ring=self.ring,
        )
        try:
            async with contextlib.aclosing(tokens):
                async for token in tokens:
                    self.count += 1
                    yield token_event(token, self._logits, self.logprobs, self.top_logprobs)
        except NoCircuit:
            if not self.delivered:
                raise
            raise NodeFailed(
                "node_failed",
                "a compute node failed during the question and no other node serves its shard",
            ) from None
        except FINAL_PAYMENT_ERRORS:
            # the user's credits or price limit (a personal client), or a node it sent unpaid
            # (`UnpaidError`): not a node's fault; answered 402 by its own name
            raise
        except NODE_ERRORS as error:
            log.warning(
                "question failed circuits=%d error=%s",
                len(self.source.circuits),
                error,
            )
            raise NodeFailed(
                "node_failed",
                f"a compute node failed during the question ({error.message})",
            ) from None

    async def echoed_events(self) -> list[TokenEvent]:
        """With `echo`: one event per prompt token (the first has no logprob), from the final
        hidden states of the prefill that answered (empty without echo)."""
        if not self.echo:
            return []
        if not self._prefill:
            raise ProtocolError("echo: the prefill's hidden states are missing")
        hidden = np.concatenate([self._prefill[s] for s in sorted(self._prefill)], axis=0)
        ids = self.prompt_ids
        if hidden.shape[0] != len(ids):
            raise ProtocolError(f"echo prefill answered {hidden.shape[0]} of {len(ids)} positions")
        return await asyncio.to_thread(
            echo_events, self.head, ids, hidden, self.logprobs, self.top_logprobs
        )

    def _keep_logits(self, logits: np.ndarray) -> None:
        self._logits = logits

    def _keep_prefill(self, start: int, hidden: np.ndarray) -> None:
        self._prefill[start] = np.asarray(hidden[0], dtype=np.float32)

    @property
    def finished_by_length(self) -> bool:
        return self.count >= self.max_tokens
