"""What the gateway reads from QueryEscrow, and the bound on how much a stranger can make it read.

Two reads pay for everything (`EscrowReader`):

    deposit(query_id) → OnChainDeposit     one `depositOf(queryId)` eth_call: depositor, amount,
                                           status, deposit time, model and the gateway the
                                           deposit was made for (docs/contracts.md)
    prepaid(payer)    → OnChainBalance     one `prepaidOf(payer, this gateway)` eth_call: what
                                           the payer holds for this gateway, withdrawal time

`ChainEscrow` does them over the escrow binding (blocking web3, in a thread): never a log scan.

Any well-formed key makes the gateway read the chain before it can refuse, so `BoundedReads`
sits in front of the reader:

- positive answers are cached while a question may use them (`positive_ttl_s`), negative ones
  (no deposit, an empty balance) briefly (`negative_ttl_s`): a flood of one fake key costs one
  read per interval;
- concurrent reads of the same thing share one call;
- at most `max_concurrent` reads run at once and at most `max_waiting` wait; beyond that the
  request is refused at once with 503 `chain_busy` (a flood of distinct well-formed fake keys
  cannot fan out unbounded RPC calls, nor queue without bound).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from node.gateway.errors import NoCircuit
from protocol.errors import PlanetError

FUNDED = 1
STATUS_NAMES = {0: "none", 1: "funded", 2: "settled", 3: "reclaimed", 4: "refunded"}
CACHE_ENTRIES = 4096  # per cache; the oldest go first
POSITIVE_TTL_S = 2.0  # a funded deposit or balance is read again after this long


@dataclass(frozen=True, slots=True)
class OnChainDeposit:
    user: str  # checksummed depositor
    amount: int  # wei the query still holds
    status: int  # 0 None, 1 Funded, 2 Settled, 3 Reclaimed, 4 Refunded
    model_id: bytes | None  # the model the deposit pays for (None: unknown)
    refund_at: int = 0  # unix s when the depositor may take an unsettled deposit back (0: unknown)
    gateway: str | None = None  # the gateway it was made for (None: not known to the reader)

    @property
    def funded(self) -> bool:
        return self.status == FUNDED


@dataclass(frozen=True, slots=True)
class OnChainBalance:
    balance: int  # prepaid wei the payer holds for this gateway (`QueryEscrow.prepaidOf`)
    withdrawable_at: int  # 0: no withdrawal requested


class EscrowReader(Protocol):
    async def deposit(self, query_id: bytes) -> OnChainDeposit: ...

    async def prepaid(self, payer: str) -> OnChainBalance: ...


class ChainEscrow:
    """QueryEscrow read through `node.chain.evm.account.PlanetChain`'s escrow binding (blocking
    web3 in a thread) as the gateway `gateway`."""

    def __init__(self, chain: Any, gateway: str) -> None:
        self.escrow = chain.escrow
        self.gateway = gateway
        self._refund_timeout: int | None = None
        self.calls = 0  # eth_calls made (tests, benches)

    def refund_timeout(self) -> int:
        if self._refund_timeout is None:
            self.calls += 1
            self._refund_timeout = self.escrow.refund_timeout()
        return self._refund_timeout

    def _read(self, query_id: bytes) -> OnChainDeposit:
        self.calls += 1
        state = self.escrow.deposit_of(query_id)
        deposited_at = state["deposited_at"]
        refund_at = deposited_at + self.refund_timeout() if deposited_at else 0
        return OnChainDeposit(
            state["user"],
            state["amount"],
            state["status"],
            state["model_id"],
            refund_at,
            str(state["gateway"]),
        )

    def _balance(self, payer: str) -> OnChainBalance:
        self.calls += 1
        state = self.escrow.prepaid_of(payer, self.gateway)
        return OnChainBalance(state["balance"], state["withdrawable_at"])

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        try:
            return await asyncio.to_thread(self._read, query_id)
        except PlanetError as error:
            raise NoCircuit(
                "chain_unavailable", f"cannot read the deposit from the EVM chain: {error}"
            ) from None

    async def prepaid(self, payer: str) -> OnChainBalance:
        try:
            return await asyncio.to_thread(self._balance, payer)
        except PlanetError as error:
            raise NoCircuit(
                "chain_unavailable", f"cannot read the balance from the EVM chain: {error}"
            ) from None


K = TypeVar("K")
V = TypeVar("V")


class _Cache(Generic[K, V]):
    """Answers by key with their expiry (monotonic seconds); bounded, oldest out first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= self._clock():
            del self._items[key]
            return None
        return hit[1]

    def put(self, key: K, value: V, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        self._items[key] = (self._clock() + ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > CACHE_ENTRIES:
            self._items.popitem(last=False)

    def drop(self, key: K) -> None:
        self._items.pop(key, None)


class BoundedReads:
    """An `EscrowReader` in front of another: caches, shares and caps the reads (see above)."""

    def __init__(
        self,
        inner: EscrowReader,
        *,
        max_concurrent: int = 8,
        max_waiting: int = 256,
        positive_ttl_s: float = POSITIVE_TTL_S,
        negative_ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.max_concurrent = max_concurrent
        self.max_waiting = max_waiting
        self.positive_ttl_s = positive_ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self._waiting = 0
        self._deposits: _Cache[bytes, OnChainDeposit] = _Cache(clock)
        self._balances: _Cache[str, OnChainBalance] = _Cache(clock)
        self._pending: dict[tuple[str, Any], asyncio.Future[Any]] = {}  # reads under way

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        cached = self._deposits.get(query_id)
        if cached is not None:
            return cached
        deposit = await self._shared(("deposit", query_id), lambda: self.inner.deposit(query_id))
        ttl = self.positive_ttl_s if deposit.funded else self.negative_ttl_s
        self._deposits.put(query_id, deposit, ttl)
        return deposit

    async def prepaid(self, payer: str) -> OnChainBalance:
        cached = self._balances.get(payer)
        if cached is not None:
            return cached
        balance = await self._shared(("prepaid", payer), lambda: self.inner.prepaid(payer))
        ttl = self.positive_ttl_s if balance.balance > 0 else self.negative_ttl_s
        self._balances.put(payer, balance, ttl)
        return balance

    def forget_balance(self, payer: str) -> None:
        """The payer's balance changed on chain (a posted root debited it): read it again."""
        self._balances.drop(payer)

    async def _shared(self, key: tuple[str, Any], read: Callable[[], Awaitable[V]]) -> V:
        """One read per key at a time, in a task of its own: a caller that goes away (its
        client hung up) does not cancel the read the others wait for."""
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(self._bounded(read))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: tuple[str, Any], task: asyncio.Future[Any]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]
        if not task.cancelled():
            task.exception()  # retrieved here: the waiters re-raise it, nobody else must

    async def _bounded(self, read: Callable[[], Awaitable[V]]) -> V:
        if self._slots.locked() and self._waiting >= self.max_waiting:
            raise NoCircuit(
                "chain_busy",
                f"{self.max_concurrent} chain reads are running and {self._waiting} wait; "
                "try again in a moment",
            )
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            return await read()
        finally:
            self._slots.release()
