"""One generation over a circuit, as a stream of token events.

Drives `node.client.pipeline.PipelineClient` as a library (two thin wraps, kept here so the
client stays as it is): `SharedPipeline` borrows the gateway's one keep-alive HTTP session
instead of opening one per question, and `RecordingHead` remembers the logits the client
sampled from, so logprobs come from the same numbers that chose the token.

Retries (OpenTela's lesson): when a question fails before anything was shown to the user, the
nodes of the failed circuit that do not answer /health are cooled down and a new circuit is
built, up to `attempts` times. After the first event reached the user a failure is final:
`NodeFailed` (502), and the caller charges nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np

from node.client.pipeline import Head, Hop, PipelineClient, new_session_id
from node.client.sampling import SamplingConfig, sample
from node.gateway.errors import NodeFailed
from node.gateway.router import Circuit, Router
from protocol.errors import BusyError, ProtocolError, RemoteError, UnavailableError

log = logging.getLogger(__name__)

NODE_ERRORS = (UnavailableError, BusyError, RemoteError, ProtocolError)


class SharedPipeline(PipelineClient):
    """A PipelineClient over an aiohttp session owned by the gateway (not closed here)."""

    def __init__(self, hops: Sequence[Hop], http: aiohttp.ClientSession) -> None:
        super().__init__(hops)
        self._shared = http

    async def __aenter__(self) -> SharedPipeline:
        self._http = self._shared
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._http = None


class RecordingHead:
    """Delegates to the shared head; keeps the last logits vector it produced."""

    def __init__(self, head: Head) -> None:
        self._head = head
        self.eos_token_ids = head.eos_token_ids
        self.last_logits: np.ndarray | None = None

    def embed_np(self, ids: Sequence[int]) -> np.ndarray:
        return self._head.embed_np(ids)

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        self.last_logits = self._head.logits_np(hidden_last)
        return self.last_logits


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
        http: aiohttp.ClientSession,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingConfig,
        logprobs: bool,
        top_logprobs: int,
        attempts: int = 2,
        echo: bool = False,
    ) -> None:
        self.router = router
        self.head = head
        self.http = http
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.attempts = attempts
        self.echo = echo
        # with `echo`: one event per prompt token (the first has no logprob), set before the
        # first answer event of the attempt that answered
        self.prompt_events: list[TokenEvent] = []
        self.circuit: Circuit | None = None
        self.delivered = False  # set by the caller once an event reached the user
        self.count = 0

    async def events(self) -> AsyncIterator[TokenEvent | None]:
        """Token events; `None` means "a retry starts over: drop what you collected" (only
        while `delivered` is false)."""
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                yield None
            circuit = await self.router.circuit()  # NoCircuit (503) when a shard has none
            self.circuit = circuit
            self.count = 0
            hops = [Hop(url=n.endpoint, shard=n.shard) for n in circuit.nodes]
            recorder = RecordingHead(self.head)
            try:
                async with self.router.hold(circuit), SharedPipeline(hops, self.http) as client:
                    if self.echo:
                        tokens = self._echo_generate(client, recorder)
                    else:
                        tokens = client.generate(
                            recorder,
                            self.prompt_ids,
                            max_new_tokens=self.max_tokens,
                            sampling=self.sampling,
                        )
                    async with contextlib.aclosing(tokens):
                        async for token in tokens:
                            self.count += 1
                            yield token_event(
                                token, recorder.last_logits, self.logprobs, self.top_logprobs
                            )
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
                        f"a compute node failed during the question ({error.message}); "
                        "nothing was charged, ask again",
                    ) from None

    async def _echo_generate(
        self, client: PipelineClient, head: RecordingHead
    ) -> AsyncIterator[int]:
        """`generate` for echo: the prompt's prefill returns every position (`last_only`
        false), so each prompt token gets its logprob from the same prefill that answers; then
        decoding goes on as usual. `self.prompt_events` is set before the first token."""
        session = new_session_id()
        try:
            ids = self.prompt_ids
            hidden = await client.run_layers(session, 0, 0, head.embed_np(ids), last_only=False)
            if hidden.shape[:2] != (1, len(ids)):
                raise ProtocolError(f"echo prefill answered shape {list(hidden.shape)}")
            events = [TokenEvent(ids[0], None, ())]
            for row, token in enumerate(ids[1:]):
                logits = await asyncio.to_thread(head.logits_np, hidden[0, row])
                events.append(token_event(token, logits, self.logprobs, self.top_logprobs))
            self.prompt_events = events
            rng = self.sampling.validate().rng()
            position = len(ids)
            out = hidden[:, -1:]
            for step in range(1, self.max_tokens + 1):
                token = sample(head.logits_np(out[0, -1]), self.sampling, rng)
                if token in head.eos_token_ids:
                    return
                yield token
                if step == self.max_tokens:
                    return
                out = await client.run_layers(session, step, position, head.embed_np([token]))
                position += 1
        finally:
            await client.close_session(session)

    @property
    def finished_by_length(self) -> bool:
        return self.count >= self.max_tokens
