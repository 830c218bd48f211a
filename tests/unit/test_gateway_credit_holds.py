"""The hosted gateway never pays for an answer nobody pays for (issue 42, attack 8).

Before: a question started whatever the gateway's credit wallet held, paid the nodes as the
answer ran, and when the wallet ran dry mid-answer a non-streamed question ended 503
`gateway_out_of_credits` with its user's hold released — the nodes had the gateway's credits,
the user paid nothing. Now a question holds the credits its circuit can cost before anything is
sent to that circuit's nodes (node/gateway/credit_holds.py): it is refused up front when it
cannot, and one that still outruns its hold (a failover, credits gone from under the holds) is
charged for what its nodes computed, which it gets.

The real gateway app, `engine.Generation`, `failover.generate`, `HostedPayer` and the
`CircuitClient` payment path, over fake nodes (tests/unit/gateway_credit_fakes.py). Prices:
a credit per 4 positions at shard 0 and per 5 at shard 1; a 3-token prompt and max_tokens 8
send each hop at most 3 + 7 = 10 positions: a circuit costs ceil(10/4) + ceil(10/5) = 5."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.gateway.app import create_app
from node.gateway.credit_holds import circuit_credits, session_positions
from tests.unit.gateway_credit_fakes import fail_pass, paid_gateway
from tests.unit.gateway_fakes import CHAT, FakeEscrow, RawClient, Script
from tests.unit.test_gateway_hangups import deposit, settled, stream_body

pytestmark = pytest.mark.unit

PRICES = [4, 5]
MAX_TOKENS = 8
COST = 5  # one circuit, one session: ceil(10 / 4) + ceil(10 / 5)


class Env:
    """One gateway over fake paid nodes, with `wallet` credits."""

    def __init__(self, aiohttp_server: Any, tmp_path: Path, wallet: int) -> None:
        self.aiohttp_server, self.tmp_path, self.initial = aiohttp_server, tmp_path, wallet

    async def __aenter__(self) -> Env:
        self.script = Script()
        self.escrow = FakeEscrow()
        self.http = aiohttp.ClientSession()
        made = paid_gateway(
            self.tmp_path,
            self.http,
            self.escrow,
            self.script,
            prices=PRICES,
            wallet_credits=self.initial,
        )
        self.gateway, self.payer, self.nodes, self.router, self.spy = made
        self.server = await self.aiohttp_server(create_app(self.gateway))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()
        await self.http.close()

    async def ask(self, stream: bool, max_tokens: int = MAX_TOKENS) -> tuple[RawClient, bytes]:
        key, query = deposit(self.escrow)
        body = stream_body(max_tokens) if stream else {**CHAT, "max_tokens": max_tokens}
        client = await RawClient.post(self.server.make_url(""), "/v1/chat/completions", body, key)
        return client, query

    def passes(self, count: int) -> None:
        self.script.tokens(*range(count))  # each releases one pass of the nodes

    def balanced(self, taken_elsewhere: int = 0) -> None:
        """Every hold released exactly once, nothing held, no credit lost or made."""
        reserve = self.payer.reserve
        assert reserve.reserved == 0 and not reserve.holds
        assert self.spy.releases == [True] * len(self.spy.holds), self.spy.releases
        wallet = self.payer.wallet.count()
        assert wallet + self.nodes.credits + taken_elsewhere == self.initial

    def paid_only_if_charged(self, query: bytes) -> None:
        """The property: the gateway's credits went to nodes for this question only if its
        user was charged for it."""
        if self.nodes.credits:
            assert self.gateway.desk.receipt(query) is not None, "nodes paid, user charged nothing"


async def answer(client: RawClient) -> tuple[int, dict[str, Any]]:
    async with asyncio.timeout(10):
        head = await client.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return status, json.loads(await client.reader.readexactly(length))


def test_the_bound_is_what_a_session_can_send() -> None:
    assert session_positions(3, MAX_TOKENS) == 10
    assert circuit_credits(PRICES, 10) == COST and circuit_credits([0, 16], 10) == 1
    # speculative decoding: each pass may carry min(k, tokens still wanted − 1) guesses
    assert session_positions(3, 4, lookahead=2) == 3 + (1 + 2) + (1 + 1) + (1 + 0)
    assert session_positions(3, 1) == 3  # the only token is never fed back


async def test_a_question_the_wallet_cannot_cover_is_refused_before_any_node_is_asked(
    aiohttp_server, tmp_path: Path
) -> None:
    async with Env(aiohttp_server, tmp_path, COST - 1) as env:
        env.passes(MAX_TOKENS)
        client, query = await env.ask(stream=False)
        status, body = await answer(client)
        await settled(env.gateway)
        assert status == 503 and body["error"]["code"] == "gateway_out_of_credits"
        assert "nothing was charged" in body["error"]["message"]
        assert env.nodes.credits == 0 and env.nodes.frames == 0  # nothing sent to any node
        assert env.gateway.desk.receipt(query) is None  # released: the proof pays another
        assert env.gateway.desk.in_flight() == (0, 0)
        env.balanced()


@pytest.mark.parametrize("stream", [False, True])
async def test_whatever_the_wallet_holds_nodes_are_paid_only_for_charged_answers(
    aiohttp_server, tmp_path: Path, stream: bool
) -> None:
    """Every wallet size from empty to past a circuit's cost: the answer is whole and charged,
    and its nodes got exactly the circuit's cost, or it is refused before any node is paid."""
    for held in range(0, COST + 3):
        async with Env(aiohttp_server, tmp_path / f"{stream}-{held}", held) as env:
            env.passes(MAX_TOKENS)
            client, query = await env.ask(stream)
            if stream and held >= COST:
                events = await client.read_events(MAX_TOKENS + 1)
                assert events[-1]["planet_receipt"]["completion_tokens"] == MAX_TOKENS
            else:
                status, body = await answer(client)
                assert status == (200 if held >= COST else 503), (held, body)
            await settled(env.gateway)
            env.paid_only_if_charged(query)
            assert env.nodes.credits == (COST if held >= COST else 0), held
            env.balanced()


async def test_two_questions_never_hold_the_same_credits(aiohttp_server, tmp_path: Path) -> None:
    """A wallet of 7 while a question holds 5: a second one is refused up front (before, both
    started; one ran dry mid-answer after its nodes were paid, and its user paid nothing)."""
    async with Env(aiohttp_server, tmp_path, COST + 2) as env:
        first, _ = await env.ask(stream=False)
        async with asyncio.timeout(5):
            while not (env.spy.holds and env.spy.holds[0].held + env.spy.holds[0].drawn == COST):
                await asyncio.sleep(0.01)
        second, second_query = await env.ask(stream=False)
        status, body = await answer(second)
        assert status == 503 and body["error"]["code"] == "gateway_out_of_credits"
        assert env.gateway.desk.receipt(second_query) is None
        env.passes(MAX_TOKENS)
        status, body = await answer(first)
        assert status == 200 and body["planet_receipt"]["completion_tokens"] == MAX_TOKENS
        await settled(env.gateway)
        assert env.nodes.credits == COST and env.payer.wallet.count() == 2
        env.balanced()


@pytest.mark.parametrize("stream", [False, True])
async def test_hang_ups_at_every_point_release_every_hold_once(
    aiohttp_server, tmp_path: Path, stream: bool
) -> None:
    """The client leaves while queued, once the prompt went out, after each pass, and (a
    stream) after the last token: every hold is released exactly once, nothing stays held, the
    credits sent are charged to the user."""
    points: list[Any] = ["queued", 0, *range(1, MAX_TOKENS + (1 if stream else 0))]
    for point in points:
        async with Env(aiohttp_server, tmp_path / f"{stream}-{point}", COST) as env:
            if point == "queued":
                env.script.admitted.clear()
            client, query = await env.ask(stream)
            async with asyncio.timeout(5):
                if point == "queued":
                    while not env.gateway.desk.in_flight()[0]:
                        await asyncio.sleep(0.01)
                else:
                    await env.script.started.wait()  # the prompt went to the nodes
                    env.passes(point)
                    if stream and point:
                        await client.read_events(point)
                    while not env.script.queue.empty():
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.02)
            client.hang_up()
            await settled(env.gateway)
            env.paid_only_if_charged(query)
            env.balanced()
            if point == "queued":
                assert env.nodes.credits == 0 and env.gateway.desk.receipt(query) is None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failover_the_wallet_cannot_cover_charges_what_the_nodes_computed(
    aiohttp_server, tmp_path: Path, stream: bool
) -> None:
    """A node fails after 3 tokens; the replacement circuit needs 5 more credits, the wallet
    has 2 unheld: the question fails `gateway_out_of_credits` and its user pays for the prompt
    and the 3 tokens (handed over: `planet_partial`, or already streamed) — the first
    circuit's nodes were paid. With credits for the replacement, the answer goes on whole."""
    async with Env(aiohttp_server, tmp_path / "short", COST + 2) as env:
        env.passes(3)
        env.script.fail(fail_pass())
        client, query = await env.ask(stream)
        if stream:
            events = await client.read_events(4)
            error = events[-1]
            assert error["error"]["code"] == "gateway_out_of_credits"
            assert error["planet_receipt"]["completion_tokens"] == 3
        else:
            status, body = await answer(client)
            assert status == 503 and body["error"]["code"] == "gateway_out_of_credits"
            assert body["planet_partial"]["completion_tokens"] == 3
            assert body["planet_receipt"]["completion_tokens"] == 3
            assert "charged for the prompt and the 3 tokens" in body["error"]["message"]
        await settled(env.gateway)
        assert env.nodes.credits == 4 and env.router.leases == 2
        env.paid_only_if_charged(query)
        env.balanced()
    async with Env(aiohttp_server, tmp_path / "enough", 2 * COST) as env:
        env.passes(3)
        env.script.fail(fail_pass())
        env.passes(MAX_TOKENS)
        client, query = await env.ask(stream=False)
        status, body = await answer(client)
        assert status == 200 and body["planet_receipt"]["completion_tokens"] == MAX_TOKENS
        await settled(env.gateway)
        assert env.nodes.credits == 4 + COST
        env.balanced()


async def test_credits_gone_from_under_a_hold_still_leave_no_free_answer(
    aiohttp_server, tmp_path: Path
) -> None:
    """The wallet loses its credits mid-answer (the top-up drops expired ones): the question
    runs past what the wallet can pay and is charged for the tokens its nodes computed."""
    async with Env(aiohttp_server, tmp_path, COST) as env:
        client, query = await env.ask(stream=False)
        await env.script.started.wait()
        env.passes(2)
        while not env.script.queue.empty():
            await asyncio.sleep(0.01)
        gone = env.payer.wallet.count()
        env.payer.wallet.take(gone)  # out from under the hold
        env.passes(MAX_TOKENS)
        status, body = await answer(client)
        assert status == 503 and body["error"]["code"] == "gateway_out_of_credits"
        tokens = body["planet_partial"]["completion_tokens"]
        assert tokens >= 2 and body["planet_receipt"]["completion_tokens"] == tokens
        await settled(env.gateway)
        env.paid_only_if_charged(query)
        env.balanced(taken_elsewhere=gone)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failover_during_the_prompt_charges_the_prompt_the_nodes_were_paid_for(
    aiohttp_server, tmp_path: Path, stream: bool
) -> None:
    """The first circuit fails before its first token (its nodes were paid for the prompt: 2
    credits); the replacement needs 2 more than the question still holds and 1 is unheld: a
    503 that charges the prompt, with nothing to hand over — never a release."""
    async with Env(aiohttp_server, tmp_path, COST + 1) as env:
        env.script.fail(fail_pass())
        client, query = await env.ask(stream)
        status, body = await answer(client)
        assert status == 503 and body["error"]["code"] == "gateway_out_of_credits"
        assert body["planet_partial"] == {"text": "", "completion_tokens": 0}
        receipt = env.gateway.desk.receipt(query)
        assert receipt is not None and receipt["completion_tokens"] == 0
        assert body["planet_receipt"] == receipt
        await settled(env.gateway)
        assert env.nodes.credits == 2
        env.paid_only_if_charged(query)
        env.balanced()
