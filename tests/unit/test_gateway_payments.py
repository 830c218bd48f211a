"""PaymentDesk: one winner per query id, release on failure, receipts survive a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.gateway.errors import PaymentRequired
from node.gateway.escrow_reads import OnChainDeposit
from node.gateway.payments import PaymentDesk
from protocol.eip712 import address_of
from protocol.payment import QueryPayment, parse_api_key, payment_domain, sign_payment

pytestmark = pytest.mark.unit

USER = bytes.fromhex("41" * 32)
GATEWAY_KEY = bytes.fromhex("42" * 32)
DOMAIN = payment_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
MODEL = bytes.fromhex("43" * 32)
QUERY = bytes.fromhex("44" * 32)


class SlowEscrow:
    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        await asyncio.sleep(0.01)
        return OnChainDeposit(address_of(USER), 10**6, 1, MODEL)


def desk(path: Path) -> PaymentDesk:
    return PaymentDesk(
        SlowEscrow(),
        domain=DOMAIN,
        gateway_address=address_of(GATEWAY_KEY),
        gateway_key=GATEWAY_KEY,
        model_id=MODEL,
        price_wei_per_token=10,
        receipts_path=path,
    )


def proof():
    payment = QueryPayment(QUERY, MODEL, address_of(GATEWAY_KEY), 10**6)
    return parse_api_key(sign_payment(USER, payment, DOMAIN))


async def test_payment_desk_two_racing_requests_one_wins(tmp_path: Path) -> None:
    payments = desk(tmp_path / "r.jsonl")
    results = await asyncio.gather(
        payments.reserve(proof(), 100), payments.reserve(proof(), 100), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, PaymentRequired)]
    assert len(errors) == 1 and errors[0].code == "payment_used"


async def test_payment_desk_release_frees_settle_burns_and_restart_remembers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.jsonl"
    payments = desk(path)
    reservation = await payments.reserve(proof(), 100)
    payments.release(reservation)  # a failed question: no charge, usable again
    reservation = await payments.reserve(proof(), 100)
    receipt = payments.settle(reservation, 3, 4, ["ab" * 32])
    assert receipt["fee_wei"] == str(10 * 7)
    with pytest.raises(PaymentRequired, match="already used"):
        await payments.reserve(proof(), 100)
    restarted = desk(path)
    assert restarted.receipt(QUERY) == receipt
    with pytest.raises(PaymentRequired, match="already used"):
        await restarted.reserve(proof(), 100)


async def test_payment_desk_fee_never_exceeds_the_checked_amount(tmp_path: Path) -> None:
    payments = desk(tmp_path / "r.jsonl")
    reservation = await payments.reserve(proof(), 50)
    receipt = payments.settle(reservation, 10, 10, ["ab" * 32])  # 200 wei by price, 50 allowed
    assert receipt["fee_wei"] == "50"


class AgingEscrow:
    def __init__(self, refund_at: int) -> None:
        self.refund_at = refund_at

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        return OnChainDeposit(address_of(USER), 10**6, 1, MODEL, self.refund_at)


@pytest.mark.parametrize("refund_at,served", [(1_000 + 119, False), (1_000 + 120, True), (0, True)])
async def test_payment_desk_deposit_close_to_its_refund_refused(
    refund_at: int, served: bool
) -> None:
    payments = PaymentDesk(
        AgingEscrow(refund_at),
        domain=DOMAIN,
        gateway_address=address_of(GATEWAY_KEY),
        gateway_key=GATEWAY_KEY,
        model_id=MODEL,
        price_wei_per_token=10,
        refund_margin_s=120,
        clock=lambda: 1_000,
    )
    if served:
        assert (await payments.reserve(proof(), 100)).allowed_wei == 100
    else:
        with pytest.raises(PaymentRequired) as caught:
            await payments.reserve(proof(), 100)
        assert caught.value.code == "payment_expiring"
