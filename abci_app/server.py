"""A small asyncio ABCI 2.0 socket server (CometBFT v0.38 `socket` transport).

Wire: every Request and Response is a protobuf message (`tendermint.abci.Request/Response`)
prefixed by its length as an unsigned varint (`protoio.NewDelimitedWriter`). CometBFT opens four
connections (consensus, mempool, query, snapshot) to the same address; each is served by its
own task, requests strictly in order, one response per request (pipelined requests are answered
in the order they arrived). `Flush` is answered like any request and additionally drains the
socket. The app's handlers are synchronous, so the four connections never interleave inside
one handler (no locks needed).

A handler that raises is logged with its context (connection, method, height) and answered
with `ResponseException`, which CometBFT treats as fatal on the consensus connection — the
right outcome for a bug in a deterministic app. Listens on `tcp://HOST:PORT` or `unix://PATH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from typing import Any, Protocol

from abci_app.encoding import FramingError, decode_uvarint, encode_uvarint
from abci_app.proto import abci_pb
from protocol.errors import ConfigError

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 100 * 1024 * 1024  # CometBFT's own limit for ABCI socket messages
READ_CHUNK = 1 << 16


class Handler(Protocol):
    def handle(self, request: Any) -> Any: ...


def frame(message: Any) -> bytes:
    data = message.SerializeToString()
    return encode_uvarint(len(data)) + data


def parse_address(address: str) -> tuple[str, str, int]:
    """('tcp', host, port) or ('unix', path, 0) from `tcp://host:port` / `unix://path`."""
    if address.startswith("unix://"):
        return "unix", address[len("unix://") :], 0
    rest = address[len("tcp://") :] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(
            f"bad listen address {address!r}", hint="use tcp://127.0.0.1:26658 or unix:///path"
        )
    return "tcp", host or "127.0.0.1", int(port)


class AbciServer:
    """Serves one ABCI application on one address."""

    def __init__(self, app: Handler, address: str) -> None:
        self.app = app
        self.address = address
        self.kind, self.host, self.port = parse_address(address)
        self.pb = abci_pb()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ids = itertools.count(1)

    async def start(self) -> None:
        if self.kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.host)
            self._server = await asyncio.start_unix_server(self._serve, path=self.host)
        else:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]
        log.info("abci listening address=%s", self.bound_address)

    @property
    def bound_address(self) -> str:
        return f"unix://{self.host}" if self.kind == "unix" else f"tcp://{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        log.info("abci server closed address=%s", self.bound_address)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        log.info("abci connection opened conn=%d", conn)
        buf = bytearray()
        try:
            while True:
                chunk = await reader.read(READ_CHUNK)
                if not chunk:
                    break
                buf += chunk
                out, flush, consumed = self._process(buf, conn)
                if consumed:
                    del buf[:consumed]
                if out:
                    writer.write(out)
                if flush or writer.transport.get_write_buffer_size() > (1 << 20):
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except FramingError as error:
            log.error("abci framing error conn=%d: %s", conn, error.message)
        except asyncio.CancelledError:
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._tasks.discard(task)
            log.info("abci connection closed conn=%d", conn)

    def _process(self, buf: bytearray, conn: int) -> tuple[bytearray, bool, int]:
        """Answer every complete request in `buf`: (responses, saw a flush, bytes consumed)."""
        out = bytearray()
        flush = False
        pos = 0
        while True:
            header = decode_uvarint(buf, pos)
            if header is None:
                break
            length, start = header
            if length > MAX_MESSAGE_BYTES:
                raise FramingError(f"message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
            end = start + length
            if end > len(buf):
                break
            request = self.pb.Request()
            try:
                request.ParseFromString(bytes(buf[start:end]))
            except Exception as error:  # protobuf raises DecodeError (not a public base class)
                # CometBFT kills itself when the app closes a connection or answers
                # ResponseException, and Go does not check UTF-8 when it encodes a string: a
                # query path from a stranger with invalid UTF-8 must get a normal answer
                answer = self._undecodable_query(bytes(buf[start:end]))
                if answer is None:
                    raise FramingError(f"undecodable request ({error})") from None
                pos = end
                out += frame(answer)
                continue
            pos = end
            response = self._dispatch(request, conn)
            out += frame(response)
            if request.WhichOneof("value") == "flush":
                flush = True
        return out, flush, pos

    def _undecodable_query(self, data: bytes) -> Any:
        """A BAD_QUERY answer when `data` is a Request whose one field is a Query (a path that
        is not UTF-8); None for anything else."""
        number = self.pb.Request.DESCRIPTOR.fields_by_name["query"].number
        header = decode_uvarint(data, 0)
        if header is None or header[0] != (number << 3) | 2:
            return None
        size = decode_uvarint(data, header[1])
        if size is None or size[1] + size[0] != len(data):
            return None
        log.warning("query with a non-UTF-8 path or data field answered BAD_QUERY")
        return self.pb.Response(
            query=self.pb.ResponseQuery(code=41, log="query path is not UTF-8", codespace="planet")
        )

    def _dispatch(self, request: Any, conn: int) -> Any:
        try:
            return self.app.handle(request)
        except Exception as error:
            method = request.WhichOneof("value")
            body = getattr(request, method) if method else None
            height = getattr(body, "height", None)
            log.exception("abci handler failed conn=%d method=%s height=%s", conn, method, height)
            return self.pb.Response(
                exception=self.pb.ResponseException(error=f"{method}: {error!r}")
            )
