"""Fakes for the hosted gateway's credit tests: the real app, the real `engine.Generation` and
`failover.generate`, the real `HostedPayer` and the real `CircuitClient` payment path
(`prefill`, `send`, `_pay`), over nodes that exist only as the client's links — each link
records the credits its node was paid — and whose outputs the test releases one pass at a
time (`gateway_fakes.Script`: an item per pass, an exception fails the pass)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from node.client.circuit import CircuitClient
from node.client.costs import NodeStats
from node.client.credit_wallet import CreditWallet
from node.client.types import Hop
from node.gateway.credit_holds import CreditHold, CreditReserve
from node.gateway.credit_payer import HostedPayer
from node.gateway.router import Circuit, RoutableNode
from protocol.errors import UnavailableError
from protocol.paid_credits import PaidCredit
from tests.credit_fakes import fake_credits
from tests.unit.gateway_fakes import FakeEscrow, H, Script, build_gateway

SHARDS = 2


def credits(count: int, first: int = 0) -> list[PaidCredit]:
    """Distinct credits (never checked here: the nodes are fakes)."""
    return fake_credits(count, first)


class NodeLedger:
    """What each fake node was sent: credits (by URL) and frames."""

    def __init__(self) -> None:
        self.paid: dict[str, list[Any]] = {}
        self.frames = 0

    @property
    def credits(self) -> int:
        return sum(len(v) for v in self.paid.values())


class _Ws:
    def __init__(self, ledger: NodeLedger, url: str) -> None:
        self.ledger, self.url, self.closed = ledger, url, False

    async def send_json(self, message: dict[str, Any]) -> None:
        if message.get("op") == "pay":
            self.ledger.paid.setdefault(self.url, []).append(message["credit"])

    async def send_bytes(self, data: bytes) -> None:
        self.ledger.frames += 1


class _Link:
    def __init__(self, ledger: NodeLedger, url: str) -> None:
        self.ws = _Ws(ledger, url)
        self.opened: set[int] = set()


class PaidCircuit(CircuitClient):
    """A `CircuitClient` whose links are fakes: its own prefill, send and payments run as in
    production; each node's answer is the input plus 3 (FakeHead's two shards), released by
    the script."""

    def __init__(self, hops: Sequence[Hop], payer: HostedPayer, script: Script, ledger: NodeLedger):
        super().__init__(hops, hidden_size=H, payer=payer)
        self.links = [_Link(ledger, hop.url) for hop in hops]  # type: ignore[misc]
        self.script = script
        self._last: dict[int, np.ndarray] = {}

    async def open(
        self, secret: str, sid: int | None = None, *, wait: bool = True, prompt: Any = None
    ) -> int:
        sid = self.new_sid() if sid is None else sid
        self.outputs[sid] = asyncio.Queue()
        for link in self.links:
            link.opened.add(sid)
        return sid

    async def send(self, sid: int, start: int, hidden: np.ndarray, *args: Any, **kw: Any) -> None:
        await super().send(sid, start, hidden, *args, **kw)
        self._last[sid] = np.asarray(hidden)
        self.script.started.set()

    async def receive(
        self, sid: int, start: int, count: int, timeout_s: float | None = None
    ) -> np.ndarray:
        item = await self.script.queue.get()
        if isinstance(item, BaseException):
            self.blame[sid] = 0
            raise item
        return self._last[sid][:, -count:, :] + 3.0

    async def logits(self, head: Any, hidden_last: np.ndarray) -> np.ndarray:
        return head.logits_np(hidden_last)

    async def close(self, sid: int) -> None:
        await super().close(sid)
        self.script.closed.set()


class FakeRouter:
    """Circuits of `SHARDS` nodes; each lease gets fresh nodes (a failover's replacement)."""

    route = "cost"

    def __init__(self, script: Script, prices: list[int]) -> None:
        self.script = script
        self.price_list = prices
        self.prices: dict[str, int] = {}
        self.leases = 0
        self.costs = self
        self.http = None

    async def circuit(self, prompt: Any = None) -> Circuit:
        await self.script.admitted.wait()  # node slots
        self.leases += 1
        nodes = []
        for shard, price in enumerate(self.price_list):
            url = f"http://node-{self.leases}-{shard}"
            self.prices[url] = price
            nodes.append(RoutableNode(f"{self.leases:02d}{shard:02d}" * 16, url, shard))
        return Circuit(tuple(nodes))

    async def replace(
        self, circuit: Circuit, replace: Any, *, failed: bool = True, accused: Any = frozenset()
    ) -> Circuit:
        return await self.circuit()

    @contextlib.asynccontextmanager
    async def hold(self, circuit: Circuit) -> AsyncIterator[None]:
        yield

    def observe_circuit(self, urls: Any, pass_s: float) -> None:
        pass

    def get(self, url: str) -> NodeStats:  # the cost book's stats: no prefix advertised
        return NodeStats()

    def outpriced(self, circuit: Circuit) -> set[int]:
        return set()


class FakePool:
    def __init__(self, payer: HostedPayer, script: Script, ledger: NodeLedger) -> None:
        self.payer, self.script, self.ledger = payer, script, ledger

    @contextlib.asynccontextmanager
    async def use(self, hops: Sequence[Hop]) -> AsyncIterator[PaidCircuit]:
        yield PaidCircuit(hops, self.payer, self.script, self.ledger)

    async def close(self) -> None:
        pass


class HoldSpy:
    """Every hold the gateway's reserve hands out, and how often each was released."""

    def __init__(self, reserve: CreditReserve) -> None:
        self.holds: list[CreditHold] = []
        self.releases: list[bool] = []
        original = reserve.hold

        def hold() -> CreditHold:
            made = original()
            self.holds.append(made)
            release = made.release

            def counted() -> bool:
                first = release()
                self.releases.append(first)
                return first

            made.release = counted  # type: ignore[method-assign]
            return made

        reserve.hold = hold  # type: ignore[method-assign]


def paid_gateway(
    tmp_path: Path,
    http: aiohttp.ClientSession,
    escrow: FakeEscrow,
    script: Script,
    *,
    prices: list[int],
    wallet_credits: int,
) -> tuple[Any, HostedPayer, NodeLedger, FakeRouter, HoldSpy]:
    """The real hosted gateway app's Gateway, paying fake nodes from a real credit wallet."""
    wallet = CreditWallet(tmp_path / "gateway-credits.json")
    wallet.add(credits(wallet_credits))
    gateway = build_gateway(tmp_path, http, escrow)
    router = FakeRouter(script, prices)
    payer = HostedPayer(wallet, router.prices, min_positions=1)
    ledger = NodeLedger()
    gateway.router = router  # type: ignore[assignment]
    gateway.payer = payer
    gateway.circuits = FakePool(payer, script, ledger)  # type: ignore[assignment]
    gateway.config = replace(gateway.config, attempts=2)
    return gateway, payer, ledger, router, HoldSpy(payer.reserve)


def fail_pass() -> UnavailableError:
    return UnavailableError("node http://node stream failed: reset")
