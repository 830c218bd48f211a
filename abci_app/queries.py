"""ABCI Query: path-based, JSON answers over the committed state.

Parameters come from the path's query string (`/nodes?model=m&shard=1`) and/or a JSON object in
the request's `data`. Every answer is canonical JSON; unknown paths answer `UNKNOWN_QUERY`.

    /nodes        ?model ?shard ?status ?role   nodes with lifecycle, stake, reputation, routable
    /node         ?key                          one node
    /pool_health  ?model ?shards                per-shard routable counts and status
                                                (healthy: every shard ≥ 3; degraded: some 1–2;
                                                 incomplete: some 0)
    /commitments  ?node ?session ?limit         commit-reveal records (at most 1000)
    /evidence     ?node ?limit                  reveal mismatches and equivocations
    /reputations                                R, window, untrusted per node
    /epochs       ?epoch                        leader, challenge list (default: the current epoch)
    /verdicts     ?id ?confirmed                votes and the signatures sorted by operator address
    /nonce        ?account                      last committed nonce (next must be greater)
    /share_blocks ?from ?limit                  share-chain blocks and the tip
    /params                                     genesis parameters, validators, height, app hash
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from abci_app.codes import Code
from abci_app.handlers import SERVING
from protocol.canonical import canonical_json

if TYPE_CHECKING:
    from abci_app.state import State

HEALTHY_MIN = 3
MAX_ITEMS = 1000  # most records one list query answers (?limit lowers it)


class QueryError(Exception):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _int_param(params: dict[str, Any], name: str, default: int | None = None) -> int | None:
    value = params.get(name, default)
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise QueryError(Code.BAD_QUERY, f"{name}: expected an integer")


def node_view(state: State, key: str, node: dict[str, Any]) -> dict[str, Any]:
    rep = state.committed("rep", key) or {"r": state.genesis.reputation.initial, "window": []}
    stake = state.committed("stake", key) or {"agreed": None, "attestations": {}}
    agreed = stake["agreed"]
    params = state.genesis.reputation
    staked = agreed is not None and int(agreed) >= state.genesis.min_stake.get(node["role"], 0)
    trusted = rep["r"] >= params.untrusted_below
    return {
        **node,
        "reputation": rep["r"],
        "untrusted": not trusted,
        "stake": agreed,
        "stake_attestations": len(stake["attestations"]),
        "operations": state.committed("contrib", key) or 0,
        "routable": node["status"] == SERVING and staked and trusted,
    }


def _nodes(state: State, params: dict[str, Any]) -> Any:
    shard = _int_param(params, "shard")
    out = []
    for key, node in state.committed_items("node"):
        if "model" in params and node["model"] != params["model"]:
            continue
        if shard is not None and shard not in node["shards"]:
            continue
        if "status" in params and node["status"] != params["status"].upper():
            continue
        if "role" in params and node["role"] != params["role"]:
            continue
        out.append(node_view(state, key, node))
    return {"nodes": out}


def _node(state: State, params: dict[str, Any]) -> Any:
    key = params.get("key", "")
    node = state.committed("node", key)
    if node is None:
        raise QueryError(Code.NOT_FOUND, f"node {key!r} is not registered")
    return node_view(state, key, node)


def pool_health(state: State, model: str, shard_count: int | None = None) -> dict[str, Any]:
    """Routable compute nodes per shard and the pool status (UNFED AI pool health)."""
    counts: dict[int, int] = {}
    highest = -1
    for key, node in state.committed_items("node"):
        if node["model"] != model or node["role"] != "compute":
            continue
        highest = max(highest, *node["shards"])
        if node_view(state, key, node)["routable"]:
            for shard in node["shards"]:
                counts[shard] = counts.get(shard, 0) + 1
    total = shard_count or state.genesis.models.get(model) or highest + 1
    per_shard = [counts.get(shard, 0) for shard in range(total)]
    if not per_shard or min(per_shard) == 0:
        status = "incomplete"
    elif min(per_shard) < HEALTHY_MIN:
        status = "degraded"
    else:
        status = "healthy"
    return {
        "model": model,
        "shards": total,
        "routable_per_shard": per_shard,
        "status": status,
    }


def _pool_health(state: State, params: dict[str, Any]) -> Any:
    if "model" in params:
        return pool_health(state, params["model"], _int_param(params, "shards"))
    models = sorted(
        {node["model"] for _, node in state.committed_items("node")} | set(state.genesis.models)
    )
    return {"pools": [pool_health(state, model) for model in models]}


def _limit(params: dict[str, Any]) -> int:
    return max(1, min(_int_param(params, "limit", MAX_ITEMS) or MAX_ITEMS, MAX_ITEMS))


def _commitments(state: State, params: dict[str, Any]) -> Any:
    prefix = params.get("node", "")
    limit = _limit(params)
    out: list[dict[str, Any]] = []
    for key, record in state.committed_items("commit"):
        node, session, step, shard = key.split("/")
        if prefix and node != prefix:
            continue
        if "session" in params and session != params["session"]:
            continue
        if len(out) == limit:
            break
        out.append(
            {"node": node, "session": session, "step": int(step), "shard": int(shard), **record}
        )
    return {"commitments": out}


def _evidence(state: State, params: dict[str, Any]) -> Any:
    items = [
        r
        for _, r in state.committed_items("evidence")
        if params.get("node", r["node"]) == r["node"]
    ]
    return {"evidence": items[: _limit(params)]}


def _reputations(state: State, params: dict[str, Any]) -> Any:
    rep_params = state.genesis.reputation
    return {
        "scale": 1_000_000,
        "untrusted_below": rep_params.untrusted_below,
        "reputations": {
            key: {**record, "untrusted": record["r"] < rep_params.untrusted_below}
            for key, record in state.committed_items("rep")
        },
    }


def _epochs(state: State, params: dict[str, Any]) -> Any:
    current = state.committed("meta", "current_epoch") or 1
    wanted = _int_param(params, "epoch")
    numbers = [wanted] if wanted is not None else [current]
    epochs = [state.committed("epoch", str(n)) for n in numbers]
    return {
        "current": current,
        "height": state.height,
        "epochs": [e for e in epochs if e is not None],
    }


def verdict_view(record: dict[str, Any]) -> dict[str, Any]:
    votes = sorted(record["votes"].values(), key=lambda v: int(v["operator"], 16))
    return {
        **{k: v for k, v in record.items() if k != "votes"},
        "signers": [v["operator"] for v in votes],
        "signatures": [v["signature"] for v in votes],
    }


def _verdicts(state: State, params: dict[str, Any]) -> Any:
    if "id" in params:
        record = state.committed("verdict", params["id"])
        if record is None:
            raise QueryError(Code.NOT_FOUND, f"verdict {params['id']!r} not found")
        return verdict_view(record)
    confirmed = params.get("confirmed")
    out = []
    for _, record in state.committed_items("verdict"):
        if confirmed is not None and str(record["confirmed"]).lower() != str(confirmed).lower():
            continue
        out.append(verdict_view(record))
    return {"verdicts": out}


def _nonce(state: State, params: dict[str, Any]) -> Any:
    account = params.get("account", "")
    return {"account": account, "nonce": state.committed("acct", account) or 0}


def _share_blocks(state: State, params: dict[str, Any]) -> Any:
    start = _int_param(params, "from", 1) or 1
    limit = min(_int_param(params, "limit", 100) or 100, 1000)
    tip = state.committed("meta", "share_tip") or {"height": 0, "hash": None}
    blocks = []
    for height in range(start, min(tip["height"], start + limit - 1) + 1):
        block = state.committed("share", str(height))
        if block is not None:
            blocks.append(block)
    return {"tip": tip, "blocks": blocks}


def _params(state: State, params: dict[str, Any]) -> Any:
    return {
        "chain_id": state.chain_id,
        "height": state.height,
        "app_hash": state.app_hash.hex(),
        "vote_extensions_enable_height": state.ve_enable_height,
        "genesis": state.genesis.to_json(),
        "validators": state.validators,
    }


ROUTES: dict[str, Callable[[State, dict[str, Any]], Any]] = {
    "/nodes": _nodes,
    "/node": _node,
    "/pool_health": _pool_health,
    "/commitments": _commitments,
    "/evidence": _evidence,
    "/reputations": _reputations,
    "/epochs": _epochs,
    "/verdicts": _verdicts,
    "/nonce": _nonce,
    "/share_blocks": _share_blocks,
    "/params": _params,
}


def query(state: State, path: str, data: bytes) -> tuple[Code, bytes, str]:
    """(code, canonical JSON answer, log) for one ABCI query."""
    parts = urlsplit(path)
    route = ROUTES.get(parts.path.rstrip("/") or "/")
    if route is None:
        return (
            Code.UNKNOWN_QUERY,
            b"",
            f"unknown query path {parts.path!r}; known: {sorted(ROUTES)}",
        )
    params: dict[str, Any] = dict(parse_qsl(parts.query))
    if data:
        try:
            extra = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return Code.BAD_QUERY, b"", "query data must be a JSON object"
        if not isinstance(extra, dict):
            return Code.BAD_QUERY, b"", "query data must be a JSON object"
        params.update(extra)
    try:
        return Code.OK, canonical_json(route(state, params)), ""
    except QueryError as error:
        return error.code, b"", error.message
