"""Asking a gateway and paying for it (what `planet ask --pay` does), step by step:

1. `GET /v1/pools` → price per token, chain id, escrow, gateway address, model id (of the
   model asked for: `planet ask --model`; the gateway's first by default);
2. check the wallet's chain: the deployment's chain and escrow must be the gateway's;
3. deposit `price × (prompt bound + max_tokens)` into QueryEscrow for a fresh query id (the
   prompt bound is one token per UTF-8 byte plus the chat template's allowance: a byte-level
   tokenizer never makes more tokens than bytes; what is not charged stays refundable);
4. sign `QueryPayment` and send it as the API key of an OpenAI-shaped streaming request;
5. verify the receipt's signature (gateway wallet) and its fee against the deposit.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from protocol.canonical import loads_bounded
from protocol.errors import (
    ConfigError,
    PlanetError,
    ProtocolError,
    RemoteError,
    UnavailableError,
    UsageError,
)
from protocol.payment import QueryPayment, payment_domain, sign_payment, verify_receipt_json

TEMPLATE_ALLOWANCE = 64  # tokens the chat template may add around one user message


class GatewayRefused(PlanetError):
    """The gateway answered an OpenAI-shaped error."""

    exit_status = 5

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        code = str(error.get("code") or "gateway_error")
        super().__init__(
            f"the gateway refused ({status} {code}): {error.get('message')}", code=code
        )
        self.status = status


@dataclass(frozen=True)
class Quote:
    price: int  # wei per token
    prompt_bound: int  # tokens at most
    max_tokens: int

    @property
    def amount(self) -> int:
        return self.price * (self.prompt_bound + self.max_tokens)


def quote(pool: dict[str, Any], prompt: str, max_tokens: int) -> Quote:
    bound = len(prompt.encode("utf-8")) + TEMPLATE_ALLOWANCE
    return Quote(int(pool["price_wei_per_token"]), bound, max_tokens)


async def fetch_pool(
    http: aiohttp.ClientSession, gateway: str, model: str | None = None
) -> dict[str, Any]:
    """The gateway's pool of `model` (a name, alias or model hash it lists; None: its first)."""
    try:
        async with http.get(f"{gateway}/v1/pools") as answer:
            body = await answer.json(content_type=None)
            if answer.status != 200:
                raise GatewayRefused(answer.status, body.get("error", {}))
    except (aiohttp.ClientError, TimeoutError) as error:
        raise UnavailableError(
            f"the gateway {gateway} is unreachable: {type(error).__name__} {error}".rstrip(),
            hint="start one (`planet gateway serve` / `planet devnet up`) or pass --gateway URL",
        ) from None
    except ValueError:
        raise RemoteError(gateway, "bad_json", "/v1/pools did not answer JSON") from None
    try:
        pools = [dict(entry) for entry in body["data"]]
        first = pools[0]
    except (KeyError, IndexError, TypeError, ValueError):
        raise RemoteError(gateway, "bad_answer", "/v1/pools lists no model") from None
    return first if model is None else pick_pool(pools, model, gateway)


def pick_pool(pools: list[dict[str, Any]], model: str, gateway: str) -> dict[str, Any]:
    """The pool a model name picks: by its name, its model hash or one of its aliases."""
    for pool in pools:
        aliases = pool.get("aliases")
        names = [pool.get("model"), pool.get("model_hash")]
        names += aliases if isinstance(aliases, list) else []
        if model in names:
            return pool
    served = ", ".join(str(pool.get("model")) for pool in pools)
    raise UsageError(
        f"the gateway {gateway} does not serve the model {model[:80]!r}; it serves {served}",
        hint="pick one of them with --model (GET /v1/models lists them)",
    )


def check_chain(pool: dict[str, Any], chain_id: int, escrow: str) -> None:
    if int(pool["chain_id"]) != chain_id or str(pool["escrow"]).lower() != escrow.lower():
        raise ConfigError(
            f"the gateway takes payments on chain {pool['chain_id']} (escrow {pool['escrow']}), "
            f"your deployment is chain {chain_id} (escrow {escrow})",
            hint="pass the --deployment and --evm-rpc of the gateway's network",
        )


def api_key_for(pool: dict[str, Any], query_id: bytes, fee_cap: int, private_key: bytes) -> str:
    domain = payment_domain(int(pool["chain_id"]), pool["escrow"])
    model_id = bytes.fromhex(str(pool["model_id"])[2:])
    payment = QueryPayment(query_id, model_id, pool["gateway"], fee_cap)
    return sign_payment(private_key, payment, domain)


def new_query_id() -> bytes:
    return secrets.token_bytes(32)


async def stream_chat(
    http: aiohttp.ClientSession,
    gateway: str,
    api_key: str,
    body: dict[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    """POST a streaming chat request; yield each chunk; raise GatewayRefused on errors."""
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        async with http.post(
            f"{gateway}/v1/chat/completions", json={**body, "stream": True}, headers=headers
        ) as answer:
            if answer.status != 200:
                try:
                    error = (await answer.json(content_type=None)).get("error", {})
                except ValueError:
                    error = {"message": f"HTTP {answer.status}"}
                raise GatewayRefused(answer.status, error)
            async for raw in answer.content:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    return
                try:
                    chunk = loads_bounded(data)
                except ValueError:
                    raise ProtocolError(
                        f"the gateway {gateway} sent a stream event that is not JSON",
                        hint="check --gateway names a Planet gateway",
                    ) from None
                if isinstance(chunk, dict) and chunk.get("error"):
                    raise GatewayRefused(502, chunk["error"])
                yield chunk
    except (aiohttp.ClientError, TimeoutError) as error:
        raise UnavailableError(
            f"the gateway {gateway} dropped the answer: {type(error).__name__}",
            hint="ask again; a failed question is not charged",
        ) from None


def check_receipt(pool: dict[str, Any], receipt: dict[str, Any], query_id: bytes) -> Any:
    domain = payment_domain(int(pool["chain_id"]), pool["escrow"])
    parsed, signer = verify_receipt_json(receipt, domain)
    if signer != pool["gateway"] or parsed.query_id != query_id:
        raise RemoteError("gateway", "bad_receipt", "the receipt is not signed by the gateway")
    return parsed


Printer = Callable[[str], None]
