"""One generation over a circuit, as a stream of token events.

Drives `node.client.circuit.CircuitClient` (client → A → B → C → client, one WebSocket per
link) through the gateway's `CircuitPool`: questions on the same circuit share one live client,
so their decode steps batch at the shards and at the LM head. Every question's prompt asks the
last node for all positions (`full_prefill`), so an echo request (a verifier's challenge) looks
like any other; logprobs come from the logits the client sampled the token from (`on_logits`).

Retries (OpenTela's lesson): when a question fails before anything was shown to the user, the
nodes of the failed circuit that do not answer /health are cooled down and a new circuit is
built, up to `attempts` times. After the first event reached the user (`delivered`) a failure
is final: `NodeFailed` (502); the caller's payment state machine decides what is charged
(`payment_state.py`: what was delivered, or nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np

from node.client.sampling import SamplingConfig
from node.client.types import Head, Hop
from node.gateway.circuits import CircuitPool
from node.gateway.errors import NodeFailed
from node.gateway.router import Circuit, Router
from protocol.errors import BusyError, ProtocolError, RemoteError, UnavailableError

log = logging.getLogger(__name__)

NODE_ERRORS = (UnavailableError, BusyError, RemoteError, ProtocolError)


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


class Generation:
    """One question: prompt ids in, token events out; `.circuit` is the one that answered."""

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
        attempts: int = 2,
        echo: bool = False,
        full_prefill: bool = True,
    ) -> None:
        self.router = router
        self.head = head
        self.circuits = circuits
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.attempts = attempts
        self.echo = echo
        # every question's prompt frames ask the last node for all positions, so a question
        # with echo (a verifier's challenge, say) looks like any other to the nodes
        self.full_prefill = full_prefill
        self._prefill: list[np.ndarray] = []  # echo: the final hidden states, [t, H] chunks
        self._logits: np.ndarray | None = None  # what the last token was sampled from
        self.circuit: Circuit | None = None
        self.delivered = False  # set by the caller once an event reached the user
        self.started = False  # the answering attempt's prompt went to its circuit
        self.count = 0

    async def events(self) -> AsyncIterator[TokenEvent | None]:
        """Token events; `None` means "a retry starts over: drop what you collected" (only
        while `delivered` is false)."""
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                yield None
            self.started = False
            circuit = await self.router.circuit()  # NoCircuit (503) when a shard has none
            self.circuit = circuit
            self.count = 0
            hops = [Hop(url=n.endpoint, shard=n.shard) for n in circuit.nodes]
            try:
                async with self.router.hold(circuit), self.circuits.use(hops) as client:
                    self._prefill = []
                    self._logits = None
                    self.started = True  # from here the nodes work for this client
                    tokens = client.generate(
                        self.head,
                        self.prompt_ids,
                        max_new_tokens=self.max_tokens,
                        sampling=self.sampling,
                        prefill_last_only=not (self.full_prefill or self.echo),
                        on_prefill=self._keep_prefill if self.echo else None,
                        on_logits=self._keep_logits if self.logprobs else None,
                    )
                    async with contextlib.aclosing(tokens):
                        async for token in tokens:
                            self.count += 1
                            yield token_event(token, self._logits, self.logprobs, self.top_logprobs)
                return
            except NODE_ERRORS as error:
                log.warning(
                    "question failed attempt=%d circuit=%s error=%s",
                    attempt,
                    [n.key[:12] for n in circuit.nodes],
                    error,
                )
                if isinstance(error, BusyError):
                    await asyncio.sleep(0.5 * attempt)  # a full node: wait a little, retry
                else:
                    await self.router.probe(circuit)
                if self.delivered or attempt == self.attempts:
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
        hidden = np.concatenate(self._prefill, axis=0)  # [T, H]
        ids = self.prompt_ids
        if hidden.shape[0] != len(ids):
            raise ProtocolError(f"echo prefill answered {hidden.shape[0]} of {len(ids)} positions")

        def events() -> list[TokenEvent]:
            out = [TokenEvent(ids[0], None, ())]
            for row, token in enumerate(ids[1:]):
                logits = self.head.logits_np(hidden[row])
                out.append(token_event(token, logits, self.logprobs, self.top_logprobs))
            return out

        return await asyncio.to_thread(events)

    def _keep_logits(self, logits: np.ndarray) -> None:
        self._logits = logits

    def _keep_prefill(self, start: int, hidden: np.ndarray) -> None:
        self._prefill.append(np.asarray(hidden[0], dtype=np.float32))

    @property
    def finished_by_length(self) -> bool:
        return self.count >= self.max_tokens
