"""A hosted gateway whose credit wallet cannot pay the nodes (node/gateway/credit_payer.py):
the question fails by name — 503 `gateway_out_of_credits`, not the personal client's 402 nor a
traceback — no credit leaves the wallet for it, and its user is charged nothing when nothing was
delivered (the hold is released, the proof pays another question), only what was delivered
otherwise (payment_state.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import node.gateway.app as gateway_app
from node.client.credit_wallet import CreditWallet
from node.client.paying import FINAL_PAYMENT_ERRORS, OutOfCreditsError, PriceUnregisteredError
from node.gateway.credit_payer import GatewayOutOfCredits, HostedPayer
from protocol.paid_credits import PaidCredit
from tests.credit_fakes import fake_credits
from tests.unit.gateway_fakes import CHAT, RawClient
from tests.unit.test_gateway_hangups import deposit, env, settled, stream_body

pytestmark = pytest.mark.unit

__all__ = ["env"]  # the fixture: a gateway over scripted nodes (test_gateway_hangups.py)


def _credits(count: int) -> list[PaidCredit]:
    return fake_credits(count)


def test_hosted_payer_with_too_few_credits_refuses_by_name_and_takes_none(tmp_path: Path) -> None:
    wallet = CreditWallet(tmp_path / "wallet-credits.json")
    payer = HostedPayer(wallet, {"http://a": 16, "http://b": 0}, min_positions=16)
    with pytest.raises(GatewayOutOfCredits) as dry:
        payer.take([1, 0])
    assert dry.value.code == "gateway_out_of_credits" and dry.value.http_status == 503
    assert "holds 0 credits and the compute nodes ask for 1 more" in dry.value.message
    assert dry.value.hint and "ask again shortly" in dry.value.hint
    # an OutOfCreditsError: the engine and failover stop there (another circuit pays no better)
    assert isinstance(dry.value, OutOfCreditsError)
    wallet.add(_credits(2))
    with pytest.raises(GatewayOutOfCredits):
        payer.take([2, 1])
    assert wallet.count() == 2 and payer.spent == 0
    assert [len(c) for c in payer.take([1, 1])] == [1, 1] and wallet.count() == 0


def test_a_payer_refuses_a_node_with_no_price_by_name_and_takes_nothing(tmp_path: Path) -> None:
    """A node not in the payer's prices has no price on the chain (the router leaves it out):
    the chain redeems nothing there, so no credit goes to it, and the question stops by name
    (before: not listed meant free, and a charging node got nothing but a failover)."""
    wallet = CreditWallet(tmp_path / "wallet-credits.json")
    wallet.add(_credits(3))
    payer = HostedPayer(wallet, {"http://a": 16, "http://b": 0}, min_positions=16)
    assert payer.due(1, ["http://a", "http://b"], 20) == [2, 0]  # 0 on the chain: free
    with pytest.raises(PriceUnregisteredError) as refused:
        payer.due(1, ["http://a", "http://c"], 20)
    assert refused.value.code == "price_unregistered" and refused.value.http_status == 402
    assert "http://c has no price on the committee chain" in refused.value.message
    assert refused.value.hint and "--min-credit-positions N" in refused.value.hint
    assert PriceUnregisteredError in FINAL_PAYMENT_ERRORS  # no other circuit pays it better
    assert wallet.count() == 3 and payer.spent == 0


async def test_out_of_credits_before_any_token_is_a_503_and_charges_nothing(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    script.fail(GatewayOutOfCredits(6, 0))
    head = await client.reader.read(4096)
    assert b" 503 " in head
    error = json.loads(head.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "gateway_out_of_credits" and error["type"] == "service_unavailable"
    assert "nothing was charged" in error["message"]
    await settled(gateway)
    assert gateway.desk.receipt(query) is None and gateway.desk.in_flight() == (0, 0)
    assert (await gateway.desk.reserve(gateway_app.parse_bearer(key), 1)).query_id == query


async def test_out_of_credits_in_a_whole_answer_is_a_503_and_charges_nothing(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    body = {**CHAT, "max_tokens": 8}
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", body, key)
    script.tokens(10, 11)  # produced, never delivered: the answer is sent whole or not at all
    script.fail(GatewayOutOfCredits(3, 1))
    head = await client.reader.read(4096)
    assert b" 503 " in head and b"gateway_out_of_credits" in head
    await settled(gateway)
    assert gateway.desk.receipt(query) is None and gateway.desk.in_flight() == (0, 0)


async def test_out_of_credits_mid_stream_charges_only_what_was_delivered(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    script.tokens(10, 11)
    await client.read_events(2)
    script.fail(GatewayOutOfCredits(3, 0))
    error = (await client.read_events(3))[-1]
    assert error["error"]["code"] == "gateway_out_of_credits"
    assert "charged for the prompt and the 2 tokens delivered" in error["error"]["message"]
    await settled(gateway)
    assert gateway.desk.receipt(query) == error["planet_receipt"]
    assert error["planet_receipt"]["completion_tokens"] == 2
