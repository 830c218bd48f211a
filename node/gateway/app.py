"""The gateway's HTTP API (aiohttp): OpenAI's routes plus pools, receipts and health.

    GET  /health                     200 when the gateway can answer
    GET  /v1/models                  the models this gateway serves (models.py: their names)
    GET  /v1/pools                   per model: pool health per shard (committee), the price
    POST /v1/chat/completions        chat, streamed (SSE) or not
    POST /v1/completions             plain completion, streamed (SSE) or not
    GET  /v1/receipts/{query_id}     the signed receipt of a served query (its payer's key)
    GET  /v1/key                     a payment key's running total, hold and cap (that key)
    POST /v1/keys/revoke             a payer-signed revocation of one of its payment keys

Handlers stay thin: the body goes through `requests` (400 on any broken rule), the API key
through `protocol.payment.parse_bearer` and `PaymentDesk.reserve` (402), the question through
`engine.Generation` over a circuit of nodes that forward to each other (`circuits.CircuitPool`:
one live CircuitClient per circuit, closed at app cleanup; 503 without a circuit, 502 when a
node fails). Every refusal is OpenAI's `{"error": {message, type, param, code}}` (error
middleware). What a question costs is decided by its `payment_state.QuestionPayment`, closed in
a `finally` on every path: each token handed to the writer is charged (a failed write too: the
client hung up, the nodes did the work), and only a question that delivered nothing is
released (no receipt, no charge).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from node.client.sampling import SamplingConfig
from node.client.types import Head
from node.gateway import sse
from node.gateway.circuits import CircuitPool
from node.gateway.config import GatewayConfig
from node.gateway.credit_holds import CURRENT_HOLD, CreditHold
from node.gateway.credit_payer import GatewayOutOfCredits, HostedPayer
from node.gateway.dapp import add_dapp_routes
from node.gateway.engine import Generation, TokenEvent
from node.gateway.errors import (
    ApiError,
    InvalidRequest,
    NodeFailed,
    NotFound,
    UnsupportedMediaType,
    error_body,
    planet_error_body,
)
from node.gateway.models import ModelInfo, ModelRoute, ModelTable
from node.gateway.payment_state import QuestionPayment
from node.gateway.payments import PaymentDesk
from node.gateway.requests import (
    ChatRequest,
    CompletionRequest,
    parse_body,
    parse_chat,
    parse_completion,
)
from node.gateway.router import Router, pool_view
from node.gateway.shapes import Shaper, usage
from node.gateway.textstream import TextStream
from protocol.errors import PlanetError
from protocol.payment import PaymentKeyError, PaymentKeyProof, Proof, parse_bearer

log = logging.getLogger(__name__)

_QUERY_ID = re.compile(r"(0x)?([0-9a-fA-F]{64})\Z")
_KEY_ID = re.compile(r"0x[0-9a-f]{64}\Z")
_SIGNATURE = re.compile(r"0x[0-9a-f]{130}\Z")


@dataclass
class Gateway:
    config: GatewayConfig
    model: ModelInfo
    head: Head  # the client part of the model (node.model.head.ClientHead)
    router: Router
    desk: PaymentDesk
    committee: Any  # has `async abci_query(path)`
    http: aiohttp.ClientSession  # keep-alive to the nodes
    chain_id: int
    escrow: str
    ledger: Any = None  # `node.gateway.settlement.WorkLedger` (None: no work reports)
    # pays the charging nodes with credits as answers run (`CreditPayer`: the personal client's,
    # node/gateway/personal.py; the hosted gateway's `HostedPayer`, credit_payer.py)
    payer: Any = None
    top_up: Any = None  # keeps the payer's wallet stocked (hosted: topup.py `TopUp`), or None
    # the personal client's overlay (node/client/overlay.py `OverlayRoute`): None, direct links
    overlay: Any = None
    # the models served after `model` (models.py: each with its own head and router; their
    # nodes are paid by the same payer, their users by the same desk)
    more_models: Sequence[ModelRoute] = ()
    circuits: CircuitPool = field(init=False)  # live circuit clients per circuit, on `http`
    models: ModelTable = field(init=False)  # every served model, `model` first

    def __post_init__(self) -> None:
        first = ModelRoute(self.model, self.head, self.router)
        for route in (first, *self.more_models):
            route.circuits = CircuitPool(
                self.http,
                hidden_size=route.head.hidden_size,
                dtype=self.config.wire_dtype,
                request_timeout_s=self.config.node_timeout_s,
                payer=self.payer,
                overlay=None if self.overlay is None else self.overlay.dialer(self.http),
            )
        self.circuits = first.circuits
        self.models = ModelTable([first, *self.more_models])

    def routes(self) -> list[ModelRoute]:
        """Every served model, the first as the gateway's own fields hold it now."""
        return [self._live(route) for route in self.models.routes]

    def route(self, name: str) -> ModelRoute:
        """The model a question names (404 `model_not_found`, naming the served ones)."""
        return self._live(self.models.route(name))

    def _live(self, route: ModelRoute) -> ModelRoute:
        if route is not self.models.first:
            return route
        return ModelRoute(self.model, self.head, self.router, self.circuits)


GATEWAY_KEY = web.AppKey("gateway", Gateway)
Middleware = Callable[..., Awaitable[web.StreamResponse]]


# --------------------------------------------------------------------------------- middleware


def _json_error(status: int, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=status)


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except PlanetError as error:
        status, body = planet_error_body(error)
        if status >= 500:
            log.warning("request failed path=%s code=%s %s", request.path, error.code, error)
        return _json_error(status, body)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[GATEWAY_KEY].config.max_body_bytes
        message = f"the request body is larger than {limit} bytes"
        return _json_error(413, error_body(413, "body_too_large", message))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status, "http_error")
        message = f"{request.method} {request.path}: {error.reason}"
        return _json_error(error.status, error_body(error.status, code, message))


# ----------------------------------------------------------------------------------- helpers


def bearer_proof(request: web.Request) -> Proof | PaymentKeyError:
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return PaymentKeyError("no API key (Authorization: Bearer <payment proof>)")
    try:
        return parse_bearer(key.strip())
    except PaymentKeyError as error:
        return error


async def _read_body(request: web.Request) -> dict[str, Any]:
    # only JSON: a cross-site form or "simple" request (text/plain, form bodies) cannot send
    # application/json without a CORS preflight, which this app never grants (issue 42)
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type", "")
        raise UnsupportedMediaType(
            "unsupported_media_type",
            f"the request body must be Content-Type: application/json, not {given[:80]!r}",
        )
    raw = await request.read()  # aiohttp enforces client_max_size (413)
    return parse_body(raw)


def _prompt_ids(head: Head, req: ChatRequest | CompletionRequest) -> list[int]:
    if isinstance(req, ChatRequest):
        ids = head.chat_ids([{"role": role, "content": text} for role, text in req.messages])
    elif isinstance(req.prompt, str):
        ids = head.encode(req.prompt)
    else:
        ids = list(req.prompt)
        if max(ids) >= head.vocab_size:
            raise InvalidRequest(
                "invalid_value", f"token ids must be below {head.vocab_size}", param="prompt"
            )
    if not ids:
        raise InvalidRequest("invalid_value", "the prompt has no tokens", param="prompt")
    limit = head.context_length
    if len(ids) + req.sampling.max_tokens > limit:
        raise InvalidRequest(
            "context_length_exceeded",
            f"this model's context is {limit} tokens; the prompt has {len(ids)} and max_tokens "
            f"asks for {req.sampling.max_tokens}",
            param="messages" if isinstance(req, ChatRequest) else "prompt",
        )
    return ids


def _sampling_config(req: ChatRequest | CompletionRequest) -> SamplingConfig:
    s = req.sampling
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, seed=s.seed)


def _want_logprobs(req: ChatRequest | CompletionRequest) -> tuple[bool, int]:
    if isinstance(req, ChatRequest):
        return req.logprobs, req.top_logprobs
    return req.logprobs is not None, req.logprobs or 0


# ---------------------------------------------------------------------------------- handlers


async def health(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    questions, held = gateway.desk.in_flight()
    return web.json_response(
        {
            "status": "ok",
            "model": gateway.model.name,
            "models": gateway.models.names(),
            "gateway": gateway.desk.gateway,
            "in_flight": questions,  # questions reserved, not yet charged or released
            "held_wei": str(held),  # what they hold
        }
    )


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": route.info.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "planet",
                    "planet_model_hash": route.info.model_hash,
                    "planet_aliases": list(route.info.aliases),
                    "planet_shards": route.info.shards,
                    # how its circuits are chosen (node/gateway/guards.py ROUTES): a verifier
                    # refuses a client that keeps the same nodes (node/verifier/asker.py)
                    "planet_route": route.router.route,
                }
                for route in gateway.routes()
            ],
        }
    )


async def pools(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    views = await asyncio.gather(
        *(
            pool_view(gateway.committee, route.info.model_hash, route.info.shards)
            for route in gateway.routes()
        )
    )
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "model": model.name,
                    "aliases": list(model.aliases),
                    "model_hash": model.model_hash,
                    "model_id": "0x" + model.model_id.hex(),
                    "shards": model.shards,
                    "routable_per_shard": view.get("routable_per_shard", [0] * model.shards),
                    "status": view.get("status", "incomplete"),
                    "price_wei_per_token": str(gateway.desk.price),
                    "chain_id": gateway.chain_id,
                    "escrow": gateway.escrow,
                    "gateway": gateway.desk.gateway,
                    "payment_domain": gateway.desk.domain.to_json(),
                }
                for model, view in zip(
                    (route.info for route in gateway.routes()), views, strict=True
                )
            ],
        }
    )


async def receipt(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    match = _QUERY_ID.match(request.match_info["query_id"])
    if match is None:
        raise InvalidRequest("invalid_value", "a query id is 0x + 64 hex", param="query_id")
    proof = bearer_proof(request)
    doc = gateway.desk.receipt_for(proof, bytes.fromhex(match[2]))
    if doc is None:
        raise NotFound(
            "receipt_not_found",
            "no receipt for this query id at this gateway for this API key "
            "(send the payment proof that paid it as the API key)",
        )
    return web.json_response(doc)


async def key_status(request: web.Request) -> web.Response:
    """The bearer payment key's running total, hold, cap, and its payer's outstanding here."""
    gateway = request.app[GATEWAY_KEY]
    proof = bearer_proof(request)
    if isinstance(proof, PaymentKeyError):
        await gateway.desk.reserve(proof, 0)  # raises the named 402 for a malformed key
    if not isinstance(proof, PaymentKeyProof):
        raise InvalidRequest(
            "invalid_value", "GET /v1/key needs a payment key (planet-key-v1...) as the API key"
        )
    # `?model=NAME`: the model the key was signed for (default: the gateway's first)
    model = gateway.route(request.query.get("model", gateway.model.name)).info
    return web.json_response(gateway.desk.key_status(proof, model.model_id))


async def revoke_key(request: web.Request) -> web.Response:
    """`{"key_id": "0x<64 hex>", "signature": "0x<130 hex>"}`: the payer's signature over
    `KeyRevocation(this gateway, key_id)` (`planet key revoke`); the key is refused from now on."""
    gateway = request.app[GATEWAY_KEY]
    body = await _read_body(request)
    key_id, signature = body.get("key_id"), body.get("signature")
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise InvalidRequest(
            "invalid_value", "key_id: expected 0x + 64 lowercase hex", param="key_id"
        )
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise InvalidRequest(
            "invalid_value", "signature: expected 0x + 130 lowercase hex", param="signature"
        )
    payer = await gateway.desk.revoke(bytes.fromhex(key_id[2:]), bytes.fromhex(signature[2:]))
    return web.json_response(
        {"revoked": True, "key_id": key_id, "payer": payer, "gateway": gateway.desk.gateway}
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, parse_chat)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, parse_completion)


async def _answer(request: web.Request, parse: Callable[..., Any]) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    req = parse(await _read_body(request), gateway.config.limits)
    route = gateway.route(req.model)  # 404 model_not_found, naming the served ones
    prompt_ids = await asyncio.to_thread(_prompt_ids, route.head, req)
    max_tokens = req.sampling.max_tokens
    required = gateway.desk.required_wei(len(prompt_ids), max_tokens)
    # the proof is checked against the model it signs (payments.py): one for another model fails
    reservation = await gateway.desk.reserve(bearer_proof(request), required, route.info.model_id)
    ledger = gateway.ledger
    payment = QuestionPayment(
        gateway.desk,
        reservation,
        len(prompt_ids),
        on_charged=ledger.record if ledger is not None else None,
    )
    want, top = _want_logprobs(req)
    # the hosted gateway's credits this question holds for its nodes (credit_holds.py)
    hold = gateway.payer.hold() if isinstance(gateway.payer, HostedPayer) else None
    generation = Generation(
        route.router,
        route.head,
        route.circuits,
        prompt_ids,
        max_tokens=max_tokens,
        sampling=_sampling_config(req),
        logprobs=want,
        top_logprobs=top,
        attempts=gateway.config.attempts,
        stall_s=gateway.config.stall_s,
        speculate=gateway.config.speculate,
        ring=gateway.config.ring,
        echo=isinstance(req, CompletionRequest) and req.echo,
        full_prefill=gateway.config.full_prefill,
        credits=hold,
    )
    shaper = Shaper(req.kind, route.info.name, route.head.token_text, want)
    holding = CURRENT_HOLD.set(hold)  # the pays made for this question draw on its hold
    try:
        if req.sampling.stream:
            return await _stream(request, route.head, req, generation, shaper, payment)
        return await _whole(route.head, req, generation, shaper, payment, hold)
    except asyncio.CancelledError:  # the client hung up (aiohttp cancels its handler)
        payment.client_gone(generation.circuit, prompt_sent=generation.started)
        raise
    except NodeFailed as error:
        if payment.consumed:
            raise
        raise NodeFailed(error.code, f"{error.message}; nothing was charged, ask again") from None
    except GatewayOutOfCredits as error:  # the gateway could not pay the nodes: 503
        if payment.consumed:
            raise
        if hold is not None and hold.drawn:  # its nodes were paid: the user pays the prompt
            return _paid_refusal(error, payment, generation, [], "")
        raise error.uncharged() from None
    finally:
        payment.close(generation.circuit)  # the one exit: charge what went out, else release
        if hold is not None:
            hold.release()  # what it still holds goes back to the wallet's unheld credits
        CURRENT_HOLD.reset(holding)


def _paid_refusal(
    error: GatewayOutOfCredits,
    payment: QuestionPayment,
    generation: Generation,
    events: list[TokenEvent],
    text: str,
) -> web.Response:
    """The gateway ran out of credits after it paid nodes for this question (it outran its
    hold: credit_holds.py): the user is charged for the prompt and the `events` the nodes
    computed, which this 503 hands over (`planet_partial`), with the receipt."""
    payment.deliver(len(events))
    payment.failed(generation.circuit)  # serving: charges the prompt and what was delivered
    status, body = planet_error_body(error)
    body["error"]["message"] += (
        f"; charged for the prompt and the {len(events)} tokens computed before it "
        "(planet_partial, planet_receipt)"
    )
    body["planet_partial"] = {"text": text, "completion_tokens": len(events)}
    body["planet_receipt"] = payment.receipt
    log.warning("question outran the gateway's credits; charged what its nodes computed")
    return web.json_response(body, status=status, dumps=_dumps)


async def _whole(
    head: Head,
    req: ChatRequest | CompletionRequest,
    generation: Generation,
    shaper: Shaper,
    payment: QuestionPayment,
    hold: CreditHold | None = None,
) -> web.Response:
    """A non-streamed answer: nothing is handed to the writer before the whole body, so a
    question that fails before it is released; once the body is built every token is charged
    (a client that hung up meanwhile still pays: the nodes answered it). One that outruns the
    gateway's credits after its nodes were paid hands over what they computed, charged."""
    prompt_ids = generation.prompt_ids
    text = TextStream(head.decode, req.sampling.stop)
    events: list[TokenEvent] = []
    try:
        async with contextlib.aclosing(generation.events()) as stream:
            async for event in stream:
                if event is None:  # a retry on a new circuit starts over
                    text = TextStream(head.decode, req.sampling.stop)
                    events = []
                    payment.restart()
                    continue
                payment.produce()
                events.append(event)
                text.push(event.token)
                if text.stopped:
                    break
    except GatewayOutOfCredits as error:
        if hold is None or not hold.drawn:
            raise  # no node was paid for it: released, nothing charged (the caller)
        return _paid_refusal(error, payment, generation, events, text.text + text.finish())
    answer = text.text + text.finish()
    if generation.echo:
        prompt = req.prompt if isinstance(req, CompletionRequest) else None
        shown = prompt if isinstance(prompt, str) else head.decode(prompt_ids)
        answer = shown + answer
    finish = "stop" if text.stopped or not generation.finished_by_length else "length"
    use = usage(len(prompt_ids), len(events))
    echoed = await generation.echoed_events()  # before charging: it can still fail
    payment.deliver(len(events))  # the whole answer goes to the writer at once
    signed = payment.finish(generation.circuit)
    body = shaper.full(answer, events, finish, use, echoed)
    body["planet_receipt"] = signed
    return web.json_response(body, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


async def _stream(
    request: web.Request,
    head: Head,
    req: ChatRequest | CompletionRequest,
    generation: Generation,
    shaper: Shaper,
    payment: QuestionPayment,
) -> web.StreamResponse:
    """A streamed answer: each token is handed to the writer as it comes (held-back text
    included), so a client that hangs up, times out or meets a failed node pays for the prompt
    and the tokens handed over up to then, and never more."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    include_usage = req.sampling.include_usage
    want = shaper.want_logprobs

    async def send(payload: dict[str, Any]) -> None:
        if not response.prepared:
            await response.prepare(request)
        await response.write(sse.event(payload))

    text = TextStream(head.decode, req.sampling.stop)
    first = True
    try:
        try:
            async with contextlib.aclosing(generation.events()) as stream:
                async for event in stream:
                    if event is None:  # a retry: only while nothing was delivered
                        text = TextStream(head.decode, req.sampling.stop)
                        payment.restart()
                        continue
                    payment.produce()
                    payment.deliver()  # before the write: a failed write is still charged
                    generation.delivered = True  # no retry from here on
                    delta = text.push(event.token)
                    if delta or want:
                        chunk = shaper.chunk(
                            delta,
                            [event] if want else [],
                            None,
                            first=first,
                            include_usage=include_usage,
                        )
                        await send(chunk)
                        first = False
                    if text.stopped:
                        break
        except PlanetError as error:
            if not payment.consumed:
                raise  # nothing delivered: a plain JSON error, and the payment is released
            payment.failed(generation.circuit)
            signed = payment.receipt
            status, body = planet_error_body(error)
            body["error"]["message"] += (
                f"; charged for the prompt and the {payment.delivered} tokens delivered "
                "(planet_receipt)"
            )
            body["planet_receipt"] = signed
            log.warning("stream failed after it started status=%d code=%s", status, error.code)
            await send(body)
            await response.write_eof()
            return response
        tail = text.finish()
        finish = "stop" if text.stopped or not generation.finished_by_length else "length"
        use = usage(len(generation.prompt_ids), payment.delivered)
        signed = payment.finish(generation.circuit)
        last = shaper.chunk(tail or None, [], finish, first=first, include_usage=include_usage)
        if include_usage:
            await send(last)
            last = shaper.usage_chunk(use)
        last["planet_receipt"] = signed
        await send(last)
        await response.write(sse.DONE)
        await response.write_eof()
    except ConnectionError:  # the client hung up: a write failed
        payment.client_gone(generation.circuit, prompt_sent=generation.started)
        log.info(
            "client hung up query=%s delivered=%d state=%s",
            payment.reservation.query_hex[:18],
            payment.delivered,
            payment.state.value,
        )
    return response


# ------------------------------------------------------------------------------------- app


def create_app(gateway: Gateway, *, guards: Sequence[Middleware] = ()) -> web.Application:
    """The app; `guards` run inside the error middleware, before any route (the personal
    client's door: node/gateway/personal_guard.py)."""
    app = web.Application(
        client_max_size=gateway.config.max_body_bytes, middlewares=[error_middleware, *guards]
    )
    app[GATEWAY_KEY] = gateway
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/pools", pools)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/receipts/{query_id}", receipt)
    app.router.add_get("/v1/key", key_status)
    app.router.add_post("/v1/keys/revoke", revoke_key)
    add_dapp_routes(app, GATEWAY_KEY)  # the web page, its config, /v1/network (dapp.py)
    app.on_cleanup.append(_close_circuits)
    return app


async def _close_circuits(app: web.Application) -> None:
    for route in app[GATEWAY_KEY].routes():
        await route.circuits.close()


__all__ = ["GATEWAY_KEY", "ApiError", "Gateway", "ModelInfo", "ModelRoute", "create_app"]
