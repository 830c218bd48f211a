"""The web dApp's routes on the gateway: the built page, its config, and a read-only network view.

    GET /                     dapp/dist/index.html, or a plain page saying how to build it
    GET /dapp/config.json     chain id, escrow address + the ABI the page uses, the models
                              served (the first: the default), price
    GET /dapp/{file}          one built file from dapp/dist (flat names only, no sub-folders)
    GET /dapp/prepaid/{payer} wei this gateway holds against a prepaid payer's balance (questions
                              in flight + fees charged, not yet debited on chain)
    GET /v1/network[?model=M] every served model (name, hash, shards, price, pool health),
                              then for model M (a name, alias or hash; default the first):
                              shards x nodes (lifecycle, reputation, stake, routable), and
                              recent epochs, from the committee's /nodes (every page; at most
                              MAX_NODES listed, routable first, `nodes_total` all), /params
                              (untrusted_below), /pool_health and /epochs queries; 404
                              `model_not_found` for a model not served here

The page is bundled by `npm run build:dapp` (esbuild, dapp/build.mjs) into dapp/dist/ — nothing
is fetched from anywhere else at run time. The gateway starts without it; `/` then explains how
to build it. Committee answers are untrusted input: `network_view` keeps only well-formed fields
(64-hex keys, bounded ints and words) and drops anything else.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from node.chain.committee_pages import BadPage, TooManyPages, path_query, read_nodes
from node.gateway.errors import InvalidRequest, NoCircuit
from node.gateway.models import ModelInfo
from protocol.eip712 import as_address
from protocol.errors import PlanetError
from protocol.fields import is_int

DIST = Path(__file__).resolve().parents[2] / "dapp" / "dist"
RECENT_EPOCHS = 5  # epochs shown in the network view (the current one and the ones before)
MAX_NODES = 1000  # nodes listed at most (routable first; `nodes_total` counts them all)
REPUTATION_SCALE = 1_000_000  # the committee's reputations are integers at 10**6
MAX_MODEL_NAME = 200  # `?model=` longer than this is refused (a hash is 71 characters)

_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_KEY = re.compile(r"[0-9a-f]{64}\Z")
_WORD = re.compile(r"[A-Za-z_]{1,32}\Z")
_DIGITS = re.compile(r"[0-9]{1,40}\Z")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}\Z")
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".map": "application/json",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

# The QueryEscrow functions the page calls (human-readable ABI, as ethers reads it). A deposit and
# a prepaid balance both name the gateway (the `gateway` of this config): one payment, one
# gateway. tests/dapp/test_dapp_routes.py holds every entry to the compiled contract's ABI.
ESCROW_ABI = (
    "function deposit(bytes32 queryId, bytes32 modelId, address gateway) payable",
    "function refund(bytes32 queryId)",
    "function depositOf(bytes32 queryId) view returns (address user, uint256 amount, "
    "uint8 status, uint256 depositedAt, bytes32 modelId, address gateway)",
    "function refundTimeout() view returns (uint256)",
    "event Deposited(bytes32 indexed queryId, address indexed user, bytes32 indexed modelId, "
    "address gateway, uint256 amount)",
    "event Refunded(bytes32 indexed queryId, address indexed user, uint256 amount)",
    "error InvalidDepositAmount(uint256 amount, uint256 max)",
    "error InvalidGateway(address gateway)",
    "error QueryExists(bytes32 queryId)",
    "error NotDepositor(bytes32 queryId, address caller)",
    "error RefundNotYetAvailable(bytes32 queryId, uint256 availableAt)",
    "error NothingToRefund(bytes32 queryId)",
    # prepaid balance (vouchers), one per (payer, gateway)
    "function depositBalance(address gateway) payable",
    "function requestWithdrawal(address gateway)",
    "function cancelWithdrawal(address gateway)",
    "function withdrawBalance(address gateway)",
    "function prepaidOf(address payer, address gateway) view "
    "returns (uint256 balance, uint256 withdrawableAt)",
    "event BalanceDeposited(address indexed payer, address indexed gateway, uint256 amount, "
    "uint256 balance)",
    "event WithdrawalRequested(address indexed payer, address indexed gateway, uint256 balance, "
    "uint256 withdrawableAt)",
    "event WithdrawalCancelled(address indexed payer, address indexed gateway)",
    "event BalanceWithdrawn(address indexed payer, address indexed gateway, uint256 amount)",
    "error BalanceOverflow(address payer, address gateway, uint256 balance, uint256 amount)",
    "error NothingToWithdraw(address payer, address gateway)",
    "error WithdrawalAlreadyRequested(address payer, address gateway, uint256 withdrawableAt)",
    "error WithdrawalNotRequested(address payer, address gateway)",
    "error WithdrawalNotYetAvailable(address payer, address gateway, uint256 withdrawableAt)",
)

NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Planet</title>
<link rel="icon" href="data:,"></head>
<body><h1>Planet gateway</h1>
<p>The web page is not built in this checkout. Build it with <code>npm run build:dapp</code>
(or <code>deploy/setup.sh</code>), then reload.</p>
<p>The API works without it: <a href="/v1/pools">/v1/pools</a>, <a href="/health">/health</a>.</p>
</body></html>
"""


def add_dapp_routes(app: web.Application, gateway_key: web.AppKey[Any], dist: Path = DIST) -> None:
    """Mount the page, its config and /v1/network on the gateway app (gateway under
    `gateway_key`: has .routes(), .route(name), .desk, .chain_id, .escrow, .committee,
    .config)."""

    async def index(request: web.Request) -> web.StreamResponse:
        page = dist / "index.html"
        if not page.is_file():
            return web.Response(text=NOT_BUILT, content_type="text/html", status=200)
        return _file_response(page)

    async def asset(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if not _FILE.match(name) or ".." in name:
            raise web.HTTPNotFound()
        path = dist / name
        if not path.is_file():
            raise web.HTTPNotFound()
        return _file_response(path)

    async def config(request: web.Request) -> web.Response:
        return web.json_response(dapp_config(request.app[gateway_key]))

    async def network(request: web.Request) -> web.Response:
        name = request.query.get("model")
        if name is not None and not 0 < len(name) <= MAX_MODEL_NAME:
            raise InvalidRequest(
                "invalid_value",
                f"model: expected a model's name or hash of 1 to {MAX_MODEL_NAME} characters",
                param="model",
            )
        return web.json_response(await network_view(request.app[gateway_key], name))

    async def prepaid(request: web.Request) -> web.Response:
        payer = request.match_info["payer"]
        return web.json_response(prepaid_view(request.app[gateway_key], payer))

    app.router.add_get("/", index)
    app.router.add_get("/dapp/config.json", config)
    app.router.add_get("/dapp/prepaid/{payer}", prepaid)
    app.router.add_get("/dapp/{name}", asset)
    app.router.add_get("/v1/network", network)


def _file_response(path: Path) -> web.Response:
    content_type = _TYPES.get(path.suffix, "application/octet-stream")
    return web.Response(
        body=path.read_bytes(),
        content_type=content_type,
        charset="utf-8" if content_type.startswith("text/") else None,
        headers={
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": (
                "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                "script-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'"
            ),
        },
    )


def _public_rpc(url: str) -> str | None:
    """The gateway's EVM RPC URL, for the page to offer `wallet_addEthereumChain`, only when it
    is a plain loopback URL (a devnet): a remote RPC URL may carry a provider's API key."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    plain = not (parts.username or parts.password or parts.query or parts.fragment)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    return url if plain and loopback and parts.path in ("", "/") else None


def _served(gateway: Any) -> list[ModelInfo]:
    """Every model the gateway serves, the first (a question's default) first."""
    return [route.info for route in gateway.routes()]


def _model_json(model: ModelInfo) -> dict[str, Any]:
    return {
        "model": model.name,
        "aliases": list(model.aliases),
        "model_hash": model.model_hash,
        "model_id": "0x" + model.model_id.hex(),
        "shards": model.shards,
    }


def dapp_config(gateway: Any) -> dict[str, Any]:
    """What the page needs to pay: the chain, the escrow and its ABI, the models (`models`,
    each with the escrow's model id a payment names; `model`...: the first), the price."""
    served = _served(gateway)
    model = served[0]
    return {
        "chain_id": gateway.chain_id,
        "chain_name": "Planet devnet" if gateway.chain_id == 31337 else f"chain {gateway.chain_id}",
        "evm_rpc": _public_rpc(gateway.config.evm_rpc),
        "escrow": gateway.escrow,
        "escrow_abi": list(ESCROW_ABI),
        "gateway": gateway.desk.gateway,
        "model": model.name,
        "model_hash": model.model_hash,
        "model_id": "0x" + model.model_id.hex(),
        "shards": model.shards,
        "price_wei_per_token": str(gateway.desk.price),
        "payment_domain": gateway.desk.domain.to_json(),
        "max_voucher_lifetime_s": gateway.desk.max_voucher_lifetime_s,
        "models": [_model_json(info) for info in served],
    }


def prepaid_view(gateway: Any, payer: str) -> dict[str, Any]:
    """What this gateway holds against `payer`'s prepaid balance (reserved for questions in
    flight + fees charged and not yet debited by a posted root). The page subtracts it from
    `prepaidOf(payer).balance` to show what new vouchers can still spend here. The same
    figures become public on chain when the epoch's root lists the payer's debit."""
    if not _ADDRESS.match(payer):
        raise InvalidRequest("bad_address", "expected an address: 0x and 40 hex digits")
    address = as_address(payer.lower())
    return {"payer": address, "held_wei": str(gateway.desk.outstanding(address))}


async def _query(committee: Any, path: str) -> Any:
    try:
        return await committee.abci_query(path)
    except PlanetError as error:
        raise NoCircuit(
            "committee_unavailable", f"the committee chain is unreachable: {error}"
        ) from None


async def _model_nodes(committee: Any, model_hash: str) -> list[dict[str, Any]]:
    """Every `/nodes` entry of the model, each page followed (`read_nodes`); a page that is not
    a node list, or a list past `NODE_PAGES` pages, is a 503 naming it (`bad_page`,
    `too_many_pages`), an unreachable committee `committee_unavailable`."""
    try:
        return await read_nodes(path_query(committee.abci_query), model=model_hash)
    except (BadPage, TooManyPages) as error:
        raise NoCircuit(error.code, f"the committee's node list is unreadable: {error}") from None
    except PlanetError as error:
        raise NoCircuit(
            "committee_unavailable", f"the committee chain is unreachable: {error}"
        ) from None


def _pool(answer: Any, shards: int) -> dict[str, Any]:
    """A committee /pool_health answer with only well-formed fields."""
    per_shard = answer.get("routable_per_shard") if isinstance(answer, dict) else None
    status = answer.get("status") if isinstance(answer, dict) else None
    return {
        "status": status if isinstance(status, str) and _WORD.match(status) else "unknown",
        "routable_per_shard": [_int(c) or 0 for c in per_shard[:shards]]
        if isinstance(per_shard, list)
        else [0] * shards,
    }


async def network_view(gateway: Any, name: str | None = None) -> dict[str, Any]:
    """Every served model with its pool health and price (`models`), then shards x nodes and
    recent epochs for the model `name` names (None: the first; 404 `model_not_found` for one
    not served here)."""
    served = _served(gateway)
    model = served[0] if name is None else gateway.route(name).info
    committee = gateway.committee
    raw_nodes, params, current, *pools = await asyncio.gather(
        _model_nodes(committee, model.model_hash),
        _query(committee, "/params"),  # untrusted_below: genesis, not the paged /reputations
        _query(committee, "/epochs"),
        *(
            _query(committee, f"/pool_health?model={info.model_hash}&shards={info.shards}")
            for info in served
        ),
    )
    health = {
        info.model_hash: _pool(answer, info.shards)
        for info, answer in zip(served, pools, strict=True)
    }
    epochs = list(_epochs(current))
    number = _int(current.get("current") if isinstance(current, dict) else None)
    if number is not None:
        older = range(number - 1, max(0, number - RECENT_EPOCHS), -1)
        answers = await asyncio.gather(*(_query(committee, f"/epochs?epoch={n}") for n in older))
        for answer in answers:
            epochs += _epochs(answer)
    every = [n for n in map(_node, raw_nodes) if n is not None]
    # routable first, then by key (the committee's order): the page lists what a user can reach
    nodes = sorted(every, key=lambda n: not n["routable"])[:MAX_NODES]
    shards: list[list[str]] = [[] for _ in range(model.shards)]
    for node in nodes:
        for shard in node["shards"]:
            if shard < model.shards:
                shards[shard].append(node["key"])
    genesis = params.get("genesis") if isinstance(params, dict) else None
    rep = genesis.get("reputation") if isinstance(genesis, dict) else None
    rep = rep if isinstance(rep, dict) else {}
    return {
        "models": [
            {
                **_model_json(info),
                "price_wei_per_token": str(gateway.desk.price),
                "pool": health[info.model_hash],
            }
            for info in served
        ],
        # the model the rest describes
        "model": model.name,
        "model_hash": model.model_hash,
        "shards": model.shards,
        "pool": health[model.model_hash],
        "reputation_scale": REPUTATION_SCALE,
        "untrusted_below": _int(rep.get("untrusted_below")),
        "nodes": nodes,
        "nodes_total": len(every),  # the model's registered nodes; `nodes` lists MAX_NODES
        "nodes_by_shard": shards,
        "height": _int(current.get("height")) if isinstance(current, dict) else None,
        "current_epoch": number,
        "epochs": epochs,
    }


def _int(value: Any) -> int | None:
    return value if is_int(value, 0, (1 << 63) - 1) else None


def _word(value: Any) -> str | None:
    return value if isinstance(value, str) and _WORD.match(value) else None


def _node(entry: Any) -> dict[str, Any] | None:
    """One committee node entry with only well-formed fields, or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        return None
    key = entry["key"]
    shards = entry.get("shards")
    if not _KEY.match(key) or not isinstance(shards, list) or len(shards) > 64:
        return None
    clean_shards = [s for s in map(_int, shards) if s is not None]
    stake = entry.get("stake")
    address = entry.get("evm_address")
    return {
        "key": key,
        "evm_address": address if isinstance(address, str) and _ADDRESS.match(address) else None,
        "role": _word(entry.get("role")),
        "shards": clean_shards,
        "status": _word(entry.get("status")),
        "reputation": _int(entry.get("reputation")),
        "untrusted": entry.get("untrusted") is True,
        "uncommitted": entry.get("uncommitted") is True,
        "stake_wei": stake if isinstance(stake, str) and _DIGITS.match(stake) else None,
        "stake_attestations": _int(entry.get("stake_attestations")),
        "routable": entry.get("routable") is True,
    }


def _epochs(answer: Any) -> list[dict[str, Any]]:
    records = answer.get("epochs") if isinstance(answer, dict) else None
    out = []
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict) or _int(record.get("epoch")) is None:
            continue
        challenges = record.get("challenges")
        leader = record.get("leader")
        out.append(
            {
                "epoch": record["epoch"],
                "start_height": _int(record.get("start_height")),
                "end_height": _int(record.get("end_height")),
                "leader": leader if isinstance(leader, str) and len(leader) <= 128 else None,
                "challenges": len(challenges) if isinstance(challenges, list) else 0,
                "reputation_applied": record.get("reputation_applied") is not None,
            }
        )
    return out


__all__ = [
    "DIST",
    "ESCROW_ABI",
    "add_dapp_routes",
    "dapp_config",
    "network_view",
    "prepaid_view",
]
