"""CommitteeRpc against an in-process fake of CometBFT's JSON-RPC and websocket (aiohttp).

The fake speaks the v0.38 wire format (base64 txs, hex query data, 64-bit ints as strings);
the real CometBFT is exercised by tests/e2e/test_committee_network.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node.chain.committee_rpc import CommitteeRpc, TxRejectedError, decode_block_txs, tx_hash
from protocol.errors import RemoteError, UnavailableError

pytestmark = pytest.mark.unit


class FakeComet:
    """Records calls; answers from `results` (method -> result or callable(params))."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results: dict[str, Any] = {}
        self.errors: dict[str, dict[str, Any]] = {}
        self.delay_s = 0.0
        self.subscriptions: list[str] = []
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.subscribe_error: dict[str, Any] | None = None
        self.hang_ups = 0  # the next requests answered by closing the connection

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/", self.rpc)
        app.router.add_get("/websocket", self.websocket)
        return app

    async def rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        method, params = body["method"], body["params"]
        self.calls.append((method, params))
        if self.hang_ups:
            self.hang_ups -= 1
            assert request.transport is not None
            request.transport.close()  # the client sees ServerDisconnectedError
            return web.Response()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": body["id"]}
        if method in self.errors:
            answer["error"] = self.errors[method]
        else:
            result = self.results[method]
            answer["result"] = result(params) if callable(result) else result
        return web.json_response(answer)

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        message = await ws.receive_json()
        self.subscriptions.append(message["params"]["query"])
        if self.subscribe_error:
            await ws.send_json(
                {"jsonrpc": "2.0", "id": message["id"], "error": self.subscribe_error}
            )
            return ws
        await ws.send_json({"jsonrpc": "2.0", "id": message["id"], "result": {}})

        async def forward() -> None:
            while True:
                event = await self.events.get()
                await ws.send_json({"jsonrpc": "2.0", "id": message["id"], "result": event})

        sender = asyncio.create_task(forward())
        async for _ in ws:  # like CometBFT, keep reading so a client's close is answered
            pass
        sender.cancel()
        return ws


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeComet, str]:
    comet = FakeComet()
    server = await aiohttp_server(comet.app())
    return comet, str(server.make_url("")).rstrip("/")


def test_tx_hash_is_uppercase_sha256() -> None:
    assert tx_hash(b"abc") == ("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD")


async def test_broadcast_tx_sync_accepted_sends_base64_and_returns_hash(fake: Any) -> None:
    comet, url = fake
    tx = b"\x00\x01payload"
    comet.results["broadcast_tx_sync"] = {
        "code": 0,
        "data": "",
        "log": "",
        "codespace": "",
        "hash": tx_hash(tx),
    }
    async with CommitteeRpc(url) as rpc:
        result = await rpc.broadcast_tx_sync(tx)
    assert comet.calls == [("broadcast_tx_sync", {"tx": base64.b64encode(tx).decode()})]
    assert result.hash == tx_hash(tx)
    assert result.code == 0


async def test_broadcast_tx_sync_rejected_raises_with_code_and_log(fake: Any) -> None:
    comet, url = fake
    comet.results["broadcast_tx_sync"] = {
        "code": 7,
        "log": "bad nonce",
        "codespace": "planet",
        "hash": "AB" * 32,
    }
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(TxRejectedError) as raised:
            await rpc.broadcast_tx_sync(b"tx")
        unchecked = await rpc.broadcast_tx_sync(b"tx", check=False)
    assert raised.value.tx_code == 7
    assert raised.value.log_text == "bad nonce"
    assert "bad nonce" in raised.value.message
    assert isinstance(raised.value, RemoteError)
    assert unchecked.code == 7


async def test_abci_query_sends_hex_and_decodes_json_value(fake: Any) -> None:
    comet, url = fake
    value = base64.b64encode(json.dumps({"nodes": 3}).encode()).decode()
    comet.results["abci_query"] = {
        "response": {"code": 0, "log": "", "value": value, "height": "12"}
    }
    async with CommitteeRpc(url) as rpc:
        answer = await rpc.abci_query("/nodes", b'{"a":1}', height=12)
    assert answer == {"nodes": 3}
    assert comet.calls[0][1] == {
        "path": "/nodes",
        "data": b'{"a":1}'.hex(),
        "prove": False,
        "height": "12",
    }


async def test_abci_query_app_error_raises_remote_error_with_log(fake: Any) -> None:
    comet, url = fake
    comet.results["abci_query"] = {"response": {"code": 4, "log": "unknown path"}}
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(RemoteError) as raised:
            await rpc.abci_query("/nope")
    assert raised.value.code == "query_4"
    assert "unknown path" in raised.value.message


async def test_call_jsonrpc_error_raises_remote_error(fake: Any) -> None:
    comet, url = fake
    comet.errors["block"] = {
        "code": -32603,
        "message": "Internal error",
        "data": "height 99 must be less than or equal to the current",
    }
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(RemoteError) as raised:
            await rpc.block(99)
    assert raised.value.code == "rpc_-32603"
    assert "height 99" in raised.value.message


async def test_call_unreachable_node_raises_unavailable_with_hint(unused_tcp_port: int) -> None:
    async with CommitteeRpc(f"http://127.0.0.1:{unused_tcp_port}", timeout_s=2) as rpc:
        with pytest.raises(UnavailableError) as raised:
            await rpc.status()
    assert "planet committee status" in (raised.value.hint or "")


async def test_call_slow_node_times_out_as_unavailable(fake: Any) -> None:
    comet, url = fake
    comet.results["status"] = {}
    comet.delay_s = 2.0
    async with CommitteeRpc(url, timeout_s=0.2) as rpc:
        with pytest.raises(UnavailableError) as raised:
            await rpc.status()
    assert "within 0.2 s" in raised.value.message


async def test_status_string_integers_become_ints(fake: Any) -> None:
    comet, url = fake
    comet.results["status"] = {
        "node_info": {"id": "ab", "moniker": "validator0", "network": "planet-committee"},
        "sync_info": {
            "latest_block_height": "42",
            "latest_block_hash": "AA",
            "latest_app_hash": "BB",
            "latest_block_time": "t",
            "catching_up": False,
        },
        "validator_info": {"voting_power": "10"},
    }
    async with CommitteeRpc(url) as rpc:
        status = await rpc.status()
    assert status.latest_block_height == 42
    assert status.voting_power == 10
    assert status.latest_app_hash == "BB"
    assert status.catching_up is False


async def test_abci_info_decodes_app_hash_to_hex(fake: Any) -> None:
    comet, url = fake
    comet.results["abci_info"] = {
        "response": {
            "last_block_height": "7",
            "last_block_app_hash": base64.b64encode(b"\x01\xab").decode(),
        }
    }
    async with CommitteeRpc(url) as rpc:
        info = await rpc.abci_info()
    assert info["last_block_height"] == 7
    assert info["last_block_app_hash"] == "01AB"


async def test_block_hashes_pages_through_blockchain(fake: Any) -> None:
    comet, url = fake

    def blockchain(params: dict[str, str]) -> dict[str, Any]:
        low, high = int(params["minHeight"]), int(params["maxHeight"])
        metas = [
            {"header": {"height": str(h)}, "block_id": {"hash": f"H{h}"}}
            for h in range(high, max(low, high - 19) - 1, -1)
        ]
        return {"last_height": "45", "block_metas": metas}

    comet.results["blockchain"] = blockchain
    async with CommitteeRpc(url) as rpc:
        hashes = await rpc.block_hashes(1, 45)
    assert hashes == {h: f"H{h}" for h in range(1, 46)}
    assert len(comet.calls) == 3


async def test_wait_for_tx_committed_later_returns_event_result(fake: Any) -> None:
    comet, url = fake
    comet.errors["tx"] = {"code": -32603, "message": "Internal error", "data": "tx (AB) not found"}
    hash_hex = "ab" * 32
    async with CommitteeRpc(url) as rpc:
        waiter = asyncio.create_task(rpc.wait_for_tx(hash_hex, timeout_s=5))
        while not comet.subscriptions or not any(c[0] == "tx" for c in comet.calls):
            await asyncio.sleep(0.01)
        await comet.events.put(
            {
                "query": comet.subscriptions[0],
                "data": {
                    "type": "tendermint/event/Tx",
                    "value": {
                        "TxResult": {
                            "height": "9",
                            "index": 2,
                            "tx": "",
                            "result": {"code": 0, "log": "ok", "events": []},
                        }
                    },
                },
            }
        )
        result = await waiter
    assert comet.subscriptions == [f"tm.event='Tx' AND tx.hash='{hash_hex.upper()}'"]
    assert (result.height, result.index, result.code, result.log) == (9, 2, 0, "ok")


async def test_wait_for_tx_already_committed_returns_from_index(fake: Any) -> None:
    comet, url = fake
    comet.results["tx"] = {
        "hash": "CD" * 32,
        "height": "4",
        "index": 0,
        "tx_result": {"code": 3, "log": "rejected in block"},
    }
    async with CommitteeRpc(url) as rpc:
        result = await rpc.wait_for_tx("cd" * 32, timeout_s=5)
    assert (result.height, result.code, result.log) == (4, 3, "rejected in block")


async def test_wait_for_tx_never_committed_times_out(fake: Any) -> None:
    comet, url = fake
    comet.errors["tx"] = {"code": -32603, "message": "x", "data": "tx (EF) not found"}
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(UnavailableError) as raised:
            await rpc.wait_for_tx("ef" * 32, timeout_s=0.3)
    assert "not committed within 0.3 s" in raised.value.message


async def test_subscribe_refused_raises_remote_error(fake: Any) -> None:
    comet, url = fake
    comet.subscribe_error = {
        "code": -32603,
        "message": "Internal error",
        "data": "max_subscriptions_per_client 5 reached",
    }
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(RemoteError) as raised:
            async with rpc.subscribe("tm.event='NewBlock'"):
                pass
    assert "max_subscriptions_per_client" in raised.value.message


async def test_subscribe_new_block_yields_blocks_with_txs(fake: Any) -> None:
    comet, url = fake
    txs = [b"a=1", b"b=2"]
    async with CommitteeRpc(url) as rpc, rpc.subscribe("tm.event='NewBlock'") as events:
        await comet.events.put(
            {
                "data": {
                    "type": "tendermint/event/NewBlock",
                    "value": {
                        "block": {
                            "header": {"height": "5"},
                            "data": {"txs": [base64.b64encode(t).decode() for t in txs]},
                        }
                    },
                }
            }
        )
        async with asyncio.timeout(5):
            event = await anext(aiter(events))
    block = event["data"]["value"]["block"]
    assert decode_block_txs(block) == txs


async def test_client_uses_given_session_and_leaves_it_open(fake: Any) -> None:
    comet, url = fake
    comet.results["net_info"] = {"n_peers": "3"}
    async with aiohttp.ClientSession() as session:
        async with CommitteeRpc(url, session=session) as rpc:
            assert (await rpc.net_info())["n_peers"] == "3"
        assert not session.closed


async def test_a_read_is_asked_again_once_when_the_server_hung_up(fake: Any) -> None:
    comet, url = fake
    comet.results["abci_query"] = {"response": {"code": 0, "value": ""}}
    comet.hang_ups = 1
    async with CommitteeRpc(url) as rpc:
        assert await rpc.call("abci_query", {"path": "/params"}) == comet.results["abci_query"]
    assert [method for method, _ in comet.calls] == ["abci_query", "abci_query"]
    comet.hang_ups = 2  # twice: unavailable, by name
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(UnavailableError, match="abci_query failed"):
            await rpc.call("abci_query", {"path": "/params"})


async def test_a_broadcast_is_not_sent_again_when_the_server_hung_up(fake: Any) -> None:
    comet, url = fake
    comet.hang_ups = 1
    async with CommitteeRpc(url) as rpc:
        with pytest.raises(UnavailableError, match="broadcast_tx_sync failed"):
            await rpc.broadcast_tx_sync(b"tx")
    assert [method for method, _ in comet.calls] == ["broadcast_tx_sync"]
