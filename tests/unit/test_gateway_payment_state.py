"""The payment state machine and the desk under it: each exit charges what its rule says, every
transition is idempotent, and a hold is returned exactly once whatever the order of calls."""

from __future__ import annotations

import time

import pytest

from node.gateway.escrow_reads import OnChainBalance
from node.gateway.payment_state import PaymentStateError, QuestionPayment, State
from node.gateway.payments import PaymentDesk
from protocol.eip712 import address_of
from protocol.payment import Voucher, parse_voucher_key, sign_voucher
from tests.unit.gateway_fakes import (
    DOMAIN,
    ESCROW,
    GATEWAY,
    GATEWAY_KEY,
    MODEL_ID,
    USER,
    FakeCircuit,
    FakeEscrow,
)

pytestmark = pytest.mark.unit

PAYER = address_of(USER)
PRICE = 10
PROMPT = 5
_ids = iter(range(1, 10**6))


def desk() -> PaymentDesk:
    escrow = FakeEscrow()
    escrow.balances[PAYER] = OnChainBalance(10**6, 0)
    return PaymentDesk(
        escrow,
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL_ID,
        price_wei_per_token=PRICE,
    )


async def question(payments: PaymentDesk, hold: int = 1_000) -> QuestionPayment:
    query = next(_ids).to_bytes(32, "big")
    voucher = Voucher(GATEWAY, query, MODEL_ID, 10**5, int(time.time()) + 600, ESCROW)
    proof = parse_voucher_key(sign_voucher(USER, voucher, DOMAIN))
    return QuestionPayment(payments, await payments.reserve(proof, hold), PROMPT)


async def test_finish_charges_prompt_and_delivered_and_is_idempotent() -> None:
    payments = desk()
    payment = await question(payments)
    payment.produce(3)
    payment.deliver(3)
    assert payment.state is State.SERVING
    receipt = payment.finish(FakeCircuit())
    assert receipt["fee_wei"] == str(PRICE * (PROMPT + 3))
    assert payment.finish(FakeCircuit()) is receipt  # the same receipt, no second charge
    payment.close(FakeCircuit())
    payment.client_gone(FakeCircuit(), prompt_sent=True)
    assert payments.outstanding(PAYER) == PRICE * (PROMPT + 3)
    assert payments.in_flight() == (0, 0)


async def test_client_gone_after_a_token_went_out_charges_it() -> None:
    payments = desk()
    payment = await question(payments)
    payment.produce()
    payment.deliver()
    payment.client_gone(FakeCircuit(), prompt_sent=True)
    assert payment.state is State.CHARGED and payment.receipt is not None
    assert payment.receipt["completion_tokens"] == 1


async def test_client_gone_before_the_prompt_reached_a_circuit_releases_once() -> None:
    payments = desk()
    kept = await question(payments)
    payment = await question(payments)
    payment.client_gone(None, prompt_sent=False)
    assert payment.state is State.RELEASED
    assert payments.outstanding(PAYER) == 1_000  # only the other question's hold is left
    payment.client_gone(None, prompt_sent=False)
    payment.close(None)
    assert payments.outstanding(PAYER) == 1_000
    kept.close(None)
    assert payments.outstanding(PAYER) == 0


async def test_client_gone_after_the_prompt_was_sent_charges_the_prompt() -> None:
    payments = desk()
    payment = await question(payments)
    payment.client_gone(FakeCircuit(), prompt_sent=True)
    assert payment.state is State.CHARGED
    assert payment.receipt is not None and payment.receipt["completion_tokens"] == 0
    assert payments.outstanding(PAYER) == PRICE * PROMPT


async def test_node_failure_charges_only_what_went_out() -> None:
    payments = desk()
    nothing_out = await question(payments)
    nothing_out.produce(4)  # a whole answer being built: nothing reached the client yet
    nothing_out.failed(FakeCircuit())
    assert nothing_out.state is State.RELEASED
    some_out = await question(payments)
    some_out.produce(2)
    some_out.deliver(2)
    some_out.failed(FakeCircuit())
    assert some_out.state is State.CHARGED
    assert some_out.receipt is not None and some_out.receipt["completion_tokens"] == 2


async def test_no_transition_out_of_a_terminal_state() -> None:
    payments = desk()
    payment = await question(payments)
    payment.failed(None)
    with pytest.raises(PaymentStateError):
        payment.deliver()
    with pytest.raises(PaymentStateError):
        payment.finish(FakeCircuit())
    served = await question(payments)
    served.deliver()
    with pytest.raises(PaymentStateError):
        served.restart()  # no retry once a token went out


async def test_desk_release_and_settle_act_once_per_reservation() -> None:
    """Before: `release` after `settle` (a failed final write) gave the prepaid hold back a
    second time, and releasing twice did too."""
    payments = desk()
    first = await question(payments)
    second = await question(payments)
    receipt = payments.settle(first.reservation, PROMPT, 2, ["ab" * 32])
    assert not payments.release(first.reservation)  # settled: nothing to release
    assert payments.settle(first.reservation, PROMPT, 9, ["ab" * 32]) == receipt  # no 2nd fee
    assert payments.outstanding(PAYER) == 1_000 + PRICE * (PROMPT + 2)
    assert payments.release(second.reservation)
    assert not payments.release(second.reservation)
    assert payments.outstanding(PAYER) == PRICE * (PROMPT + 2)
    with pytest.raises(RuntimeError, match="released"):
        payments.settle(second.reservation, PROMPT, 1, ["ab" * 32])
