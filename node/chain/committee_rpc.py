"""A small async client for one CometBFT node's RPC (JSON-RPC over HTTP, plus its websocket).

Used by compute nodes, verifiers, the CLI and the committee benchmark to talk to the committee
chain. CometBFT v0.38 wire facts this module hides:

- JSON-RPC over POST: `tx` is base64, `abci_query`'s `data` is hex, 64-bit integers come back as
  decimal strings (converted to `int` here where a caller needs numbers).
- A tx's hash is the uppercase hex SHA-256 of its bytes (`tx_hash`).
- Events arrive on `/websocket` after a `subscribe` call with a query such as
  `tm.event='NewBlock'` or `tm.event='Tx' AND tx.hash='…'`.

Every network await runs under `asyncio.timeout`. Failures become `protocol.errors` types:
`UnavailableError` (node unreachable or too slow, with a hint), `RemoteError` (CometBFT answered
a JSON-RPC error), `TxRejectedError` (CheckTx or DeliverTx answered a non-zero code; carries
`code`, `log`, `codespace`, `tx_hash`).

    async with CommitteeRpc("http://127.0.0.1:27001") as rpc:
        result = await rpc.broadcast_tx_sync(tx_bytes)   # raises TxRejectedError on code != 0
        committed = await rpc.wait_for_tx(result.hash, timeout_s=10)
        answer = await rpc.abci_query("/node", b'{"key":"..."}')
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp

from protocol.canonical import loads_bounded
from protocol.errors import RemoteError, UnavailableError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
UNAVAILABLE_HINT = "is the committee running? try `planet committee status`"


class TxRejectedError(RemoteError):
    """The app refused a tx (CheckTx or FinalizeBlock result code != 0)."""

    def __init__(
        self, peer: str, *, code: int, log_text: str, codespace: str = "", tx_hash: str = ""
    ) -> None:
        where = f"{codespace}/{code}" if codespace else str(code)
        super().__init__(
            peer,
            f"tx_rejected_{code}",
            f"tx {tx_hash[:16]} rejected ({where}): {log_text or 'no log'}",
            http_status=400,
        )
        self.tx_code = code
        self.log_text = log_text
        self.codespace = codespace
        self.tx_hash = tx_hash


def tx_hash(tx: bytes) -> str:
    """CometBFT's hash of a tx: uppercase hex SHA-256 of its bytes."""
    return hashlib.sha256(tx).hexdigest().upper()


def _int(value: Any) -> int:
    """CometBFT writes 64-bit integers as strings; accept both."""
    return int(value) if value not in (None, "") else 0


@dataclass(frozen=True)
class BroadcastResult:
    """CheckTx's answer to broadcast_tx_sync (code 0: in the mempool), or just the hash (async)."""

    hash: str
    code: int = 0
    log: str = ""
    codespace: str = ""


@dataclass(frozen=True)
class TxResult:
    """A committed tx: the block it is in and the app's FinalizeBlock result for it."""

    hash: str
    height: int
    index: int
    code: int
    log: str
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class NodeStatus:
    """The parts of /status callers use (heights as ints, hashes as uppercase hex)."""

    node_id: str
    moniker: str
    network: str
    latest_block_height: int
    latest_block_hash: str
    latest_app_hash: str
    latest_block_time: str
    catching_up: bool
    voting_power: int
    raw: dict[str, Any] = field(repr=False, default_factory=dict)


class CommitteeRpc:
    """One CometBFT node's RPC. Use as `async with`, or pass in an aiohttp session you own."""

    def __init__(
        self,
        url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = session
        self._owns_session = session is None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False)
            )
        return self._session

    def _rpc_error(self, err: Any, what: str) -> RemoteError:
        """A JSON-RPC `error` member as a RemoteError coded `rpc_<code>`."""
        if not isinstance(err, dict):
            return RemoteError(self.url, "rpc_error", f"{what}: {err}")
        detail = err.get("data") or err.get("message") or str(err)
        return RemoteError(self.url, f"rpc_{err.get('code', 'error')}", f"{what}: {detail}")

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One JSON-RPC call; returns `result`, raises RemoteError/UnavailableError."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        # a read is asked once more when the server had closed the kept-alive connection it went
        # out on (ServerDisconnectedError: no answer came; the retry takes a new connection); a
        # broadcast is not, since the validator may have taken the tx before it hung up
        attempts = 1 if method.startswith("broadcast_") else 2
        for attempt in range(attempts):
            try:
                async with asyncio.timeout(self.timeout_s):
                    async with self._http().post(self.url, json=body) as response:
                        text = await response.text()
                break
            except TimeoutError as error:
                raise UnavailableError(
                    f"{self.url}: {method} got no answer within {self.timeout_s:g} s",
                    hint=UNAVAILABLE_HINT,
                ) from error
            except aiohttp.ClientError as error:
                if isinstance(error, aiohttp.ServerDisconnectedError) and attempt + 1 < attempts:
                    continue
                raise UnavailableError(
                    f"{self.url}: {method} failed: {error}", hint=UNAVAILABLE_HINT
                ) from error
        try:
            answer = loads_bounded(text)
        except ValueError as error:
            raise RemoteError(
                self.url,
                "bad_json",
                f"{method}: answer is not JSON: {text[:200]!r}",
                http_status=response.status,
            ) from error
        if not isinstance(answer, dict):
            raise RemoteError(self.url, "bad_json", f"{method}: answer is not an object")
        if answer.get("error"):
            raise self._rpc_error(answer["error"], method)
        if "result" not in answer:
            raise RemoteError(self.url, "bad_json", f"{method}: answer has no result")
        return answer["result"]

    # -- transactions -------------------------------------------------------------------------

    async def broadcast_tx_sync(self, tx: bytes, *, check: bool = True) -> BroadcastResult:
        """Submit `tx`, wait for CheckTx; with `check`, a non-zero code raises TxRejectedError."""
        result = await self.call("broadcast_tx_sync", {"tx": base64.b64encode(tx).decode()})
        answer = BroadcastResult(
            hash=str(result.get("hash") or tx_hash(tx)).upper(),
            code=_int(result.get("code")),
            log=str(result.get("log") or ""),
            codespace=str(result.get("codespace") or ""),
        )
        if check and answer.code != 0:
            raise TxRejectedError(
                self.url,
                code=answer.code,
                log_text=answer.log,
                codespace=answer.codespace,
                tx_hash=answer.hash,
            )
        return answer

    async def broadcast_tx_async(self, tx: bytes) -> BroadcastResult:
        """Submit `tx` without waiting for CheckTx (only the hash comes back)."""
        result = await self.call("broadcast_tx_async", {"tx": base64.b64encode(tx).decode()})
        return BroadcastResult(hash=str(result.get("hash") or tx_hash(tx)).upper())

    async def tx(self, hash_hex: str) -> TxResult | None:
        """The committed tx with this hash, or None when the node's index does not have it."""
        try:
            result = await self.call(
                "tx", {"hash": base64.b64encode(bytes.fromhex(hash_hex)).decode(), "prove": False}
            )
        except RemoteError as error:
            if "not found" in error.message:
                return None
            raise
        return _tx_result(hash_hex, result)

    # -- state --------------------------------------------------------------------------------

    async def abci_query(
        self, path: str, data: bytes = b"", *, height: int = 0, decode_json: bool = True
    ) -> Any:
        """Ask the app; returns its `value` decoded as JSON (or raw bytes with decode_json=False).

        A non-zero answer code raises RemoteError with the app's code and log.
        """
        params: dict[str, Any] = {"path": path, "data": data.hex(), "prove": False}
        if height:
            params["height"] = str(height)
        result = await self.call("abci_query", params)
        response = result.get("response", {})
        code = _int(response.get("code"))
        if code != 0:
            raise RemoteError(
                self.url, f"query_{code}", f"abci_query {path}: {response.get('log') or 'failed'}"
            )
        value = base64.b64decode(response.get("value") or "")
        if not decode_json:
            return value
        if not value:
            return None
        try:
            return loads_bounded(value)
        except ValueError as error:
            raise RemoteError(
                self.url, "bad_json", f"abci_query {path}: value is not JSON: {value[:100]!r}"
            ) from error

    async def abci_info(self) -> dict[str, Any]:
        """The app's own view: last_block_height (int) and last_block_app_hash (uppercase hex)."""
        response = (await self.call("abci_info")).get("response", {})
        app_hash = base64.b64decode(response.get("last_block_app_hash") or "").hex().upper()
        return {
            "data": response.get("data", ""),
            "version": response.get("version", ""),
            "app_version": _int(response.get("app_version")),
            "last_block_height": _int(response.get("last_block_height")),
            "last_block_app_hash": app_hash,
        }

    async def status(self) -> NodeStatus:
        result = await self.call("status")
        node = result.get("node_info", {})
        sync = result.get("sync_info", {})
        validator = result.get("validator_info", {})
        return NodeStatus(
            node_id=str(node.get("id", "")),
            moniker=str(node.get("moniker", "")),
            network=str(node.get("network", "")),
            latest_block_height=_int(sync.get("latest_block_height")),
            latest_block_hash=str(sync.get("latest_block_hash", "")),
            latest_app_hash=str(sync.get("latest_app_hash", "")),
            latest_block_time=str(sync.get("latest_block_time", "")),
            catching_up=bool(sync.get("catching_up", False)),
            voting_power=_int(validator.get("voting_power")),
            raw=result,
        )

    async def net_info(self) -> dict[str, Any]:
        return await self.call("net_info")

    async def block(self, height: int | None = None) -> dict[str, Any]:
        """`{block_id, block}` at `height` (latest when None)."""
        return await self.call("block", {"height": str(height)} if height else {})

    async def block_results(self, height: int | None = None) -> dict[str, Any]:
        return await self.call("block_results", {"height": str(height)} if height else {})

    async def blockchain(self, min_height: int, max_height: int) -> list[dict[str, Any]]:
        """Block metas (newest first, at most 20 per call) between the two heights."""
        result = await self.call(
            "blockchain", {"minHeight": str(min_height), "maxHeight": str(max_height)}
        )
        return list(result.get("block_metas") or [])

    async def block_hashes(self, min_height: int, max_height: int) -> dict[int, str]:
        """{height: block hash} for every height in [min_height, max_height] this node has."""
        hashes: dict[int, str] = {}
        top = max_height
        while top >= min_height:
            metas = await self.blockchain(max(min_height, top - 19), top)
            if not metas:
                break
            for meta in metas:
                hashes[_int(meta["header"]["height"])] = str(meta["block_id"]["hash"])
            top = min(hashes) - 1
        return hashes

    async def wait_for_height(self, height: int, *, timeout_s: float = 30.0) -> int:
        """Poll until the node's latest height is >= `height`; returns the height reached."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    current = (await self.status()).latest_block_height
                    if current >= height:
                        return current
                    await asyncio.sleep(0.1)
        except TimeoutError as error:
            raise UnavailableError(
                f"{self.url}: height {height} not reached within {timeout_s:g} s",
                hint="the chain may be halted: check `planet committee status`",
            ) from error

    # -- events -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def subscribe(self, query: str) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a websocket subscription; yields an async iterator over each event's `result`.

            async with rpc.subscribe("tm.event='NewBlock'") as events:
                async for event in events:
                    block = event["data"]["value"]["block"]

        The subscription is acknowledged before this returns, so nothing that happens after
        entering the block is missed. Iteration has no timeout of its own: wrap it in one.
        """
        ws_url = self.url.replace("http://", "ws://").replace("https://", "wss://") + "/websocket"
        request_id = next(self._ids)
        try:
            async with asyncio.timeout(self.timeout_s):
                ws = await self._http().ws_connect(
                    ws_url, max_msg_size=64 << 20, timeout=aiohttp.ClientWSTimeout(ws_close=2.0)
                )
                await ws.send_json(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "method": "subscribe",
                        "params": {"query": query},
                    }
                )
                ack = await ws.receive_json()
        except TimeoutError as error:
            raise UnavailableError(
                f"{ws_url}: subscribe got no answer within {self.timeout_s:g} s",
                hint=UNAVAILABLE_HINT,
            ) from error
        except (aiohttp.ClientError, TypeError, ValueError) as error:
            raise UnavailableError(
                f"{ws_url}: subscribe failed: {error}", hint=UNAVAILABLE_HINT
            ) from error
        try:
            if ack.get("error"):
                raise self._rpc_error(ack["error"], f"subscribe {query!r}")
            yield self._events(ws, query)
        finally:
            await ws.close()

    async def _events(
        self, ws: aiohttp.ClientWebSocketResponse, query: str
    ) -> AsyncIterator[dict[str, Any]]:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                if message.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSED):
                    break
                continue
            try:
                payload = loads_bounded(message.data)
            except ValueError as error:
                raise RemoteError(
                    self.url, "bad_json", f"subscription {query!r}: event is not JSON"
                ) from error
            if not isinstance(payload, dict):
                raise RemoteError(
                    self.url, "bad_json", f"subscription {query!r}: event is not an object"
                )
            if payload.get("error"):
                raise self._rpc_error(payload["error"], f"subscription {query!r}")
            result = payload.get("result") or {}
            if result.get("data"):
                yield result
        raise UnavailableError(
            f"{self.url}: websocket closed during subscription {query!r}", hint=UNAVAILABLE_HINT
        )

    async def wait_for_tx(self, hash_hex: str, *, timeout_s: float = 30.0) -> TxResult:
        """Wait until the tx with this hash is committed; returns its result (code may be != 0).

        Subscribes first, then looks the hash up in the node's index, so a tx committed before
        the call is found too.
        """
        hash_hex = hash_hex.upper()
        query = f"tm.event='Tx' AND tx.hash='{hash_hex}'"
        try:
            async with asyncio.timeout(timeout_s):
                async with self.subscribe(query) as events:
                    found = await self.tx(hash_hex)
                    if found is not None:
                        return found
                    async for event in events:
                        tx_result = event["data"]["value"]["TxResult"]
                        return _tx_result(hash_hex, tx_result)
        except TimeoutError as error:
            raise UnavailableError(
                f"{self.url}: tx {hash_hex[:16]} not committed within {timeout_s:g} s",
                hint="the chain may be halted or the tx dropped: check `planet committee status`",
            ) from error
        raise UnavailableError(
            f"{self.url}: subscription ended before tx {hash_hex[:16]}", hint=UNAVAILABLE_HINT
        )


def _tx_result(hash_hex: str, result: dict[str, Any]) -> TxResult:
    """A TxResult from either `/tx`'s answer or a Tx event's `TxResult`."""
    body = result.get("tx_result") or result.get("result") or {}
    return TxResult(
        hash=hash_hex.upper(),
        height=_int(result.get("height")),
        index=_int(result.get("index")),
        code=_int(body.get("code")),
        log=str(body.get("log") or ""),
        events=list(body.get("events") or []),
    )


def decode_block_txs(block: dict[str, Any]) -> list[bytes]:
    """The raw txs of a block as returned by `block` or carried by a NewBlock event."""
    txs = ((block.get("data") or {}).get("txs")) or []
    return [base64.b64decode(tx) for tx in txs]
