"""Timeline rules at serve time: the minimum lifetime of vouchers and keys and the refund margin
are derived from the reporting schedule, the epoch and the posting margin; a gateway whose
escrow lets deposits refund sooner refuses to start, with the numbers; a deposit whose refund
opens inside the margin is refused by name."""

from __future__ import annotations

import pytest

from node.gateway.errors import PaymentRequired
from node.gateway.escrow_reads import OnChainDeposit
from node.gateway.payments import PaymentDesk
from node.gateway.run import _epoch_blocks, _refund_margin
from node.gateway.timeline import Timeline, check_refund_timeout
from protocol.eip712 import address_of
from protocol.errors import ConfigError, UnavailableError
from protocol.payment import QueryPayment, parse_api_key, sign_payment
from tests.unit.gateway_fakes import DOMAIN, GATEWAY, GATEWAY_KEY, MODEL_ID, USER

pytestmark = pytest.mark.unit

TIMELINE = Timeline(report_max_wait_s=60, report_every_s=5, epoch_blocks=20, block_time_s=0.5)


def test_lifetimes_are_derived_from_the_schedule() -> None:
    assert TIMELINE.min_authorization_lifetime_s == 60 + 5 + 120
    assert TIMELINE.refund_margin_s == 60 + 5 + 120 + 10 + 120
    slower = Timeline(report_max_wait_s=600, report_every_s=5, epoch_blocks=20)
    assert slower.min_authorization_lifetime_s == 725  # a longer batch needs longer vouchers
    assert slower.refund_margin_s > TIMELINE.refund_margin_s


def test_an_escrow_refunding_inside_the_margin_refuses_to_start_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as caught:
        check_refund_timeout(120, TIMELINE.refund_margin_s, TIMELINE)
    message = caught.value.message
    assert "120 s" in message and f"{TIMELINE.refund_margin_s} s" in message
    assert "epoch 20 blocks" in message and caught.value.hint
    check_refund_timeout(600, TIMELINE.refund_margin_s, TIMELINE)  # long enough


class Config:
    def __init__(self, refund_margin_s: int | None) -> None:
        self.refund_margin_s = refund_margin_s


def test_refund_margin_defaults_to_the_derived_one_and_a_flag_wins() -> None:
    assert _refund_margin(Config(None), TIMELINE) == TIMELINE.refund_margin_s  # type: ignore[arg-type]
    assert _refund_margin(Config(30), TIMELINE) == 30  # type: ignore[arg-type]


def test_epoch_length_comes_from_the_committee_params() -> None:
    assert _epoch_blocks({"genesis": {"epoch_length": 12}}) == 12
    for params in ({}, {"genesis": {"epoch_length": 0}}, {"genesis": {"epoch_length": True}}, []):
        with pytest.raises(UnavailableError):
            _epoch_blocks(params)


class Aging:
    def __init__(self, refund_at: int) -> None:
        self.refund_at = refund_at

    async def deposit(self, query_id: bytes) -> OnChainDeposit:
        return OnChainDeposit(address_of(USER), 10**6, 1, MODEL_ID, self.refund_at, GATEWAY)


@pytest.mark.parametrize(
    "refund_in_s,served", [(TIMELINE.refund_margin_s - 1, False), (TIMELINE.refund_margin_s, True)]
)
async def test_a_deposit_refundable_inside_the_margin_is_refused(
    refund_in_s: int, served: bool
) -> None:
    payments = PaymentDesk(
        Aging(1_000 + refund_in_s),
        domain=DOMAIN,
        gateway_address=GATEWAY,
        gateway_key=GATEWAY_KEY,
        model_id=MODEL_ID,
        price_wei_per_token=10,
        refund_margin_s=TIMELINE.refund_margin_s,
        clock=lambda: 1_000,
    )
    proof = parse_api_key(
        sign_payment(USER, QueryPayment(b"\x01" * 32, MODEL_ID, GATEWAY, 10**6), DOMAIN)
    )
    if served:
        assert (await payments.reserve(proof, 100)).allowed_wei == 100
        return
    with pytest.raises(PaymentRequired) as caught:
        await payments.reserve(proof, 100)
    assert caught.value.code == "payment_expiring"
