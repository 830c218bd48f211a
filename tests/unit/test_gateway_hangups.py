"""Every delivered token is charged, whatever the client does: a raw HTTP client hangs up
(TCP reset) while queued, before the first token, mid-answer, after the last token and during a
non-streamed answer, while the test releases the nodes' tokens one by one
(`gateway_fakes.Script`). The question's payment ends in exactly one terminal state (rules in
node/gateway/payment_state.py): charged for the prompt + what went out once the nodes worked
for the client, the proof consumed for good; released only when no work was done for it or a
node failed before anything went out; a prepaid hold is returned exactly once, so a balance
never buys more than it holds."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import node.gateway.app as gateway_app
from node.gateway.app import create_app
from node.gateway.errors import NodeFailed, PaymentRequired
from node.gateway.escrow_reads import OnChainBalance, OnChainDeposit
from protocol.eip712 import address_of
from protocol.payment import QueryPayment, Voucher, sign_payment, sign_voucher
from tests.unit.gateway_fakes import (
    CHAT,
    DOMAIN,
    ESCROW,
    GATEWAY,
    MODEL_ID,
    PRICE,
    PROMPT_TOKENS,
    USER,
    FakeEscrow,
    RawClient,
    Script,
    ScriptedGeneration,
    build_gateway,
)

pytestmark = pytest.mark.unit

PAYER = address_of(USER)


@pytest.fixture
async def env(aiohttp_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    script = Script()
    monkeypatch.setattr(ScriptedGeneration, "script", script, raising=False)
    monkeypatch.setattr(gateway_app, "Generation", ScriptedGeneration)
    escrow = FakeEscrow()
    http = aiohttp.ClientSession()
    gateway = build_gateway(tmp_path, http, escrow)
    server = await aiohttp_server(create_app(gateway))
    yield server, gateway, escrow, script
    await http.close()


def deposit(escrow: FakeEscrow) -> tuple[str, bytes]:
    query = secrets.token_bytes(32)
    escrow.deposits[query] = OnChainDeposit(PAYER, 10**9, 1, MODEL_ID)
    return sign_payment(USER, QueryPayment(query, MODEL_ID, GATEWAY, 10**9), DOMAIN), query


def voucher(cap: int = 10**9) -> tuple[str, bytes]:
    query = secrets.token_bytes(32)
    expiry = int(time.time()) + 600
    text = sign_voucher(USER, Voucher(GATEWAY, query, MODEL_ID, cap, expiry, ESCROW), DOMAIN)
    return text, query


async def settled(gateway: Any, timeout: float = 5.0, until: Any = None) -> None:
    """Wait until no question is in flight at the gateway any more (or `until()`)."""
    async with asyncio.timeout(timeout):
        while not (until() if until else gateway.desk.in_flight()[0] == 0):
            await asyncio.sleep(0.01)


def stream_body(max_tokens: int, **more: Any) -> dict[str, Any]:
    return {**CHAT, "max_tokens": max_tokens, "stream": True, **more}


async def test_hangup_while_queued_releases_and_the_proof_stays_usable(env) -> None:
    server, gateway, escrow, script = env
    script.admitted.clear()  # no node slot yet: the prompt has not reached a circuit
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    async with asyncio.timeout(5):
        while not gateway.desk.in_flight()[0]:
            await asyncio.sleep(0.01)
    client.hang_up()
    await settled(gateway)
    assert gateway.desk.receipt(query) is None  # no work was done for it: nothing charged
    assert (await gateway.desk.reserve(gateway_app.parse_bearer(key), 1)).query_id == query


async def test_hangup_before_the_first_token_charges_the_prompt(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    await script.started.wait()  # the prompt is at the nodes
    client.hang_up()
    await settled(gateway)
    receipt = gateway.desk.receipt(query)
    assert receipt is not None, "the nodes prefilled the prompt for this client: it pays for it"
    assert (receipt["prompt_tokens"], receipt["completion_tokens"]) == (PROMPT_TOKENS, 0)
    assert int(receipt["fee_wei"]) == PRICE * PROMPT_TOKENS
    assert script.closed.is_set()  # the gateway stopped asking the nodes
    with pytest.raises(PaymentRequired, match="already used"):  # consumed for good
        await gateway.desk.reserve(gateway_app.parse_bearer(key), 1)


async def test_hangup_mid_answer_charges_every_token_handed_to_the_writer(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    script.tokens(10, 11, 12)
    events = await client.read_events(3)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "klm"
    client.hang_up()
    await settled(gateway)
    script.tokens(13)  # what the nodes would have sent next is never asked for
    receipt = gateway.desk.receipt(query)
    assert receipt is not None and receipt["completion_tokens"] == 3
    assert int(receipt["fee_wei"]) == PRICE * (PROMPT_TOKENS + 3)
    assert script.closed.is_set() and script.queue.qsize() == 1


async def test_hangup_after_the_last_token_charges_once_and_releases_no_hold(env) -> None:
    """Before: a client leaving once every token arrived got the answer for free (the failed
    write released the payment), or, leaving after the charge, made the desk release the
    prepaid hold a second time (floored at 0): one balance bought unlimited answers."""
    server, gateway, escrow, script = env
    escrow.balances[PAYER] = OnChainBalance(10**9, 0)
    script.stop_at_max = False  # the nodes are slow to end the answer: the client leaves first
    other_key, _ = voucher()
    other = await gateway.desk.reserve(gateway_app.parse_bearer(other_key), 5_000)  # in flight
    key, query = voucher()
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(3), key)
    script.tokens(10, 11, 12)
    await client.read_events(3)  # every token of the answer arrived
    client.hang_up()  # ... and the client leaves before the receipt and [DONE]
    await settled(gateway, until=lambda: gateway.desk.in_flight()[0] == 1)
    fee = PRICE * (PROMPT_TOKENS + 3)
    assert gateway.desk.receipt(query)["completion_tokens"] == 3
    # what the desk holds for the payer: the other question's hold + this charge, no less
    assert gateway.desk.outstanding(PAYER) == 5_000 + fee
    assert gateway.desk.release(other) and gateway.desk.outstanding(PAYER) == fee
    assert not gateway.desk.release(other)  # a hold is returned exactly once
    assert gateway.desk.outstanding(PAYER) == fee


async def test_hangup_during_a_whole_answer_charges_what_the_nodes_produced(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    body = {**CHAT, "max_tokens": 4}
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", body, key)
    script.tokens(10, 11)
    async with asyncio.timeout(5):
        while not script.queue.empty():
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)
    client.hang_up()
    await settled(gateway)
    receipt = gateway.desk.receipt(query)
    assert receipt is not None and receipt["completion_tokens"] == 2


async def test_a_balance_buys_at_most_what_it_holds_even_when_every_client_hangs_up(
    env,
) -> None:
    """A payer with room for two questions hangs up after the last token again and again:
    the third question is refused (before: every hang-up gave its hold back twice)."""
    server, gateway, escrow, script = env
    required = PRICE * (PROMPT_TOKENS + 3)
    escrow.balances[PAYER] = OnChainBalance(2 * required, 0)
    script.stop_at_max = False  # every client leaves after its last token, before the end
    answered = 0
    for _ in range(4):
        key, _ = voucher()
        client = await RawClient.post(
            server.make_url(""), "/v1/chat/completions", stream_body(3), key
        )
        script.tokens(10, 11, 12)  # the answer, if the payment is accepted
        head = await client.reader.readuntil(b"\r\n")
        if b" 402 " in head:
            break
        await client.read_events(3)
        client.hang_up()
        await settled(gateway)
        answered += 1
    assert answered == 2
    assert gateway.desk.outstanding(PAYER) == 2 * required
    while not script.queue.empty():  # the refused question's tokens were never asked for
        script.queue.get_nowait()


async def test_node_failure_after_tokens_went_out_charges_what_was_delivered(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    script.tokens(10, 11)
    await client.read_events(2)
    script.fail(NodeFailed("node_failed", "a compute node failed during the question (boom)"))
    events = await client.read_events(3)
    error = events[-1]
    assert error["error"]["code"] == "node_failed"
    assert "charged for the prompt and the 2 tokens delivered" in error["error"]["message"]
    assert error["planet_receipt"]["completion_tokens"] == 2
    await settled(gateway)
    assert gateway.desk.receipt(query) == error["planet_receipt"]


async def test_node_failure_before_any_token_releases_and_the_proof_stays_usable(env) -> None:
    server, gateway, escrow, script = env
    key, query = deposit(escrow)
    client = await RawClient.post(server.make_url(""), "/v1/chat/completions", stream_body(8), key)
    script.fail(NodeFailed("node_failed", "a compute node failed during the question (boom)"))
    head = await client.reader.read(4096)
    assert b" 502 " in head and b"nothing was charged" in head
    await settled(gateway)
    assert gateway.desk.receipt(query) is None
    assert gateway.desk.in_flight() == (0, 0)
    assert (await gateway.desk.reserve(gateway_app.parse_bearer(key), 1)).query_id == query


async def test_a_failed_write_is_charged_when_the_server_does_not_cancel_handlers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that does not cancel handlers on hang-up (aiohttp's default) learns of it from
    the next write: that token was handed to the writer, so it is charged too."""
    from aiohttp import web
    from yarl import URL

    script = Script()
    monkeypatch.setattr(ScriptedGeneration, "script", script, raising=False)
    monkeypatch.setattr(gateway_app, "Generation", ScriptedGeneration)
    escrow = FakeEscrow()
    async with aiohttp.ClientSession() as http:
        gateway = build_gateway(tmp_path, http, escrow)
        runner = web.AppRunner(create_app(gateway), handler_cancellation=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            key, query = deposit(escrow)
            client = await RawClient.post(
                URL(f"http://127.0.0.1:{port}"), "/v1/chat/completions", stream_body(8), key
            )
            script.tokens(10, 11, 12)
            await client.read_events(3)
            client.hang_up()
            await asyncio.sleep(0.05)
            script.tokens(13, 14)  # the 4th write fails: charged; the 5th is never asked for
            await settled(gateway)
            receipt = gateway.desk.receipt(query)
            assert receipt is not None and receipt["completion_tokens"] == 4
            assert script.queue.qsize() == 1
        finally:
            await runner.cleanup()
