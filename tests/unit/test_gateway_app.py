"""The gateway app through aiohttp's test client, with in-process fakes: two fake shard nodes
(real HTTP, tests.doubles.fake_shard.FakeShard), a fake client head, a fake escrow, a fake
committee. Covers error shapes (400/402/404/405/413/502/503), SSE framing, stop, logprobs and
payments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.gateway.app import create_app
from node.gateway.escrow_reads import OnChainDeposit
from node.gateway.sse import parse_events
from node.server.app import create_app as create_node_app
from node.server.config import ServerConfig
from node.server.next_hops import NextHopSpec
from protocol.eip712 import address_of
from protocol.payment import QueryPayment, sign_payment, verify_receipt_json
from tests.doubles.fake_shard import FakeShard
from tests.unit.gateway_fakes import (
    CHAT,
    DOMAIN,
    ESCROW,
    GATEWAY,
    MODEL_ID,
    NODE_KEYS,
    PRICE,
    USER,
    FakeEscrow,
    FakeSource,
    H,
    build_gateway,
)

pytestmark = pytest.mark.unit

FORWARD_ANY = NextHopSpec("any")


@pytest.fixture
async def env(aiohttp_server, aiohttp_client, tmp_path: Path):
    nodes = []
    for shard in range(2):
        backend = FakeShard(shard_id=shard, hidden_size=H, layers=(shard * 2, shard * 2 + 2))
        # in-process fakes on loopback: the circuit's next hop is whatever the router picked
        config = ServerConfig(manifest_path=Path("x"), shard_id=shard, next_hops=FORWARD_ANY)
        nodes.append(await aiohttp_server(create_node_app(config, backend)))
    entries = [
        {
            "key": NODE_KEYS[i],
            "endpoint": str(s.make_url("")).rstrip("/"),
            "shards": [i],
            "routable": True,
        }
        for i, s in enumerate(nodes)
    ]
    escrow = FakeEscrow()
    http = aiohttp.ClientSession()
    source = FakeSource(entries)
    gateway = build_gateway(tmp_path, http, escrow, source)
    client = await aiohttp_client(create_app(gateway))
    yield client, escrow, source, nodes
    await http.close()


_queries = iter(range(1, 10**6))


def pay(escrow: FakeEscrow, amount: int = 10**9, **kw: Any) -> tuple[dict[str, str], bytes]:
    query = next(_queries).to_bytes(32, "big")
    escrow.deposits[query] = OnChainDeposit(
        kw.get("depositor", address_of(USER)),
        amount,
        kw.get("status", 1),
        kw.get("model", MODEL_ID),
    )
    payment = QueryPayment(query, MODEL_ID, GATEWAY, kw.get("cap", amount))
    key = sign_payment(kw.get("signer", USER), payment, DOMAIN)
    return {"Authorization": f"Bearer {key}"}, query


async def test_gateway_chat_whole_answer_usage_receipt(env) -> None:
    client, escrow, _, _ = env
    headers, query = pay(escrow)
    answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=headers
    )
    assert answer.status == 200
    body = await answer.json()
    # last prompt token 3 → 6, 9, 12, 15
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "gjmp",
        "refusal": None,
    }
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    receipt, signer = verify_receipt_json(body["planet_receipt"], DOMAIN)
    assert signer == GATEWAY and receipt.fee == 7 * PRICE
    assert body["planet_receipt"]["nodes"] == NODE_KEYS
    again = await client.get(f"/v1/receipts/0x{query.hex()}", headers=headers)
    assert await again.json() == body["planet_receipt"]
    # strangers (no key, or another payer's key) cannot link the query id to its nodes
    await _error(await client.get(f"/v1/receipts/0x{query.hex()}"), 404)
    other, _ = pay(escrow)
    await _error(await client.get(f"/v1/receipts/0x{query.hex()}", headers=other), 404)


async def test_gateway_chat_stream_sse_framing_usage_and_done(env) -> None:
    client, escrow, _, _ = env
    headers, _ = pay(escrow)
    doc = {**CHAT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    answer = await client.post("/v1/chat/completions", json=doc, headers=headers)
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    raw = await answer.read()
    assert raw.endswith(b"data: [DONE]\n\n")
    events = parse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1]) == "gjm"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:-1])
    assert "planet_receipt" in chunks[-1]


async def test_gateway_stop_sequence_and_logprobs(env) -> None:
    client, escrow, _, _ = env
    headers, _ = pay(escrow)
    doc = {**CHAT, "max_tokens": 6, "stop": ["m"], "logprobs": True, "top_logprobs": 2}
    body = await (await client.post("/v1/chat/completions", json=doc, headers=headers)).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "gj" and choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == ["g", "j", "m"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)


async def test_gateway_completions_stream_text_completion_chunks(env) -> None:
    client, escrow, _, _ = env
    headers, _ = pay(escrow)
    # temperature 0: OpenAI's default of 1 samples off the fake logits' peak 0.2 % of the time
    doc = {
        "model": "fake-model",
        "prompt": [1, 2],
        "max_tokens": 2,
        "stream": True,
        "temperature": 0,
    }
    events = parse_events(
        await (await client.post("/v1/completions", json=doc, headers=headers)).read()
    )
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "fi"


async def _error(answer: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    assert answer.status == status
    body = await answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("doc", "code"),
    [
        ({**CHAT, "max_tokens": -1}, "out_of_range"),
        ({**CHAT, "messages": "x"}, "invalid_type"),
        ({**CHAT, "max_tokens": 62}, "context_length_exceeded"),
        ({"model": "fake-model", "prompt": [1, 99]}, "invalid_value"),
    ],
)
async def test_gateway_bad_requests_are_400_before_payment(env, doc, code) -> None:
    client, _, _, _ = env
    path = "/v1/completions" if "prompt" in doc else "/v1/chat/completions"
    error = await _error(await client.post(path, json=doc), 400)
    assert error["code"] == code and error["type"] == "invalid_request_error"


async def test_gateway_transport_errors_in_openai_shape(env) -> None:
    client, _, _, _ = env
    big = b'{"model": "' + b"x" * 70_000 + b'"}'
    as_json = {"Content-Type": "application/json"}
    post = client.post
    assert (await _error(await post("/v1/chat/completions", data=big, headers=as_json), 413))[
        "code"
    ] == "body_too_large"
    assert (await _error(await post("/v1/chat/completions", data=b"{", headers=as_json), 400))[
        "code"
    ] == "invalid_json"
    # only JSON bodies, at the hosted gateway too: a text/plain or form body is no question
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        refused = await post("/v1/chat/completions", data=json.dumps(CHAT), headers=headers)
        assert (await _error(refused, 415))["code"] == "unsupported_media_type"
    await _error(await client.get("/v1/nothing"), 404)
    await _error(await client.get("/v1/chat/completions"), 405)
    wrong = {**CHAT, "model": "gpt-4"}
    assert (await _error(await client.post("/v1/chat/completions", json=wrong), 404))["code"] == (
        "model_not_found"
    )
    await _error(await client.get("/v1/receipts/nothex"), 400)
    await _error(await client.get("/v1/receipts/0x" + "00" * 32), 404)


async def test_gateway_payment_refusals_are_402(env) -> None:
    client, escrow, _, _ = env

    async def code(headers: dict[str, str] | None) -> str:
        answer = await client.post(
            "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=headers or {}
        )
        error = await _error(answer, 402)
        assert error["type"] == "payment_required"
        return error["code"]

    assert await code(None) == "payment_malformed"
    assert await code({"Authorization": "Bearer sk-123"}) == "payment_malformed"
    # required = PRICE × (3 prompt + 4 max) = 7000
    assert await code(pay(escrow, amount=6999)[0]) == "payment_underfunded"
    assert await code(pay(escrow, amount=10**9, cap=6999)[0]) == "payment_underfunded"
    assert await code(pay(escrow, amount=5000, cap=10**6)[0]) == "payment_underfunded"
    assert await code(pay(escrow, signer=bytes.fromhex("33" * 32))[0]) == "payment_squatted"
    assert await code(pay(escrow, model=b"\x01" * 32)[0]) == "payment_wrong_model"
    assert await code(pay(escrow, status=2)[0]) == "payment_closed"
    headers, query = pay(escrow)
    del escrow.deposits[query]
    assert await code(headers) == "payment_unfunded"
    headers, _ = pay(escrow)
    ok = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=headers)
    assert ok.status == 200
    assert await code(headers) == "payment_used"


async def test_gateway_dead_node_is_503_no_receipt_and_the_deposit_stays_usable(env) -> None:
    client, escrow, source, nodes = env
    headers, query = pay(escrow)
    await nodes[1].close()  # shard 1 goes away

    async def ask() -> dict[str, Any]:
        answer = await client.post(
            "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=headers
        )
        return await _error(answer, 503)

    # the first circuit fails, the retry finds shard 1's only node cooled down: no circuit
    assert (await ask())["code"] == "no_routable_node"
    await _error(await client.get(f"/v1/receipts/0x{query.hex()}", headers=headers), 404)
    # the query id was released, not burnt: the same proof fails the same way, not payment_used
    assert (await ask())["code"] == "no_routable_node"
    source.entries = []
    assert (await ask())["code"] == "no_routable_node"


async def test_gateway_node_error_after_retries_is_502_and_charges_nothing(
    env, aiohttp_server
) -> None:
    client, escrow, source, _ = env
    failing = FakeShard(shard_id=1, hidden_size=H, layers=(2, 4), fail_with=RuntimeError("boom"))
    server = await aiohttp_server(
        create_node_app(ServerConfig(manifest_path=Path("x"), shard_id=1), failing)
    )
    source.entries[1] = {**source.entries[1], "endpoint": str(server.make_url("")).rstrip("/")}
    headers, query = pay(escrow)
    answer = await client.post(
        "/v1/chat/completions", json={**CHAT, "max_tokens": 4}, headers=headers
    )
    error = await _error(answer, 502)
    assert error["code"] == "node_failed" and "nothing was charged" in error["message"]
    await _error(await client.get(f"/v1/receipts/0x{query.hex()}", headers=headers), 404)


async def test_gateway_pools_and_models(env) -> None:
    client, _, _, _ = env
    pools = (await (await client.get("/v1/pools")).json())["data"][0]
    assert pools["price_wei_per_token"] == str(PRICE) and pools["routable_per_shard"] == [1, 1]
    assert pools["gateway"] == GATEWAY and pools["escrow"] == ESCROW
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "fake-model"
    assert (await client.get("/health")).status == 200


# a completion echoing its prompt [1, 2, 5], greedy (OpenAI's default temperature 1 samples
# off the fake logits' peak 0.2 % of the time)
ECHO = {"model": "fake-model", "prompt": [1, 2, 5], "echo": True, "temperature": 0}


async def test_gateway_completions_echo_gives_every_prompt_tokens_logprob(env) -> None:
    """echo + logprobs: the prompt's tokens come first with their logprobs from the same
    prefill (the first token has none); prompt [1, 2, 5]: position 0 predicts 4 (so token 2
    is unlikely), position 1 predicts 5 (token 5 is likely), then 5 → 8 is the answer."""
    client, escrow, _, _ = env
    headers, _ = pay(escrow)
    doc = {**ECHO, "max_tokens": 1}
    body = await (
        await client.post("/v1/completions", json={**doc, "logprobs": 2}, headers=headers)
    ).json()
    choice = body["choices"][0]
    assert choice["text"] == "bcfi"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["b", "c", "f", "i"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1] < -9 and -0.01 < lp["token_logprobs"][2] <= 0
    assert next(iter(lp["top_logprobs"][1])) == "e" and len(lp["top_logprobs"][2]) == 2
    assert lp["text_offset"] == [0, 1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert body["planet_receipt"]["nodes"] == NODE_KEYS
    headers, _ = pay(escrow)
    plain = await (await client.post("/v1/completions", json=doc, headers=headers)).json()
    assert plain["choices"][0]["text"] == "bcfi" and plain["choices"][0]["logprobs"] is None


async def test_gateway_every_question_prefills_like_an_echo_request(env, monkeypatch) -> None:
    """The last node cannot tell an echo request (a verifier's challenge) from a chat question:
    both prompts' frames ask for every position; decode steps ask for the last one."""
    from node.client.circuit import CircuitClient

    seen: list[tuple[int, bool]] = []
    original = CircuitClient.send

    async def recording(self, sid, start, hidden, last_only=True, *, rewind=False):
        seen.append((int(hidden.shape[1]), last_only))
        return await original(self, sid, start, hidden, last_only, rewind=rewind)

    monkeypatch.setattr(CircuitClient, "send", recording)
    client, escrow, _, _ = env
    headers, _ = pay(escrow)
    await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}, headers=headers)
    chat = list(seen)
    seen.clear()
    headers, _ = pay(escrow)
    doc = {**ECHO, "max_tokens": 3}
    await client.post("/v1/completions", json={**doc, "logprobs": 5}, headers=headers)
    assert chat == seen == [(3, False), (1, True), (1, True)]
