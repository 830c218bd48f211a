"""Many TCP connections over one sealed WebSocket: the two ends of a rendezvous link
(`protocol.rendezvous`), the relay's (node/relay/fronting.py) and the node's
(node/server/rendezvous.py).

Each stream pairs one TCP connection on this side with one on the other. Bytes read from the
local connection go out as DATA frames, never more than the other side's credit; DATA that
arrives is queued for the local connection (at most the window: the sender was given no more
credit) and written by the stream's own task, which sends CREDIT back as it drains, so one slow
connection stalls only itself. CLOSE from either side ends the stream; a frame that breaks the
rules ends the whole link (`FrameInvalid`, `FlowViolation`), since only the other end of an
authenticated link could have sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.rendezvous import (
    CHUNK_BYTES,
    WINDOW_BYTES,
    Frame,
    FrameInvalid,
    FrameKind,
    Sealer,
    Window,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Stream:
    ident: int
    reader: asyncio.StreamReader | None = None  # None while the node's side connects
    writer: asyncio.StreamWriter | None = None
    send: Window = field(default_factory=Window)  # what the other side still takes
    receive: Window = field(default_factory=Window)  # what it may still send us
    credit: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False
    bytes_out: int = 0
    bytes_in: int = 0


class Tunnel:
    """One sealed link's streams. `ws` is an aiohttp WebSocket (either end); `outgoing` and
    `incoming` seal and open this side's and the other side's frames."""

    def __init__(
        self,
        ws: Any,
        outgoing: Sealer,
        incoming: Sealer,
        *,
        on_open: Callable[[int, str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
        | None = None,
    ) -> None:
        self.ws = ws
        self.outgoing = outgoing
        self.incoming = incoming
        self.on_open = on_open  # the node's side: connect a stream the relay opened
        self.streams: dict[int, Stream] = {}
        self._send_lock = asyncio.Lock()
        self._opening: set[asyncio.Task[None]] = set()
        self.on_end: Callable[[Stream], None] | None = None  # a stream is over
        self.closed = False

    async def send(self, frame: Frame) -> None:
        async with self._send_lock:  # sequence numbers in the order frames leave
            if self.closed:
                raise ConnectionError("the rendezvous link is closed")
            await self.ws.send_bytes(self.outgoing.seal(frame.to_bytes()))

    # -- streams --------------------------------------------------------------------------------

    def attach(
        self, ident: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Stream:
        stream = self.streams.get(ident) or Stream(ident)
        stream.reader, stream.writer = reader, writer
        stream.credit.set()
        self.streams[ident] = stream
        stream.tasks.append(asyncio.create_task(self._pump_out(stream)))
        stream.tasks.append(asyncio.create_task(self._pump_in(stream)))
        return stream

    async def _pump_out(self, stream: Stream) -> None:
        """Local connection → DATA frames, within the credit the other side gave."""
        assert stream.reader is not None
        try:
            while True:
                await stream.credit.wait()
                if stream.closed:
                    break
                data = await stream.reader.read(min(CHUNK_BYTES, stream.send.left))
                if not data or stream.closed:
                    break
                stream.send.take(len(data))
                if stream.send.left == 0:
                    stream.credit.clear()
                stream.bytes_out += len(data)
                await self.send(Frame(FrameKind.DATA, stream.ident, data))
        except (ConnectionError, OSError):
            pass
        finally:
            await self._end(stream, tell=True)

    async def _pump_in(self, stream: Stream) -> None:
        """Queued DATA → the local connection; CREDIT back once written."""
        assert stream.writer is not None
        try:
            while True:
                data = await stream.inbox.get()
                if data is None:
                    break
                stream.writer.write(data)
                await stream.writer.drain()
                stream.bytes_in += len(data)
                stream.receive.grant(len(data))
                await self.send(Frame.credit(stream.ident, len(data)))
        except (ConnectionError, OSError):
            await self._end(stream, tell=True)
        finally:
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                stream.writer.close()

    async def _end(self, stream: Stream, *, tell: bool) -> None:
        if stream.closed:
            return
        stream.closed = True
        self.streams.pop(stream.ident, None)
        if self.on_end is not None:
            self.on_end(stream)
        stream.inbox.put_nowait(None)  # what is queued is still written, then the socket closes
        stream.credit.set()  # a reader waiting for credit sees the stream closed
        if tell:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send(Frame(FrameKind.CLOSE, stream.ident))

    # -- frames from the other side -------------------------------------------------------------

    async def receive(self, data: bytes) -> None:
        """One sealed message from the other side; FrameInvalid/FlowViolation end the link."""
        frame = Frame.from_bytes(self.incoming.open(data))
        stream = self.streams.get(frame.stream)
        if frame.kind is FrameKind.OPEN:
            if self.on_open is None:
                raise FrameInvalid("open", "only the relay opens streams")
            if stream is not None:
                raise FrameInvalid("open", f"stream {frame.stream} is open already")
            # DATA may follow before the local connection is up: it waits in the inbox
            self.streams[frame.stream] = Stream(frame.stream)
            task = asyncio.create_task(self._open(frame.stream, frame.dialer))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)
        elif stream is None:
            return  # a stream this side ended already: its last frames are dropped
        elif frame.kind is FrameKind.DATA:
            stream.receive.take(len(frame.body))
            stream.inbox.put_nowait(frame.body)
        elif frame.kind is FrameKind.CREDIT:
            stream.send.grant(frame.granted)
            stream.credit.set()
        elif frame.kind is FrameKind.CLOSE:
            # the writer drains what is queued and closes the socket, which ends the reader
            await self._end(stream, tell=False)

    async def _open(self, ident: int, dialer: str) -> None:
        assert self.on_open is not None
        try:
            reader, writer = await self.on_open(ident, dialer)
        except (OSError, TimeoutError) as error:
            log.info("rendezvous: stream %d not connected locally: %s", ident, error)
            self.streams.pop(ident, None)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.send(Frame(FrameKind.CLOSE, ident))
            return
        stream = self.streams.get(ident)
        if self.closed or stream is None or stream.closed:
            writer.close()  # the relay closed it meanwhile
            return
        self.attach(ident, reader, writer)

    async def close(self) -> None:
        """End every stream (the link is gone)."""
        self.closed = True
        for task in list(self._opening):
            task.cancel()
        for stream in list(self.streams.values()):
            for task in stream.tasks:
                task.cancel()
            stream.closed = True
            if self.on_end is not None:
                self.on_end(stream)
            if stream.writer is not None:
                with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                    stream.writer.close()
        self.streams.clear()


__all__ = ["CHUNK_BYTES", "WINDOW_BYTES", "Stream", "Tunnel"]
