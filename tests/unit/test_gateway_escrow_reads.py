"""Bounded chain reads per request: a deposit check is one `depositOf` eth_call (no log scan),
a balance one `prepaidOf(payer, gateway)`; answers are cached (positive for a question's life,
negative briefly), concurrent reads of one thing share a call, and a flood of well-formed fake
keys runs at most `max_concurrent` reads at once and queues at most `max_waiting` (then 503
`chain_busy`) — counted at the reader."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from node.gateway.errors import NoCircuit, PaymentRequired
from node.gateway.escrow_reads import (
    BoundedReads,
    ChainEscrow,
    OnChainBalance,
    OnChainDeposit,
)
from node.gateway.payments import PaymentDesk
from protocol.eip712 import address_of
from protocol.payment import (
    PaymentKey,
    QueryPayment,
    parse_bearer,
    sign_payment,
    sign_payment_key,
)
from tests.unit.gateway_fakes import DOMAIN, ESCROW, GATEWAY, GATEWAY_KEY, MODEL_ID, USER

pytestmark = pytest.mark.unit

OTHER_GATEWAY = address_of(bytes.fromhex("66" * 32))


# --- ChainEscrow: what one check costs on the EVM chain --------------------------------------


class FakeEscrow:
    """The escrow binding ChainEscrow reads (node/chain/evm/escrow.py); every RPC is counted by
    kind, and a log scan would be counted too."""

    def __init__(self, deposit: tuple[Any, ...]) -> None:
        self.deposit = deposit
        self.rpc: list[str] = []

    def deposit_of(self, query_id: bytes) -> dict[str, Any]:
        self.rpc.append(f"depositOf{(query_id,)}")
        user, amount, status, deposited_at, model_id, gateway = self.deposit
        return {
            "user": user,
            "amount": amount,
            "status": status,
            "deposited_at": deposited_at,
            "model_id": model_id,
            "gateway": gateway,
        }

    def prepaid_of(self, payer: str, gateway: str) -> dict[str, int]:
        self.rpc.append(f"prepaidOf{(payer, gateway)}")
        return {"balance": 500, "withdrawable_at": 0}

    def refund_timeout(self) -> int:
        self.rpc.append("refundTimeout")
        return 600

    def get_logs(self, *_: Any) -> list[Any]:
        self.rpc.append("eth_getLogs")
        return []


class FakeChain:
    """The slice of PlanetChain that ChainEscrow uses: its escrow binding."""

    def __init__(self, deposit: tuple[Any, ...]) -> None:
        self.escrow = FakeEscrow(deposit)
        self.rpc = self.escrow.rpc


async def test_a_deposit_check_is_one_eth_call_and_no_log_scan() -> None:
    query = secrets.token_bytes(32)
    chain = FakeChain((address_of(USER), 10**6, 1, 1_700_000_000, MODEL_ID, GATEWAY))
    escrow = ChainEscrow(chain, GATEWAY)
    escrow.refund_timeout()  # read once at gateway start
    chain.rpc.clear()
    deposit = await escrow.deposit(query)
    assert deposit == OnChainDeposit(
        address_of(USER), 10**6, 1, MODEL_ID, 1_700_000_000 + 600, GATEWAY
    )
    assert chain.rpc == [f"depositOf{(query,)}"]  # no eth_getLogs from the deployment block


async def test_a_balance_is_read_for_this_gateway() -> None:
    chain = FakeChain((address_of(USER), 0, 0, 0, bytes(32), GATEWAY))
    balance = await ChainEscrow(chain, GATEWAY).prepaid(address_of(USER))
    assert balance == OnChainBalance(500, 0)
    assert chain.rpc == [f"prepaidOf{(address_of(USER), GATEWAY)}"]


def desk(reader: Any) -> PaymentDesk:
    return PaymentDesk(
        reader,
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL_ID,
        price_wei_per_token=10,
    )


def deposit_key(query: bytes) -> Any:
    return parse_bearer(sign_payment(USER, QueryPayment(query, MODEL_ID, GATEWAY, 10**6), DOMAIN))


async def test_a_deposit_made_for_another_gateway_is_refused_before_serving() -> None:
    class Reader:
        async def deposit(self, query_id: bytes) -> OnChainDeposit:
            return OnChainDeposit(address_of(USER), 10**6, 1, MODEL_ID, 0, OTHER_GATEWAY)

    with pytest.raises(PaymentRequired) as caught:
        await desk(Reader()).reserve(deposit_key(secrets.token_bytes(32)), 100)
    assert caught.value.code == "payment_wrong_gateway"
    assert OTHER_GATEWAY in caught.value.message


# --- BoundedReads: a flood of fake keys --------------------------------------------------------


class SlowReader:
    """Answers after a delay; records how many reads run at once."""

    def __init__(self, delay_s: float = 0.02) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self.running = 0
        self.most = 0

    async def _read(self) -> None:
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.running -= 1

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        await self._read()
        return OnChainDeposit("0x" + "0" * 40, 0, 0, None)  # nobody deposited

    async def prepaid(self, payer: str) -> OnChainBalance:
        await self._read()
        return OnChainBalance(0, 0)


async def test_a_flood_of_distinct_fake_deposit_keys_is_capped() -> None:
    inner = SlowReader()
    payments = desk(BoundedReads(inner, max_concurrent=8, max_waiting=64))
    keys = [deposit_key(secrets.token_bytes(32)) for _ in range(400)]
    results = await asyncio.gather(
        *(payments.reserve(key, 100) for key in keys), return_exceptions=True
    )
    codes = [getattr(r, "code", repr(r)) for r in results]
    assert set(codes) == {"payment_unfunded", "chain_busy"}
    assert inner.most <= 8  # never more than 8 RPC calls at once
    assert inner.calls == codes.count("payment_unfunded") <= 8 + 64
    assert all(
        isinstance(r, NoCircuit) and r.http_status == 503 for r in results if r.code == "chain_busy"
    )


async def test_a_flood_of_fake_payment_keys_reads_each_payer_once_at_a_time() -> None:
    inner = SlowReader()
    payments = desk(BoundedReads(inner, max_concurrent=4, max_waiting=1_000))
    expiry = int(time.time()) + 3_600
    strangers = [secrets.token_bytes(32) for _ in range(20)]
    texts = [
        sign_payment_key(
            key,
            PaymentKey(GATEWAY, secrets.token_bytes(32), MODEL_ID, 10**6, expiry, ESCROW),
            DOMAIN,
        )
        for key in strangers
        for _ in range(10)  # each stranger floods with 10 keys
    ]
    results = await asyncio.gather(
        *(payments.reserve(parse_bearer(text), 100) for text in texts), return_exceptions=True
    )
    assert {getattr(r, "code", None) for r in results} == {"key_unfunded"}
    assert inner.calls == len(strangers)  # shared while running, cached negative after
    assert inner.most <= 4


async def test_the_same_unfunded_key_again_and_again_costs_one_read_per_interval() -> None:
    now = [0.0]
    inner = SlowReader(delay_s=0)
    reads = BoundedReads(inner, negative_ttl_s=5.0, clock=lambda: now[0])
    query = secrets.token_bytes(32)
    for _ in range(50):
        assert (await reads.deposit(query)).status == 0
    assert inner.calls == 1
    now[0] = 5.1
    await reads.deposit(query)
    assert inner.calls == 2


async def test_a_positive_balance_is_cached_briefly_and_forgotten_on_debit() -> None:
    now = [0.0]

    class Funded(SlowReader):
        async def prepaid(self, payer: str) -> OnChainBalance:
            await self._read()
            return OnChainBalance(1_000, 0)

    inner = Funded(delay_s=0)
    reads = BoundedReads(inner, positive_ttl_s=2.0, clock=lambda: now[0])
    payer = address_of(USER)
    await reads.prepaid(payer)
    await reads.prepaid(payer)
    assert inner.calls == 1
    reads.forget_balance(payer)  # a posted root debited it
    await reads.prepaid(payer)
    now[0] = 2.5
    await reads.prepaid(payer)
    assert inner.calls == 3


async def test_a_failed_read_is_not_cached_and_reaches_every_waiter() -> None:
    class Down(SlowReader):
        async def prepaid(self, payer: str) -> OnChainBalance:
            await self._read()
            raise NoCircuit("chain_unavailable", "down")

    inner = Down()
    reads = BoundedReads(inner)
    results = await asyncio.gather(
        *(reads.prepaid("0xabc") for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, NoCircuit) for r in results) and inner.calls == 1
    with pytest.raises(NoCircuit):
        await reads.prepaid("0xabc")
    assert inner.calls == 2


async def test_a_caller_that_goes_away_does_not_cancel_the_read_others_wait_for() -> None:
    class Funded(SlowReader):
        async def prepaid(self, payer: str) -> OnChainBalance:
            await self._read()
            return OnChainBalance(1_000, 0)

    inner = Funded(delay_s=0.05)
    reads = BoundedReads(inner)
    first = asyncio.ensure_future(reads.prepaid("0xabc"))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(reads.prepaid("0xabc"))
    await asyncio.sleep(0.01)
    first.cancel()  # its client hung up
    assert (await second).balance == 1_000
    assert inner.calls == 1
