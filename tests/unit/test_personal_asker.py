"""The verifier's `PersonalAsker` parses what its personal client answers at one boundary: the
model it serves must be the verifier's, and the answer's receipt must name the circuit; anything
else is a named error, never a score attributed to nobody (in-process HTTP server)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node.verifier.asker import PersonalAsker
from node.verifier.scoring import Challenge
from protocol.errors import ConfigError, ProtocolError, RemoteError, UnavailableError

pytestmark = pytest.mark.unit

MODEL_HASH = "sha256:" + "ab" * 32
KEY_A, KEY_B = "11" * 32, "22" * 32
CHALLENGE = Challenge((1, 2, 3), (4, 5))
TOKEN = "planet-personal-" + "t" * 43


async def _client(
    aiohttp_server: Any, receipt: Any, status: int = 200, route: Any = "uniform"
) -> tuple[str, list]:
    """A personal client double: /v1/models and /v1/completions answering `receipt`."""
    bodies: list[dict[str, Any]] = []

    async def models(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"  # the client's token
        model = {"id": "smollm2-135m", "planet_model_hash": MODEL_HASH, "planet_route": route}
        return web.json_response({"data": [model]})

    async def completions(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        bodies.append(await request.json())
        if status != 200:
            return web.json_response({"error": {"message": "no"}}, status=status)
        return web.json_response({"choices": [], "planet_receipt": receipt})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), bodies


async def test_the_receipts_nodes_are_the_circuit_and_the_request_names_the_model(
    aiohttp_server,
) -> None:
    url, bodies = await _client(aiohttp_server, {"paid_with": "credits", "nodes": [KEY_A, KEY_B]})
    async with aiohttp.ClientSession() as http:
        asked = await PersonalAsker(url, http, MODEL_HASH, TOKEN).ask(CHALLENGE)
    assert asked.nodes == (KEY_A, KEY_B)
    assert bodies[0]["model"] == "smollm2-135m" and bodies[0]["echo"] is True


@pytest.mark.parametrize("route", ["private", None, 7, "fastest", "x" * 100_000, {"a": [[[]]]}])
async def test_a_client_that_keeps_its_nodes_is_refused_before_any_challenge(
    aiohttp_server, route: Any
) -> None:
    """Its guards would take every challenge to the same nodes for a month (or it says nothing
    of how it routes): refused at the verifier's start, with the flag to use."""
    url, bodies = await _client(aiohttp_server, {"paid_with": "credits"}, route=route)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ConfigError, match="must reach every routable node") as caught:
            await PersonalAsker(url, http, MODEL_HASH, TOKEN).model()
    assert "--route uniform" in (caught.value.hint or "")
    assert len(caught.value.message) < 300  # a stranger's huge value is not echoed whole
    assert bodies == []


@pytest.mark.parametrize(
    "receipt",
    [
        None,
        {"paid_with": "credits"},
        {"paid_with": "credits", "nodes": []},
        {"paid_with": "credits", "nodes": ["not a key"]},
        {"paid_with": "credits", "nodes": [KEY_A, 7]},
        {"paid_with": "wei", "nodes": [KEY_A, KEY_B]},
    ],
)
async def test_a_receipt_that_names_no_circuit_is_refused_by_name(
    aiohttp_server, receipt: Any
) -> None:
    url, _ = await _client(aiohttp_server, receipt)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ProtocolError, match="names no circuit"):
            await PersonalAsker(url, http, MODEL_HASH, TOKEN).ask(CHALLENGE)


async def test_an_answer_that_is_not_json_is_refused_by_name(aiohttp_server) -> None:
    async def models(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"  # the client's token
        model = {"id": "m", "planet_model_hash": MODEL_HASH, "planet_route": "cost"}
        return web.json_response({"data": [model]})

    async def completions(request: web.Request) -> web.Response:
        return web.Response(body=b"\xff" * 100_000 + b"{[")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http:
        asker = PersonalAsker(str(server.make_url("")).rstrip("/"), http, MODEL_HASH, TOKEN)
        with pytest.raises(ProtocolError, match="no planet_receipt"):
            await asker.ask(CHALLENGE)


async def test_another_model_a_refusal_and_no_client_are_named_errors(aiohttp_server) -> None:
    url, bodies = await _client(aiohttp_server, {}, status=402)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(ProtocolError, match="serves model"):
            await PersonalAsker(url, http, "sha256:" + "cd" * 32, TOKEN).ask(CHALLENGE)
        assert bodies == []  # nothing asked of a client serving another model
        with pytest.raises(RemoteError, match="http_402"):
            await PersonalAsker(url, http, MODEL_HASH, TOKEN).ask(CHALLENGE)
        with pytest.raises(UnavailableError, match="unreachable"):
            await PersonalAsker("http://127.0.0.1:9", http, MODEL_HASH, TOKEN).ask(CHALLENGE)
