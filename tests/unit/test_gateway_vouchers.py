"""PaymentDesk with prepaid vouchers: every 402 by name (malformed, expired, expiring before the
committee could charge it, too far, over cap, replayed, invalid signature, withdrawing,
insufficient), reservations against the balance (concurrent questions cannot overdraw it),
release / settle / mark_debited accounting, receipts carrying the payer, and a restart that
remembers what is still outstanding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.gateway.errors import PaymentRequired
from node.gateway.escrow_reads import OnChainBalance, OnChainDeposit
from node.gateway.payments import PaymentDesk
from protocol.eip712 import address_of
from protocol.payment import (
    PaymentKeyError,
    Voucher,
    VoucherKeyError,
    parse_voucher_key,
    payment_domain,
    sign_voucher,
    verify_prepaid_receipt_json,
)

pytestmark = pytest.mark.unit

PAYER = bytes.fromhex("51" * 32)
GATEWAY_KEY = bytes.fromhex("52" * 32)
GATEWAY = address_of(GATEWAY_KEY)
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = payment_domain(31337, ESCROW)
MODEL = bytes.fromhex("53" * 32)
NOW = 1_800_000_000
NODES = ["ab" * 32]


class Escrow:
    def __init__(self, balance: int = 1_000, withdrawable_at: int = 0) -> None:
        self.balance = balance
        self.withdrawable_at = withdrawable_at
        self.reads = 0

    async def deposit(self, query_id: bytes) -> OnChainDeposit:  # pragma: no cover - unused
        raise AssertionError("the prepaid path never reads a per-query deposit")

    async def prepaid(self, payer: str) -> OnChainBalance:
        self.reads += 1
        await asyncio.sleep(0.01)  # let concurrent requests interleave at the await
        return OnChainBalance(self.balance, self.withdrawable_at)


def desk(escrow: Escrow, path: Path | None = None) -> PaymentDesk:
    return PaymentDesk(
        escrow,
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL,
        price_wei_per_token=10,
        receipts_path=path,
        max_voucher_lifetime_s=3_600,
        clock=lambda: NOW,
    )


_ids = iter(range(1, 10_000))


def voucher(
    cap: int = 500,
    expiry: int = NOW + 600,
    key: bytes = PAYER,
    gateway: str = GATEWAY,
    query: bytes | None = None,
):
    query = query or next(_ids).to_bytes(32, "big")
    return parse_voucher_key(
        sign_voucher(key, Voucher(gateway, query, MODEL, cap, expiry, ESCROW), DOMAIN)
    )


async def refused(payments: PaymentDesk, proof: object, required: int = 100) -> str:
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(proof, required)  # type: ignore[arg-type]
    assert caught.value.http_status == 402
    return str(caught.value.code)


async def test_voucher_reserve_settle_charges_payer_and_receipt_names_it() -> None:
    escrow = Escrow()
    payments = desk(escrow)
    proof = voucher()
    reservation = await payments.reserve(proof, 100)
    assert reservation.prepaid and reservation.payer == address_of(PAYER)
    assert payments.outstanding(address_of(PAYER)) == 100
    doc = payments.settle(reservation, 3, 4, NODES)  # 70 wei charged of 100 held
    assert payments.outstanding(address_of(PAYER)) == 70
    charge = verify_prepaid_receipt_json(doc, DOMAIN)
    assert (charge.payer, charge.receipt.fee) == (address_of(PAYER), 70)
    assert payments.receipt_for(proof, proof.query_id) == doc
    assert payments.receipt_for(voucher(), proof.query_id) is None  # another voucher gets nothing
    assert payments.undebited() == {proof.query_id: (address_of(PAYER), 70)}
    assert payments.mark_debited([proof.query_id, bytes(32)]) == 1
    assert payments.outstanding(address_of(PAYER)) == 0


async def test_voucher_release_frees_the_hold_and_the_id() -> None:
    payments = desk(Escrow())
    proof = voucher()
    reservation = await payments.reserve(proof, 100)
    payments.release(reservation)
    assert payments.outstanding(address_of(PAYER)) == 0
    reservation = await payments.reserve(proof, 100)  # the same voucher may be used again
    assert reservation.allowed_wei == 100


async def test_voucher_replayed_after_settle_refused() -> None:
    payments = desk(Escrow())
    proof = voucher()
    payments.settle(await payments.reserve(proof, 100), 1, 1, NODES)
    assert await refused(payments, proof) == "voucher_replayed"


async def test_voucher_concurrent_questions_cannot_overdraw_the_balance() -> None:
    escrow = Escrow(balance=250)
    payments = desk(escrow)
    results = await asyncio.gather(
        *(payments.reserve(voucher(), 100) for _ in range(4)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    codes = sorted(r.code for r in results if isinstance(r, PaymentRequired))
    assert len(granted) == 2 and codes == ["balance_insufficient"] * 2
    assert payments.outstanding(address_of(PAYER)) == 200
    assert escrow.reads == 4


async def test_voucher_outstanding_charges_count_until_debited() -> None:
    escrow = Escrow(balance=150)
    payments = desk(escrow)
    payments.settle(await payments.reserve(voucher(), 100), 5, 5, NODES)  # 100 charged
    assert await refused(payments, voucher()) == "balance_insufficient"
    escrow.balance = 50  # the root debited the 100 on chain
    payments.mark_debited(list(payments.undebited()))
    assert (await payments.reserve(voucher(), 50)).allowed_wei == 50


@pytest.mark.parametrize(
    "proof,code",
    [
        (lambda: voucher(expiry=NOW), "voucher_expired"),
        (lambda: voucher(expiry=NOW + 184), "voucher_expiring"),
        (lambda: voucher(expiry=NOW + 3_601), "voucher_expiry_too_far"),
        (lambda: voucher(cap=99), "voucher_over_cap"),
        (lambda: VoucherKeyError("bad"), "voucher_malformed"),
        (lambda: PaymentKeyError("no API key"), "payment_malformed"),
    ],
)
async def test_voucher_refusals_are_named(proof: object, code: str) -> None:
    escrow = Escrow()
    assert await refused(desk(escrow), proof()) == code  # type: ignore[operator]
    assert escrow.reads == 0  # refused before any chain read


async def test_voucher_for_another_gateway_spends_nobodys_balance() -> None:
    escrow = Escrow(balance=0)  # the recovered address has nothing
    proof = voucher(gateway=address_of(PAYER))
    assert await refused(desk(escrow), proof) == "balance_insufficient"


async def test_voucher_unrecoverable_signature_refused() -> None:
    good = voucher()
    bad = type(good)(good.query_id, good.fee_cap, good.expiry, b"\x00" * 64 + b"\x1b")
    assert await refused(desk(Escrow()), bad) == "voucher_invalid"


async def test_voucher_withdrawal_pending_refused() -> None:
    escrow = Escrow(withdrawable_at=NOW + 600)
    assert await refused(desk(escrow), voucher()) == "balance_withdrawing"


async def test_voucher_restart_remembers_receipts_and_outstanding(tmp_path: Path) -> None:
    path = tmp_path / "receipts.jsonl"
    payments = desk(Escrow(), path)
    first, second = voucher(), voucher()
    payments.settle(await payments.reserve(first, 100), 2, 2, NODES)  # 40
    payments.settle(await payments.reserve(second, 100), 3, 3, NODES)  # 60
    payments.mark_debited([first.query_id])
    restarted = desk(Escrow(), path)
    assert restarted.outstanding(address_of(PAYER)) == 60
    assert restarted.undebited() == {second.query_id: (address_of(PAYER), 60)}
    assert await refused(restarted, first) == "voucher_replayed"
    assert restarted.receipt_for(second, second.query_id) is not None
