"""The ABCI socket server: uvarint framing, pipelining, Flush, several connections, errors.

Driven by an in-process asyncio client over a unix socket (and one TCP port in 26600-26699).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from abci_app.app import CommitteeApp
from abci_app.encoding import FramingError, decode_uvarint, encode_uvarint
from abci_app.proto import abci_pb
from abci_app.server import AbciServer, frame
from tests.committee_chain import Chain

pytestmark = pytest.mark.unit

pb = abci_pb()


class Client:
    """Minimal ABCI socket client: write framed requests, read framed responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = bytearray()

    @classmethod
    async def connect(cls, address: str) -> Client:
        if address.startswith("unix://"):
            return cls(*await asyncio.open_unix_connection(address[len("unix://") :]))
        host, port = address[len("tcp://") :].rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, *requests: Any) -> None:
        self.writer.write(b"".join(frame(r) for r in requests))
        await self.writer.drain()

    async def recv(self) -> Any:
        while True:
            header = decode_uvarint(self.buf, 0)
            if header is not None and header[1] + header[0] <= len(self.buf):
                length, start = header
                response = pb.Response()
                response.ParseFromString(bytes(self.buf[start : start + length]))
                del self.buf[: start + length]
                return response
            chunk = await asyncio.wait_for(self.reader.read(65536), 5)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk

    async def close(self) -> None:
        self.writer.close()


class Exploding:
    def handle(self, request: Any) -> Any:
        if request.WhichOneof("value") == "echo":
            raise RuntimeError("boom")
        return pb.Response(flush=pb.ResponseFlush())


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    srv = AbciServer(CommitteeApp(Chain().machine), f"unix://{tmp_path / 'abci.sock'}")
    await srv.start()
    yield srv
    await srv.close()


def test_abci_uvarint_roundtrip_and_partial() -> None:
    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        encoded = encode_uvarint(value)
        assert decode_uvarint(encoded, 0) == (value, len(encoded))
        assert decode_uvarint(encoded[:-1], 0) is None
    assert encode_uvarint(300) == b"\xac\x02"
    with pytest.raises(FramingError):
        decode_uvarint(b"\xff" * 11, 0)


async def test_abci_server_pipelined_requests_answered_in_order(server: AbciServer) -> None:
    client = await Client.connect(server.bound_address)
    await client.send(
        pb.Request(echo=pb.RequestEcho(message="a")),
        pb.Request(info=pb.RequestInfo()),
        pb.Request(echo=pb.RequestEcho(message="b")),
        pb.Request(check_tx=pb.RequestCheckTx(tx=b"{" + b"x" * 300)),
        pb.Request(flush=pb.RequestFlush()),
    )
    kinds = []
    for _ in range(5):
        response = await client.recv()
        kinds.append(response.WhichOneof("value"))
        if kinds[-1] == "echo":
            kinds[-1] += ":" + response.echo.message
        if kinds[-1] == "check_tx":
            assert response.check_tx.code == 1 and response.check_tx.codespace == "planet"
        if kinds[-1] == "info":
            assert (
                response.info.last_block_height == 0
                and len(response.info.last_block_app_hash) == 32
            )
    assert kinds == ["echo:a", "info", "echo:b", "check_tx", "flush"]
    await client.close()


async def test_abci_server_request_split_across_writes(server: AbciServer) -> None:
    client = await Client.connect(server.bound_address)
    data = frame(pb.Request(echo=pb.RequestEcho(message="x" * 200))) + frame(
        pb.Request(flush=pb.RequestFlush())
    )
    for i in range(len(data)):
        client.writer.write(data[i : i + 1])
        await client.writer.drain()
    assert (await client.recv()).echo.message == "x" * 200
    assert (await client.recv()).WhichOneof("value") == "flush"
    await client.close()


async def test_abci_server_four_connections_served_independently(server: AbciServer) -> None:
    clients = [await Client.connect(server.bound_address) for _ in range(4)]
    for i, client in enumerate(clients):
        await client.send(
            pb.Request(echo=pb.RequestEcho(message=str(i))), pb.Request(flush=pb.RequestFlush())
        )
    for i, client in reversed(list(enumerate(clients))):
        assert (await client.recv()).echo.message == str(i)
        assert (await client.recv()).WhichOneof("value") == "flush"
        await client.close()


async def test_abci_server_garbage_closes_only_that_connection(server: AbciServer) -> None:
    bad = await Client.connect(server.bound_address)
    good = await Client.connect(server.bound_address)
    bad.writer.write(b"\xff" * 12)
    await bad.writer.drain()
    with pytest.raises(ConnectionError):
        await bad.recv()
    await good.send(pb.Request(echo=pb.RequestEcho(message="still here")))
    assert (await good.recv()).echo.message == "still here"
    await good.close()


async def test_abci_server_handler_error_answers_exception(tmp_path: Path) -> None:
    srv = AbciServer(Exploding(), f"unix://{tmp_path / 'x.sock'}")
    await srv.start()
    client = await Client.connect(srv.bound_address)
    await client.send(
        pb.Request(echo=pb.RequestEcho(message="a")), pb.Request(flush=pb.RequestFlush())
    )
    response = await client.recv()
    assert response.WhichOneof("value") == "exception" and "boom" in response.exception.error
    assert (await client.recv()).WhichOneof("value") == "flush"
    await client.close()
    await srv.close()


def free_port() -> int:
    for port in range(26690, 26700):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 26690-26699")


async def test_abci_server_tcp_full_block_cycle() -> None:
    chain = Chain()
    srv = AbciServer(CommitteeApp(chain.machine), f"tcp://127.0.0.1:{free_port()}")
    await srv.start()
    client = await Client.connect(srv.bound_address)
    await client.send(
        pb.Request(prepare_proposal=pb.RequestPrepareProposal(height=1, max_tx_bytes=1 << 20)),
        pb.Request(process_proposal=pb.RequestProcessProposal(height=1)),
        pb.Request(finalize_block=pb.RequestFinalizeBlock(height=1, hash=b"\x01" * 32)),
        pb.Request(commit=pb.RequestCommit()),
        pb.Request(query=pb.RequestQuery(path="/params")),
        pb.Request(flush=pb.RequestFlush()),
    )
    responses = [await client.recv() for _ in range(6)]
    assert responses[1].process_proposal.status == pb.ResponseProcessProposal.ACCEPT
    app_hash = responses[2].finalize_block.app_hash
    assert len(app_hash) == 32
    assert responses[4].query.code == 0 and b'"height":1' in responses[4].query.value
    assert chain.state.app_hash == app_hash
    await client.close()
    await srv.close()
