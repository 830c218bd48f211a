"""PipelineClient: prefill and decode through a fixed circuit of shard nodes.

Topology: a star with zero-copy relay. The client posts the frame to node 0, takes the answer
frame's body as is, re-heads it for node 1 (`encode_frame` with a replaced header: no decode,
no re-quantization), and so on; only the last node's answer is decoded, and the last node
returns only the last position (`last_only`). Each node is reached over one keep-alive TCP
connection for the whole generation. Nodes never talk to each other and never learn who asked:
a frame carries that hop's session capability, positions and activations only (they can still
read the prompt from the activations; layer sharding is not privacy).

Sessions: one random secret per generation stays on the client; each hop gets its own
capability derived from it (node/client/capabilities.py), so no node can act on another hop's
session. Each node opens its KV cache at position 0 and grows it only by the next contiguous
positions; the client deletes the session on every node at the end.

Answers are read through node/client/answers.py: bounded by what was asked, checked against the
request, malformed ones raise BadAnswerError (a ProtocolError).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import numpy as np

from node.client.answers import (
    MAX_JSON_ANSWER_BYTES,
    BadAnswerError,
    answer_frame_limit,
    parse_answer_frame,
    parse_compute_ms,
    parse_error_body,
    parse_json_object,
    read_bounded,
)
from node.client.capabilities import hop_capability, hop_tag, new_session_id
from node.client.sampling import SamplingConfig, sample
from protocol.errors import BusyError, ConfigError, RemoteError, UnavailableError
from protocol.frames import Frame, FrameHeader, encode_frame, make_frame, session_tag

log = logging.getLogger(__name__)

FRAME_CONTENT_TYPE = "application/x-planet-frame"
COMPUTE_MS_HEADER = "X-Planet-Compute-Ms"


class Head(Protocol):
    """The client's part of the model (node.model.ClientHead), numpy at this boundary."""

    eos_token_ids: frozenset[int]

    def embed_np(self, ids: Sequence[int]) -> np.ndarray: ...  # [1, T, H] float32

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray: ...  # [V] float32


@dataclass(frozen=True, slots=True)
class Hop:
    url: str
    shard: int


@dataclass
class Timings:
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_ms: float = 0.0  # prompt in → first token chosen
    decode_ms: float = 0.0  # first token chosen → last token chosen
    decode_steps: int = 0  # forward passes in decode_ms (one per token after the first)
    node_compute_ms: list[float] = field(default_factory=list)  # per hop, summed over steps
    wire_bytes_sent: int = 0
    wire_bytes_received: int = 0
    _started_s: float = field(default=0.0, repr=False)
    _first_s: float = field(default=0.0, repr=False)

    def begin(self, prompt_tokens: int, hops: int) -> None:
        """A generation of `prompt_tokens` over `hops` nodes starts now (prompt in)."""
        if not prompt_tokens:
            raise ConfigError("empty prompt")
        self.prompt_tokens = prompt_tokens
        self.node_compute_ms = [0.0] * hops
        self._started_s = self._first_s = time.perf_counter()

    def chose(self, step: int) -> None:
        """Token `step` (1 = the first) was chosen now: prefill_ms / decode_ms up to here."""
        now = time.perf_counter()
        if step == 1:
            self._first_s = now
            self.prefill_ms = (now - self._started_s) * 1000
        else:
            self.decode_ms = (now - self._first_s) * 1000

    @property
    def total_ms(self) -> float:
        """Prompt in → last token chosen."""
        return self.prefill_ms + self.decode_ms

    @property
    def decode_tok_s(self) -> float:
        steps = self.decode_steps
        return steps / (self.decode_ms / 1000) if steps > 0 and self.decode_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "prefill_ms": round(self.prefill_ms, 2),
            "decode_ms": round(self.decode_ms, 2),
            "decode_tok_s": round(self.decode_tok_s, 2),
            "node_compute_ms": [round(v, 2) for v in self.node_compute_ms],
            "wire_bytes_sent": self.wire_bytes_sent,
            "wire_bytes_received": self.wire_bytes_received,
        }


__all__ = [
    "BadAnswerError",
    "Head",
    "Hop",
    "PipelineClient",
    "Timings",
    "new_session_id",
]


class PipelineClient:
    """Keep-alive HTTP to every node of one circuit. Use as `async with`."""

    def __init__(
        self,
        hops: Sequence[Hop],
        *,
        codec: str = "raw",
        dtype: str = "float32",
        request_timeout_s: float = 120.0,
        prefill_chunk: int = 2048,
        http: aiohttp.ClientSession | None = None,
    ) -> None:
        if not hops:
            raise ConfigError("a circuit needs at least one node")
        self.hops = tuple(hops)
        self.codec = codec
        self.dtype = dtype
        self.request_timeout_s = request_timeout_s
        self.prefill_chunk = prefill_chunk
        self._given_http = http  # borrowed (not closed here) when given
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PipelineClient:
        if self._given_http is not None:
            self._http = self._given_http
            return self
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=300)
        self._http = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None and self._given_http is None:
            await self._http.close()
        self._http = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("PipelineClient used outside `async with`")
        return self._http

    # ------------------------------------------------------------------------------- requests
    def capabilities(self, session: str) -> list[str]:
        """The capability each hop gets for `session` (the client's secret), in circuit order."""
        return [hop_capability(session, i, h.shard, h.url) for i, h in enumerate(self.hops)]

    def session_tags(self, session: str) -> list[str]:
        """The public tag of `session` on each hop (what nodes key, log and may commit to)."""
        return [hop_tag(session, i, h.shard, h.url) for i, h in enumerate(self.hops)]

    async def _raise_for_answer(self, hop: Hop, answer: aiohttp.ClientResponse) -> None:
        try:
            body = await read_bounded(answer, MAX_JSON_ANSWER_BYTES, hop.url)
        except BadAnswerError:
            body = b""
        code, message = parse_error_body(body)
        message = message or f"HTTP {answer.status}"
        if code == "busy":
            raise BusyError(
                f"node {hop.url} (shard {hop.shard}) is busy: {message}",
                hint="retry in a moment, or add nodes for this shard",
            )
        raise RemoteError(
            f"node {hop.url} (shard {hop.shard})", code, message, http_status=answer.status
        )

    async def _post(self, hop: Hop, payload: bytes, limit: int) -> tuple[bytes, float]:
        """POST a frame; the answer body (at most `limit` bytes) and the node's compute ms."""
        try:
            async with self.http.post(
                f"{hop.url}/v1/forward",
                data=payload,
                headers={"Content-Type": FRAME_CONTENT_TYPE},
            ) as answer:
                if answer.status != 200:
                    await self._raise_for_answer(hop, answer)
                if answer.content_type != FRAME_CONTENT_TYPE:
                    raise BadAnswerError(hop.url, f"content type {answer.content_type[:60]!r}")
                compute_ms = parse_compute_ms(answer.headers.get(COMPUTE_MS_HEADER), hop.url)
                body = await read_bounded(answer, limit, hop.url)
                return body, compute_ms
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as error:
            raise BadAnswerError(hop.url, f"malformed HTTP answer: {error}"[:200]) from None
        except (aiohttp.ClientConnectionError, TimeoutError) as error:
            raise UnavailableError(
                f"node {hop.url} (shard {hop.shard}) is not reachable: "
                f"{type(error).__name__} {error}".rstrip(),
                hint="check `planet local status`, or start nodes with `planet local up`",
            ) from None

    async def info(self) -> list[dict[str, Any]]:
        """GET /info from every node (concurrently)."""

        async def one(hop: Hop) -> dict[str, Any]:
            try:
                async with self.http.get(f"{hop.url}/info") as answer:
                    if answer.status != 200:
                        await self._raise_for_answer(hop, answer)
                    body = await read_bounded(answer, MAX_JSON_ANSWER_BYTES, hop.url)
                    return parse_json_object(body, hop.url)
            except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as error:
                raise BadAnswerError(hop.url, f"malformed HTTP answer: {error}"[:200]) from None
            except (aiohttp.ClientConnectionError, TimeoutError) as error:
                raise UnavailableError(
                    f"node {hop.url} (shard {hop.shard}) is not reachable: {type(error).__name__}",
                    hint="check `planet local status`, or start nodes with `planet local up`",
                ) from None

        return list(await asyncio.gather(*(one(hop) for hop in self.hops)))

    async def check_circuit(self, model_hash: str, total_layers: int) -> list[dict[str, Any]]:
        """Every node serves the expected shard of this model; the layers chain 0..total."""
        infos = await self.info()
        expected_start = 0
        for hop, info in zip(self.hops, infos, strict=True):
            if info.get("model_hash") != model_hash:
                raise ConfigError(
                    f"node {hop.url} serves model {str(info.get('model_hash'))[:80]}, "
                    f"the manifest says {model_hash}",
                    hint="the nodes file and the running nodes disagree; run `planet local up`",
                )
            if info.get("shard") != hop.shard:
                raise ConfigError(
                    f"node {hop.url} serves shard {str(info.get('shard'))[:20]}, "
                    f"expected {hop.shard}"
                )
            layers = info.get("layers")
            if (
                not isinstance(layers, list)
                or len(layers) != 2
                or not all(type(v) is int for v in layers)
            ):
                raise BadAnswerError(hop.url, f"/info layers is not [start, end]: {layers!r:.60}")
            if layers[0] != expected_start:
                raise ConfigError(
                    f"node {hop.url} starts at layer {layers[0]}, expected {expected_start}"
                )
            expected_start = layers[1]
        if expected_start != total_layers:
            raise ConfigError(f"circuit covers layers 0-{expected_start}, model has {total_layers}")
        return infos

    async def run_layers(
        self,
        session: str,
        step: int,
        start: int,
        hidden: np.ndarray,
        timings: Timings | None = None,
        last_only: bool = True,
    ) -> np.ndarray:
        """hidden [1, T, H] at positions start.. through every hop → the last hop's output
        ([1, 1, H] if last_only, else [1, T, H]) as float32.

        `session` is the client's secret for this generation (`new_session_id()`); each hop
        receives only its own capability derived from it."""
        last = len(self.hops) - 1
        capabilities = self.capabilities(session)
        payload = make_frame(
            hidden,
            session=capabilities[0],
            step=step,
            start=start,
            shard=self.hops[0].shard,
            dtype=self.dtype,
            codec=self.codec,
            last_only=last_only and last == 0,
        )
        count = int(hidden.shape[1])
        request = FrameHeader(
            session=capabilities[0],
            step=step,
            start=start,
            count=count,
            dtype=self.dtype,
            shape=(1, count, int(hidden.shape[2])),
            codec=self.codec,
            shard=self.hops[0].shard,
            last_only=last_only and last == 0,
        )
        frame: Frame | None = None
        for index, hop in enumerate(self.hops):
            if frame is not None:
                request = replace(
                    frame.header,
                    session=capabilities[index],
                    shard=hop.shard,
                    last_only=last_only and index == last,
                )
                payload = encode_frame(request, frame.body)
            body, compute_ms = await self._post(hop, payload, answer_frame_limit(request))
            frame = parse_answer_frame(body, request, hop.shard, hop.url)
            if timings is not None:
                timings.wire_bytes_sent += len(payload)
                timings.wire_bytes_received += len(body)
                timings.node_compute_ms[index] += compute_ms
        assert frame is not None  # the loop ran at least once (hops is non-empty)
        return frame.array()

    async def close_session(self, session: str) -> None:
        """DELETE the session on every node, each with its own capability (best effort;
        failures are logged with the hop's public tag, never a capability)."""

        async def one(hop: Hop, capability: str) -> None:
            try:
                async with self.http.delete(
                    f"{hop.url}/v1/sessions/{capability}", timeout=aiohttp.ClientTimeout(total=5)
                ) as answer:
                    await read_bounded(answer, MAX_JSON_ANSWER_BYTES, hop.url)
            except (aiohttp.ClientError, TimeoutError, BadAnswerError) as error:
                log.warning(
                    "session cleanup failed node=%s session=%s error=%s",
                    hop.url,
                    session_tag(capability)[:16],
                    error,
                )

        await asyncio.gather(
            *(one(hop, cap) for hop, cap in zip(self.hops, self.capabilities(session), strict=True))
        )

    # ------------------------------------------------------------------------------- generate
    async def generate(
        self,
        head: Head,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        timings: Timings | None = None,
        stop_on_eos: bool = True,
        prefill_last_only: bool = True,
        on_prefill: Callable[[int, np.ndarray], None] | None = None,
    ) -> AsyncIterator[int]:
        """Yield new token ids as they are chosen; stops on EOS (not yielded) or the limit.
        `stop_on_eos=False` (benchmarks) always runs `max_new_tokens` steps.
        `prefill_last_only=False`: the prompt's frames ask the last node for every position
        (the gateway sends every question so, which makes echo requests look like any other);
        `on_prefill(start, hidden)` then sees each prefill chunk's final hidden states."""
        sampling = (sampling or SamplingConfig()).validate()
        rng = sampling.rng()
        timings = timings if timings is not None else Timings()
        timings.begin(len(prompt_ids), len(self.hops))
        session = new_session_id()  # the secret stays here; hops get derived capabilities
        try:
            # prefill, in chunks of at most prefill_chunk positions
            position = 0
            out: np.ndarray | None = None
            for begin in range(0, len(prompt_ids), self.prefill_chunk):
                chunk = list(prompt_ids[begin : begin + self.prefill_chunk])
                out = await self.run_layers(
                    session, 0, position, head.embed_np(chunk), timings, prefill_last_only
                )
                if on_prefill is not None:
                    on_prefill(position, out)
                position += len(chunk)
            assert out is not None
            for step in range(1, max_new_tokens + 1):
                token = sample(head.logits_np(out[0, -1]), sampling, rng)
                timings.chose(step)
                if stop_on_eos and token in head.eos_token_ids:
                    break
                timings.new_tokens += 1
                yield token
                if step == max_new_tokens:
                    break
                out = await self.run_layers(
                    session, step, position, head.embed_np([token]), timings
                )
                timings.decode_steps += 1
                position += 1
        finally:
            await self.close_session(session)
