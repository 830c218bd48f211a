"""`planet key new|revoke|show`: one API key for many questions, paid from your prepaid balance.

A payment key is signed once by your wallet (EIP-712 `PaymentKey`: this gateway, a random key
id, the model, a cap in wei, an expiry, the escrow) and printed as
`planet-key-v1.<key id>.<cap>.<expiry>.<signature>`: give it to any OpenAI tool as its API key.
The gateway charges your prepaid balance (`planet balance deposit`) question by question until
the cap, and refuses it once the cap is spent (402 `key_exhausted`), after its expiry, or once
revoked. What a gateway can take with it is bounded by the cap. `revoke` sends the gateway a
revocation signed by the same wallet; `show` asks the gateway what the key has spent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from node.cli.ask import _open_wallet, _pay_defaults
from node.cli.balance import parse_eth
from protocol.errors import UsageError

MAX_KEY_SECONDS = 3_650 * 86_400
_DURATION = re.compile(r"([1-9][0-9]{0,9})([smhd]?)\Z")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3_600, "d": 86_400}

EXAMPLES = """\
examples:
  planet key new --cap 0.01 --expires 7d      print a key for the devnet's gateway
  planet key new --cap 0.5 --expires 30d --gateway https://gw.example:8000 --json
  OPENAI_API_KEY=$(planet key new --cap 0.01 --expires 7d)   for any OpenAI tool
  planet key show planet-key-v1....            charged so far, held, left under the cap
  planet key revoke planet-key-v1....          the gateway refuses it from now on
  planet key new --cap 0.01 --model smollm2-135m-1p-int8   a key for another model it serves
the key spends your prepaid balance at that gateway: fund it first (planet balance deposit).
defaults (gateway, deployment, wallet) come from `planet devnet up`; flags win.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "key",
        help="one API key for many questions, paid from your prepaid balance",
        description="Make, inspect or revoke a payment key: an API key an OpenAI tool can keep.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("new", "revoke", "show"), help="what to do")
    parser.add_argument("key", nargs="?", default=None, help="the key (revoke, show)")
    parser.add_argument("--cap", default=None, help="new: ETH the key may spend in all")
    parser.add_argument(
        "--expires", default="7d", help="new: lifetime, e.g. 3600, 90m, 12h, 7d (default 7d)"
    )
    parser.add_argument("--gateway", default=None, help="gateway URL (default: the devnet's)")
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="the model the key pays for, as the gateway's /v1/models names it (default: the "
        "gateway's first model); a key is signed for one model",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--wallet", type=Path, default=None, help="keystore (see planet ask)")
    parser.add_argument("--password-file", type=Path, default=None, help="wallet password file")
    parser.add_argument(
        "--deployment", type=Path, default=None, help="contract deployment JSON (default: devnet's)"
    )
    parser.set_defaults(handler=run, evm_rpc=None)


def parse_duration(text: str) -> int:
    """`3600`, `90m`, `12h`, `7d` → seconds (1 s … 10 years); raises `UsageError`."""
    match = _DURATION.match(text.strip()) if isinstance(text, str) and text.isascii() else None
    if match is None:
        raise UsageError(f"not a duration: {text!r}", hint="e.g. 3600, 90m, 12h or 7d")
    seconds = int(match[1]) * _UNITS[match[2]]
    if seconds > MAX_KEY_SECONDS:
        raise UsageError(f"{text} is longer than 10 years", hint="e.g. --expires 30d")
    return seconds


def run(args: argparse.Namespace) -> int:
    if args.action == "new":
        if args.key is not None:
            raise UsageError("`key new` takes no key", hint="planet key new --cap 0.01")
        if args.cap is None:
            raise UsageError("`key new` needs --cap (ETH)", hint="planet key new --cap 0.01")
        cap, lifetime = parse_eth(args.cap), parse_duration(args.expires)
    elif args.key is None:
        raise UsageError(f"`key {args.action}` needs the key", hint=f"planet key {args.action} KEY")
    try:
        settings = _pay_defaults(args)
    except UsageError as error:  # its words are `planet ask --pay`'s
        raise UsageError(error.message.replace("--pay", "planet key"), hint=error.hint) from None
    settings["model"] = args.model
    if args.action == "new":
        result = asyncio.run(_new(args, settings, cap, lifetime))
        if args.json:
            print(json.dumps(result))
        else:
            print(result["key"])
        return 0
    result = asyncio.run(
        _revoke(args, settings) if args.action == "revoke" else _show(settings, args)
    )
    print(json.dumps(result) if args.json else _describe(args.action, result))
    return 0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _pool(settings: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    from node.chain.evm.deployment import Deployment
    from node.gateway import client as gw

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        pool = await gw.fetch_pool(http, settings["gateway"], settings.get("model"))
    if not settings["deployment"].exists():
        raise UsageError(f"no deployment file at {settings['deployment']}")
    deployment = Deployment.load(settings["deployment"])
    gw.check_chain(pool, deployment.chain_id, deployment.address("QueryEscrow"))
    return pool


async def _new(
    args: argparse.Namespace, settings: dict[str, Any], cap: int, lifetime: int
) -> dict[str, Any]:
    from protocol.payment import PaymentKey, payment_domain, sign_payment_key  # lazy: eth-abi

    pool = await _pool(settings)
    account = _open_wallet(args, settings)
    domain = payment_domain(int(pool["chain_id"]), pool["escrow"])
    model_id = bytes.fromhex(str(pool["model_id"])[2:])
    expiry = int(time.time()) + lifetime
    key = PaymentKey(
        pool["gateway"], secrets.token_bytes(32), model_id, cap, expiry, pool["escrow"]
    )
    text = sign_payment_key(bytes(account.key), key, domain)
    _say(
        f"payment key for gateway {pool['gateway']} ({settings['gateway']}): up to {cap} wei "
        f"({cap / 10**18:g} ETH) from the prepaid balance of {account.address}, until {expiry} "
        f"({lifetime} s); keep it secret: whoever holds it spends your balance up to the cap"
    )
    return {
        "key": text,
        "key_id": "0x" + key.key_id.hex(),
        "payer": account.address,
        "gateway": pool["gateway"],
        "gateway_url": settings["gateway"],
        "cap_wei": str(cap),
        "expiry": expiry,
    }


async def _revoke(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    from protocol.errors import ProtocolError
    from protocol.payment import KeyRevocation, parse_payment_key, payment_domain
    from protocol.payment import sign_key_revocation as sign

    try:
        proof = parse_payment_key(args.key)
    except ProtocolError as error:
        raise UsageError(error.message, hint="pass the key `planet key new` printed") from None
    pool = await _pool(settings)
    account = _open_wallet(args, settings)
    domain = payment_domain(int(pool["chain_id"]), pool["escrow"])
    model_id = bytes.fromhex(str(pool["model_id"])[2:])
    try:
        payer = proof.payer(model_id, pool["gateway"], domain)
    except ProtocolError:
        payer = None
    if payer != account.address:
        raise UsageError(
            f"this key was not signed by your wallet {account.address} for this gateway "
            f"({pool['gateway']})",
            hint="revoke with the wallet that made the key, at the gateway it was made for",
        )
    signature = sign(bytes(account.key), KeyRevocation(pool["gateway"], proof.key_id), domain)
    body = {"key_id": "0x" + proof.key_id.hex(), "signature": signature}
    return await _call(settings["gateway"], "POST", "/v1/keys/revoke", json_body=body)


async def _show(settings: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from urllib.parse import quote

    path = "/v1/key" + (f"?model={quote(args.model, safe='')}" if args.model else "")
    return await _call(settings["gateway"], "GET", path, api_key=str(args.key))


async def _call(
    gateway: str,
    method: str,
    path: str,
    *,
    json_body: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    import aiohttp

    from node.gateway.client import GatewayRefused
    from protocol.errors import UnavailableError

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.request(method, f"{gateway}{path}", json=json_body, headers=headers) as answer,
        ):
            try:
                body = await answer.json(content_type=None)
            except ValueError:
                body = {"error": {"message": f"HTTP {answer.status}, not JSON"}}
            if answer.status != 200 or not isinstance(body, dict):
                error = body.get("error") if isinstance(body, dict) else None
                raise GatewayRefused(answer.status, error if isinstance(error, dict) else {})
            return body
    except (aiohttp.ClientError, TimeoutError) as error:
        raise UnavailableError(
            f"the gateway {gateway} is unreachable: {type(error).__name__}",
            hint="pass --gateway URL (the one the key was made for)",
        ) from None


def _describe(action: str, result: dict[str, Any]) -> str:
    if action == "revoke":
        return f"revoked key {result['key_id']} of {result['payer']} at gateway {result['gateway']}"
    return (
        f"key {result['key_id']} of {result['payer']}: {result['charged_wei']} wei charged, "
        f"{result['held_wei']} held, {result['left_wei']} left of {result['cap_wei']}; expires "
        f"{result['expiry']}{'; REVOKED' if result['revoked'] else ''}"
    )
