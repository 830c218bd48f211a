"""The verifier as an ordinary paying user of the gateway.

Each challenge is one `/v1/completions` request with echo + logprobs (`echo.echo_request`), or
a sampled completion with the verifier's seed (`sampled.sampled_request`), paid like any
question: a fresh random query id deposited into `QueryEscrow` from the verifier's wallet, a
`planet-pay-v1` API key signed for this gateway and model. Nothing in it
tells the nodes who asks (they see frames only); the gateway sees a paying wallet. The answer's
receipt (returned only to the payer) names the circuit's node keys in shard order, which is how
the verifier attributes the score; the receipt's signature and circuit hash are checked.

    asker = GatewayAsker(gateway_url, chain, http)
    answer = await asker.ask(challenge)      # Asked(doc, nodes, seconds), or a PlanetError

`Asked.seconds` is how long the completion request took on the asker's monotonic clock (`clock`,
injectable): from sending it to reading the whole answer; the escrow deposit before it is not
counted. The worker turns it into a measured decode speed (speeds.py).

A hosted gateway pays the charging nodes it routes to with its own credits (docs/credits.md);
`PersonalAsker` asks through the verifier operator's own personal client instead (`planet
gateway serve --personal`, which pays every charging node with the operator's bearer credits,
docs/gateway.md): its circuits take free and charging nodes alike, its questions look like any
personal client's, and its answer's `planet_receipt` names the circuit's node keys to its one
local caller. Nothing is signed there, so the receipt is only as good as the operator's own
client — which is the point. The client must draw its circuits afresh for every question
(`--route uniform`, or `cost`): one that keeps its nodes (`private`, the personal client's
default) would send every challenge to the same nodes for a month, so it is refused by name
(`planet_route` in its /v1/models).

    asker = PersonalAsker("http://127.0.0.1:8001", http, model_hash)
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from node.verifier.echo import echo_request
from node.verifier.sampled import sampled_request
from node.verifier.scoring import Challenge
from protocol.eip712 import as_bytes32
from protocol.errors import ConfigError, ProtocolError, RemoteError, UnavailableError
from protocol.payment import QueryPayment, payment_domain, sign_payment, verify_receipt_json

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 * 1024 * 1024
NODE_KEY = re.compile(r"[0-9a-fA-F]{64}")  # an ed25519 node key, as receipts name it
# a personal client's routes that draw circuits afresh per question (node/gateway/router.py)
SPREADING_ROUTES = ("uniform", "cost")


@dataclass(frozen=True)
class Pool:
    model: str  # the name the gateway serves
    model_id: bytes
    price_wei_per_token: int
    chain_id: int
    escrow: str
    gateway: str  # the gateway's EVM address (signs receipts)


@dataclass(frozen=True)
class Asked:
    doc: dict[str, Any]  # the completion answer
    nodes: tuple[str, ...]  # the circuit, shard order (from the verified receipt)
    seconds: float = 0.0  # the completion request's duration on the asker's clock


Clock = Callable[[], float]


class GatewayAsker:
    def __init__(
        self,
        url: str,
        chain: Any,
        http: aiohttp.ClientSession,
        clock: Clock = time.monotonic,
    ) -> None:
        self.url = url.rstrip("/")
        self.chain = chain  # node.chain.evm.account.PlanetChain with the verifier's wallet
        self.http = http
        self.clock = clock
        self._pool: Pool | None = None

    async def pool(self) -> Pool:
        if self._pool is None:
            doc = await _get_json(self.http, self.url, "/v1/pools")
            try:
                entry = doc["data"][0]
                self._pool = Pool(
                    model=str(entry["model"]),
                    model_id=as_bytes32(entry["model_id"], "model_id"),
                    price_wei_per_token=int(entry["price_wei_per_token"]),
                    chain_id=int(entry["chain_id"]),
                    escrow=str(entry["escrow"]),
                    gateway=str(entry["gateway"]),
                )
            except (KeyError, IndexError, TypeError, ValueError) as error:
                raise ProtocolError(f"gateway /v1/pools: unexpected shape ({error})") from None
        return self._pool

    async def _pay(self, pool: Pool, tokens: int) -> tuple[str, bytes]:
        query_id = secrets.token_bytes(32)
        amount = pool.price_wei_per_token * tokens
        await asyncio.to_thread(
            self.chain.escrow.deposit, query_id, pool.model_id, pool.gateway, amount
        )
        payment = QueryPayment(query_id, pool.model_id, pool.gateway, amount)
        key = sign_payment(bytes(self.chain.account.key), payment, _domain(pool))
        return key, query_id

    async def ask(self, challenge: Challenge) -> Asked:
        pool = await self.pool()
        body = echo_request(pool.model, challenge)
        return await self._ask(pool, body, len(challenge.ids) + body["max_tokens"])

    async def ask_sampled(
        self, prompt_ids: Sequence[int], *, max_tokens: int, seed: int, temperature: float
    ) -> Asked:
        """A sampled completion with the verifier's seed (node/verifier/sampled.py)."""
        pool = await self.pool()
        body = sampled_request(
            pool.model, prompt_ids, max_tokens=max_tokens, seed=seed, temperature=temperature
        )
        return await self._ask(pool, body, len(prompt_ids) + max_tokens)

    async def _ask(self, pool: Pool, body: dict[str, Any], tokens: int) -> Asked:
        key, query_id = await self._pay(pool, tokens)
        started = self.clock()
        doc, receipt_doc = await _complete(self.http, self.url, body, f"Bearer {key}")
        seconds = self.clock() - started
        receipt, signer = verify_receipt_json(receipt_doc, _domain(pool))
        if signer.lower() != pool.gateway.lower() or receipt.query_id != query_id:
            raise ProtocolError("the receipt is not the gateway's receipt for this question")
        return Asked(doc, tuple(receipt_doc["nodes"]), seconds)


def _domain(pool: Pool) -> Any:
    return payment_domain(pool.chain_id, pool.escrow)


class PersonalAsker:
    """The verifier as the user of its operator's own personal client (module docstring)."""

    def __init__(
        self,
        url: str,
        http: aiohttp.ClientSession,
        model_hash: str,
        token: str,
        clock: Clock = time.monotonic,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = http
        self.clock = clock
        self.model_hash = model_hash  # the verifier's reference: the client must serve it
        # the personal client's bearer token (node/gateway/personal_token.py): it answers
        # nothing without it
        self._authorization = f"Bearer {token}"
        self._model: str | None = None

    async def model(self) -> str:
        """The name the client serves the verifier's model under (checked by its hash)."""
        if self._model is None:
            doc = await _get_json(
                self.http, self.url, "/v1/models", {"Authorization": self._authorization}
            )
            try:
                entry = doc["data"][0]
                name, served = str(entry["id"]), str(entry["planet_model_hash"])
                route = entry.get("planet_route")
            except (KeyError, IndexError, TypeError, AttributeError) as error:
                raise ProtocolError(
                    f"personal client /v1/models: unexpected shape ({error})"
                ) from None
            if route not in SPREADING_ROUTES:
                raise ConfigError(
                    f"the personal client at {self.url} chooses circuits by route {route!r:.40}: "
                    "the verifier's challenges must reach every routable node",
                    hint="run the verifier's personal client with `--route uniform`",
                )
            if served.lower() != self.model_hash.lower():
                raise ProtocolError(
                    f"the personal client serves model {served}, not the verifier's "
                    f"{self.model_hash}"
                )
            self._model = name
        return self._model

    async def ask(self, challenge: Challenge) -> Asked:
        return await self._ask(echo_request(await self.model(), challenge))

    async def ask_sampled(
        self, prompt_ids: Sequence[int], *, max_tokens: int, seed: int, temperature: float
    ) -> Asked:
        """A sampled completion with the verifier's seed (node/verifier/sampled.py)."""
        body = sampled_request(
            await self.model(),
            prompt_ids,
            max_tokens=max_tokens,
            seed=seed,
            temperature=temperature,
        )
        return await self._ask(body)

    async def _ask(self, body: dict[str, Any]) -> Asked:
        started = self.clock()
        doc, receipt = await _complete(self.http, self.url, body, self._authorization)
        seconds = self.clock() - started
        nodes = receipt.get("nodes") if isinstance(receipt, dict) else None
        if (
            not isinstance(receipt, dict)
            or receipt.get("paid_with") != "credits"
            or not isinstance(nodes, list)
            or not nodes
            or not all(isinstance(n, str) and NODE_KEY.fullmatch(n) for n in nodes)
        ):
            raise ProtocolError(
                "the personal client's receipt names no circuit (paid_with credits, nodes: "
                "node keys); is it a personal client of this version?"
            )
        return Asked(doc, tuple(nodes), seconds)


async def _get_json(
    http: aiohttp.ClientSession, url: str, path: str, headers: dict[str, str] | None = None
) -> Any:
    try:
        async with http.get(url + path, headers=headers) as answer:
            body = await answer.content.read(MAX_ANSWER_BYTES)
            if answer.status != 200:
                raise RemoteError(f"gateway {path}", f"http_{answer.status}", body[:200].decode())
            return json.loads(body)
    except (aiohttp.ClientError, TimeoutError) as error:
        raise UnavailableError(f"gateway {url} unreachable: {error}") from None
    except ValueError as error:
        raise ProtocolError(f"gateway {path}: not JSON ({error})") from None


async def _complete(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], authorization: str
) -> tuple[dict[str, Any], Any]:
    """POST /v1/completions: the answer and its `planet_receipt` (unchecked)."""
    try:
        async with http.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": authorization}
        ) as answer:
            raw = await answer.content.read(MAX_ANSWER_BYTES)
            if answer.status != 200:
                raise RemoteError("gateway", f"http_{answer.status}", raw[:300].decode())
    except (aiohttp.ClientError, TimeoutError) as error:
        raise UnavailableError(f"gateway {url} unreachable: {error}") from None
    try:
        doc = json.loads(raw)
        return doc, doc["planet_receipt"]
    except (ValueError, KeyError, TypeError):
        raise ProtocolError("the gateway's answer has no planet_receipt") from None
