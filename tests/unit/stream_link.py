"""A raw client link to one node's `GET /v1/stream`, for tests that drive a node frame by frame
(what CircuitClient does, minus the circuit): open a session with a capability, send frames,
read the frame or the named refusal that comes back."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import numpy as np

from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.header import FrameHeader, pack_frame, parse_frame

TIMEOUT_S = 10.0


class Refused(Exception):
    """The node answered a named error control message."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('code')}: {body.get('message')}")
        self.code = str(body.get("code"))
        self.sid = body.get("sid")
        self.body = body


class Link:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, hidden_size: int) -> None:
        self.ws = ws
        self.hidden_size = hidden_size

    async def open(
        self, sid: int, capability: str, shard: int, *, feed: str | None = None
    ) -> dict[str, Any]:
        """Open a last-hop session (next: null); the node's answer (`opened`), else Refused."""
        body = {"op": "open", "sid": sid, "session": capability, "shard": shard}
        await self.ws.send_json({**body, "feed": feed, "next": None})
        return await self.control()

    async def close(self, sid: int) -> dict[str, Any]:
        await self.ws.send_json({"op": "close", "sid": sid})
        return await self.control()

    async def send(
        self,
        sid: int,
        start: int,
        hidden: np.ndarray,
        *,
        dtype: str = "float32",
        codec: str = "raw",
        last_only: bool = False,
    ) -> None:
        header = FrameHeader(sid, start, int(hidden.shape[1]), dtype, codec, last_only)
        await self.ws.send_bytes(pack_frame(header, encode_body(hidden, dtype, codec)))

    async def message(self, timeout: float = TIMEOUT_S) -> aiohttp.WSMessage:
        return await self.ws.receive(timeout=timeout)

    async def control(self, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """The next message, a control answer; Refused if it names an error."""
        message = await self.message(timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise AssertionError(f"expected a control message, got {message.type}")
        body = json.loads(message.data)
        if body.get("op") == "error":
            raise Refused(body)
        return body

    async def frame(self, timeout: float = TIMEOUT_S) -> tuple[FrameHeader, np.ndarray]:
        """The next message, an output frame (decoded); Refused if the node named an error."""
        message = await self.message(timeout)
        if message.type == aiohttp.WSMsgType.TEXT:
            body = json.loads(message.data)
            raise Refused(body) if body.get("op") == "error" else AssertionError(body)
        if message.type != aiohttp.WSMsgType.BINARY:
            raise AssertionError(f"expected a frame, got {message.type}")
        header, data = parse_frame(message.data, self.hidden_size, 1 << 20)
        shape = (1, header.count, self.hidden_size)
        return header, decode_values(header.dtype, header.codec, shape, data)

    async def forward(
        self, sid: int, start: int, hidden: np.ndarray, **kw: Any
    ) -> tuple[FrameHeader, np.ndarray]:
        """Send one frame and read its output (or Refused)."""
        await self.send(sid, start, hidden, **kw)
        return await self.frame()
