"""The first node's decode loop for one session (docs/overlay.md, *The ring*; protocol/ring.py).

    loop = RingLoop(spec, head, submit=..., to_client=..., refuse=..., reply_sid=sid)
    await loop.deliver(frame)      an output of the circuit's last hop, come back to this node
    loop.stop()                    the session closed (the client's close, its link gone)

For each output at position N − 1 and on (N: the prompt's positions), the loop applies the
model's client head, samples the next token with `protocol.sampling.sample` (one Generator
seeded with the spec's seed, one draw per token, the client's and the verifiers' sampler), hands
(token, the output's row) to a writer that sends whatever tokens are ready to the client in one
ring tokens message, and, unless the token is a stop id or the last one asked for, embeds it and
submits it as the decode frame at the next position: `submit` runs it exactly as a frame from
the client (quotas, payments: a hop computes only what its credits cover, the batcher). The
outputs of the prompt's earlier chunks are passed on to the client as they are (its prefill is
paced by them). The head is loaded once per node, hash-checked against the manifest
(`RingHeads`); head and sampling run on the node's forward thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any

from protocol.errors import PlanetError
from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.errors import BadPositionsError, FrameError
from protocol.frames.header import FrameHeader, pack_frame, parse_frame
from protocol.ring import RingSpec, RingUnavailableError
from protocol.ring_tokens import MAX_BATCH, pack_ring_tokens
from protocol.sampling import sample

log = logging.getLogger(__name__)


def head_file(manifest: Path) -> Path:
    """Where the model's client head lies beside a node's manifest."""
    from node.model.manifest import CLIENT_FILE, manifest_path

    return manifest_path(manifest).parent / CLIENT_FILE


class RingHeads:
    """The node's client head, loaded (and hash-checked) on the first ring session."""

    def __init__(self, manifest: Path, executor: Executor) -> None:
        self.manifest = manifest
        self.executor = executor
        self._head: asyncio.Future[Any] | None = None
        self.sessions = 0  # ring sessions opened on this node since start

    @property
    def available(self) -> bool:
        return head_file(self.manifest).is_file()

    async def head(self) -> Any:
        if not self.available:
            raise RingUnavailableError("this node holds no client head (client.safetensors)")
        if self._head is None:
            self._head = asyncio.get_running_loop().run_in_executor(self.executor, self._load)
        try:
            return await asyncio.shield(self._head)
        except PlanetError as error:
            self._head = None
            raise RingUnavailableError(f"the client head did not load: {error.message}") from None

    def _load(self) -> Any:
        from node.model.head import ClientHead

        head = ClientHead.load(self.manifest, device="cpu", verify=True)
        log.info("ring: client head loaded (vocabulary %d)", head.vocab_size)
        return head


class RingLoop:
    """One session's loop on its first node (module docstring)."""

    def __init__(
        self,
        spec: RingSpec,
        head: Any,
        *,
        hidden_size: int,
        max_tokens: int,
        executor: Executor,
        reply_sid: int,
        submit: Callable[[bytes], Awaitable[None]],
        to_client: Callable[[bytes], Awaitable[None]],
        refuse: Callable[[PlanetError], Awaitable[None]],
    ) -> None:
        self.spec = spec
        self.head = head
        self.hidden_size = hidden_size
        self.max_tokens = max_tokens
        self.executor = executor
        self.reply_sid = reply_sid
        self.submit = submit
        self.to_client = to_client
        self.refuse = refuse
        self.sampling = spec.sampling
        self.rng = self.sampling.rng()
        self.chosen = 0  # tokens chosen so far
        self.done = False
        self._outputs: asyncio.Queue[tuple[FrameHeader, bytes]] = asyncio.Queue()
        self._ready: list[tuple[int, int, bytes]] = []  # (position, token, row) not yet sent
        self._wake = asyncio.Event()
        self._batch: tuple[str, str] = ("float32", "raw")
        self._tasks = [
            asyncio.create_task(self._run()),
            asyncio.create_task(self._write()),
        ]

    async def deliver(self, data: bytes) -> None:
        """An output of the last hop for this session (parsed here: from a peer)."""
        try:
            header, body = parse_frame(data, self.hidden_size, self.max_tokens)
        except FrameError as error:
            log.info("ring: a bad output came back: %s", error.message)
            await self._fail(error)
            return
        self._outputs.put_nowait((header, bytes(body)))

    def stop(self) -> None:
        self.done = True
        for task in self._tasks:
            task.cancel()

    async def _fail(self, error: PlanetError) -> None:
        if not self.done:
            self.done = True
            await self.refuse(error)
            self._tasks[0].cancel()

    async def _run(self) -> None:
        spec = self.spec
        while not self.done:
            header, body = await self._outputs.get()
            end = header.start + header.count  # one past the output's last position
            if end < spec.prompt or (self.chosen == 0 and end == spec.prompt):
                # a prompt chunk's output: the client paces its prefill by these
                await self.to_client(pack_frame(replace(header, sid=self.reply_sid), body))
                if end < spec.prompt:
                    continue
            expected = spec.prompt + self.chosen  # the output a token is chosen from next
            if end != expected:
                await self._fail(
                    BadPositionsError(f"ring: an output ends at {end}, expected {expected}")
                )
                return
            try:
                token, row = await self._choose(header, body)
            except PlanetError as error:
                await self._fail(error)
                return
            self.chosen += 1
            self._batch = (header.dtype, header.codec)
            self._ready.append((end - 1, token, row))
            self._wake.set()
            if token in spec.stop or self.chosen == spec.max_new:
                self.done = True
                log.info("ring: finished tokens=%d", self.chosen)
                return
            embedded = await self._run_off_loop(self.head.embed_np, [token])
            frame = pack_frame(
                FrameHeader(self.reply_sid, end, 1, header.dtype, header.codec, True),
                encode_body(embedded, header.dtype, header.codec),
            )
            await self.submit(frame)

    async def _choose(self, header: FrameHeader, body: bytes) -> tuple[int, bytes]:
        """The token chosen from the output's last row, and that row's own body."""
        rows = decode_values(header.dtype, header.codec, (1, header.count, self.hidden_size), body)
        last = rows[:, -1:, :]
        row = body if header.count == 1 else encode_body(last, header.dtype, header.codec)

        def choose() -> int:
            logits = self.head.logits_np(last[0, -1])
            return sample(logits, self.sampling, self.rng)

        return await self._run_off_loop(choose), bytes(row)

    async def _run_off_loop(self, work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work, *args)

    async def _write(self) -> None:
        """Send whatever tokens are ready in one message, until the last one went."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready:
                batch, self._ready = self._ready[:MAX_BATCH], self._ready[MAX_BATCH:]
                start = batch[0][0]
                items = [(token, row) for _, token, row in batch]
                dtype, codec = self._batch
                await self.to_client(pack_ring_tokens(self.reply_sid, start, dtype, codec, items))
            if self.done:
                return
