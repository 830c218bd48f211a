"""In-process fakes for the gateway's unit tests: a client head, an escrow, the committee, a
node source, a scripted generation (tokens released one by one by the test), a raw HTTP client
that can hang up at any byte, and the Gateway built from them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from node.gateway.app import Gateway, ModelInfo
from node.gateway.config import GatewayConfig
from node.gateway.engine import TokenEvent
from node.gateway.escrow_reads import OnChainBalance, OnChainDeposit
from node.gateway.payments import PaymentDesk
from node.gateway.router import Router
from protocol.eip712 import address_of
from protocol.payment import payment_domain

H, V = 8, 50
MODEL_HASH = "sha256:" + "0" * 64  # what FakeShard reports
MODEL_ID = bytes(32)
USER = bytes.fromhex("31" * 32)
GATEWAY_KEY = bytes.fromhex("32" * 32)
GATEWAY = address_of(GATEWAY_KEY)
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = payment_domain(31337, ESCROW)
PRICE = 1000
NODE_KEYS = ["a1" * 32, "b2" * 32]
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
PROMPT_TOKENS = 3  # FakeHead.chat_ids


class FakeHead:
    """Token t embeds as t in every channel; the two fake shards add 1 and 2, so greedy
    decoding from a last token t gives t+3, t+6, ...; text: one letter per token."""

    eos_token_ids = frozenset({V - 1})
    vocab_size = V
    hidden_size = H
    context_length = 64

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return [1, 2, 3]

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 10 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.token_text(i) for i in ids)

    def token_text(self, token: int) -> str:
        return chr(ord("a") + token % 26)

    def embed_np(self, ids: Sequence[int]) -> np.ndarray:
        return np.repeat(np.asarray(ids, dtype=np.float32)[None, :, None], H, axis=2)

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        logits = np.zeros(V, dtype=np.float32)
        logits[round(float(hidden_last[0])) % V] = 10.0
        return logits

    def logits_batch_np(self, hidden_last: np.ndarray) -> np.ndarray:
        return np.stack([self.logits_np(row) for row in hidden_last])


class FakeEscrow:
    """Deposits and prepaid balances by hand; counts the reads."""

    def __init__(self) -> None:
        self.deposits: dict[bytes, OnChainDeposit] = {}
        self.balances: dict[str, OnChainBalance] = {}
        self.reads = 0

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        self.reads += 1
        await asyncio.sleep(0)
        return self.deposits.get(query_id, OnChainDeposit("0x" + "0" * 40, 0, 0, None))

    async def prepaid(self, payer: str) -> OnChainBalance:
        self.reads += 1
        await asyncio.sleep(0)
        return self.balances.get(payer, OnChainBalance(0, 0))


class FakeSource:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


class FakeCommittee:
    async def abci_query(self, path: str) -> Any:
        return {"routable_per_shard": [1, 1], "status": "degraded", "shards": 2}


def build_gateway(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    escrow: FakeEscrow,
    source: FakeSource | None = None,
    more_models: Sequence[Any] = (),
    **desk_options: Any,
) -> Gateway:
    router = Router(
        source or FakeSource([]),
        model_hash=MODEL_HASH,
        shard_layers=[(0, 2), (2, 4)],
        http=http,
        refresh_s=0,
        public_only=False,  # in-process fakes on loopback
    )
    config = GatewayConfig(
        evm_rpc="http://x",
        deployment=tmp_path / "d.json",
        committee_rpc="http://x",
        manifest=tmp_path / "m.json",
        wallet=tmp_path / "wallet.json",
        price_wei_per_token=PRICE,
        max_body_bytes=64 * 1024,
    )
    desk = PaymentDesk(
        escrow,
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL_ID,
        price_wei_per_token=PRICE,
        receipts_path=tmp_path / "receipts.jsonl",
        **desk_options,
    )
    return Gateway(
        config=config,
        model=ModelInfo("fake-model", MODEL_HASH, MODEL_ID, 2),
        head=FakeHead(),
        router=router,
        desk=desk,
        committee=FakeCommittee(),
        http=http,
        chain_id=31337,
        escrow=ESCROW,
        more_models=more_models,
    )


# --- a generation the test drives token by token ----------------------------------------------

END = object()


class FakeCircuit:
    keys = tuple(NODE_KEYS)
    nodes = ()


class Script:
    """What the next question's nodes do: tokens, a failure, or the end, when the test says."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.admitted = asyncio.Event()  # the question got its circuit (clear it: queued)
        self.admitted.set()
        self.stop_at_max = True  # False: after max_tokens, wait for end() (a slow last step)
        self.started = asyncio.Event()  # the question's prompt went to its circuit
        self.closed = asyncio.Event()  # the gateway stopped asking the nodes

    def tokens(self, *tokens: int) -> None:
        for token in tokens:
            self.queue.put_nowait(token)

    def fail(self, error: BaseException) -> None:
        self.queue.put_nowait(error)

    def end(self) -> None:
        self.queue.put_nowait(END)


class ScriptedGeneration:
    """Stands in for `engine.Generation` (monkeypatched into node.gateway.app)."""

    script: Script

    def __init__(
        self, router: Any, head: Any, circuits: Any, prompt_ids: Sequence[int], **options: Any
    ) -> None:
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = int(options["max_tokens"])
        self.echo = bool(options.get("echo"))
        self.circuit: FakeCircuit | None = None
        self.delivered = False
        self.started = False
        self.count = 0

    async def events(self) -> Any:
        await self.script.admitted.wait()  # waiting for node slots
        self.circuit = FakeCircuit()
        self.started = True
        self.script.started.set()
        try:
            while True:
                item = await self.script.queue.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.count += 1
                yield TokenEvent(int(item), None, ())
                if self.script.stop_at_max and self.count >= self.max_tokens:
                    return
        finally:
            self.script.closed.set()

    async def echoed_events(self) -> list[TokenEvent]:
        return []

    @property
    def finished_by_length(self) -> bool:
        return self.count >= self.max_tokens


# --- a raw HTTP client that hangs up where the test says --------------------------------------


class RawClient:
    """One HTTP/1.1 request on its own socket; `hang_up()` resets the connection (RST)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.received = b""

    @classmethod
    async def post(cls, url: Any, path: str, body: dict[str, Any], api_key: str) -> RawClient:
        reader, writer = await asyncio.open_connection(url.host, url.port)
        raw = json.dumps(body).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: Bearer {api_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        await writer.drain()
        return cls(reader, writer)

    async def read_events(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Read until `count` SSE data events arrived; their JSON."""
        async with asyncio.timeout(timeout):
            while self.received.count(b"data: ") < count:
                chunk = await self.reader.read(65536)
                if not chunk:
                    break
                self.received += chunk
        return self.events()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for part in self.received.split(b"data: ")[1:]:
            line = part.split(b"\n", 1)[0].strip()
            if line and line != b"[DONE]":
                out.append(json.loads(line))
        return out

    def hang_up(self) -> None:
        self.writer.transport.abort()
