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
    /params                                     genesis parameters, validators, height, app hash
    /spot_reports ?epoch                        spot-check reports of e's checks, credits in e
    /payouts, /payouts/proof, /backing, /credits   settlement (`payout_queries.py`)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from abci_app import accusations, seeds, spot_reports
from abci_app.codes import Code
from abci_app.handlers import SERVING
from protocol.canonical import JsonInputError, canonical_json, parse_json

if TYPE_CHECKING:
    from abci_app.state import State

HEALTHY_MIN = 3
MAX_ITEMS = 1000  # most records one list query answers (?limit lowers it)
MAX_PATH = 4096  # characters of path + query string
MAX_DATA = 4096  # bytes of the JSON `data` object
MAX_PARAMS = 32
MAX_SHARDS = 65536  # shard indexes are 0 … 65535 (register_node)
MAX_INT = (1 << 63) - 1
MAX_STR = 256

NODE_KEY = re.compile(r"[0-9a-f]{64}\Z")
HASH32 = re.compile(r"0x[0-9a-f]{64}\Z")
NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,128}\Z")
WORD = re.compile(r"[A-Za-z_]{1,32}\Z")
DIGITS = re.compile(r"[0-9]{1,19}\Z")  # ASCII only: str.isdigit/int accept other scripts


class QueryError(Exception):
    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _int_param(
    params: dict[str, Any], name: str, default: int | None = None, lo: int = 0, hi: int = MAX_INT
) -> int | None:
    """An integer parameter: a JSON integer or ASCII digits, within [lo, hi]."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and DIGITS.match(value):
        value = int(value)
    if type(value) is not int or not lo <= value <= hi:
        raise QueryError(Code.BAD_QUERY, f"{name}: expected an integer in [{lo}, {hi}]")
    return value


def _str_param(
    params: dict[str, Any], name: str, pattern: re.Pattern[str] | None = None
) -> str | None:
    """A string parameter (≤ 256 chars, matching `pattern` when given)."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_STR:
        raise QueryError(Code.BAD_QUERY, f"{name}: expected a string of ≤ {MAX_STR} chars")
    if pattern is not None and not pattern.match(value):
        raise QueryError(Code.BAD_QUERY, f"{name}: bad value {ascii(value)[:80]}")
    return value


def _bool_param(params: dict[str, Any], name: str) -> bool | None:
    value = params.get(name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise QueryError(Code.BAD_QUERY, f"{name}: expected true or false")


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
        "routable": node["status"] == SERVING and staked and trusted,
    }


def _nodes(state: State, params: dict[str, Any]) -> Any:
    shard = _int_param(params, "shard", hi=MAX_SHARDS - 1)
    model = _str_param(params, "model")
    status = _str_param(params, "status")
    role = _str_param(params, "role")
    out = []
    for key, node in state.committed_items("node"):
        if model is not None and node["model"] != model:
            continue
        if shard is not None and shard not in node["shards"]:
            continue
        if status is not None and node["status"] != status.upper():
            continue
        if role is not None and node["role"] != role:
            continue
        out.append(node_view(state, key, node))
    return {"nodes": out}


def _node(state: State, params: dict[str, Any]) -> Any:
    key = _str_param(params, "key") or ""
    node = state.committed("node", key) if NODE_KEY.match(key) else None
    if node is None:
        raise QueryError(Code.NOT_FOUND, f"node {ascii(key)[:80]} is not registered")
    return node_view(state, key, node)


def pool_health(state: State, model: str, shard_count: int | None = None) -> dict[str, Any]:
    """`shard_count` ≤ MAX_SHARDS (the answer lists one count per shard)."""
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
    total = min(shard_count or state.genesis.models.get(model) or highest + 1, MAX_SHARDS)
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
    model = _str_param(params, "model")
    shards = _int_param(params, "shards", lo=1, hi=MAX_SHARDS)
    if model is not None:
        return pool_health(state, model, shards)
    models = sorted(
        {node["model"] for _, node in state.committed_items("node")} | set(state.genesis.models)
    )
    return {"pools": [pool_health(state, model) for model in models]}


def _limit(params: dict[str, Any]) -> int:
    """`limit`: 1 … MAX_ITEMS (larger values are capped, as before; 0 means the maximum)."""
    value = _int_param(params, "limit", MAX_ITEMS) or MAX_ITEMS
    return max(1, min(value, MAX_ITEMS))


def _commitments(state: State, params: dict[str, Any]) -> Any:
    prefix = _str_param(params, "node", NODE_KEY)
    session_filter = _str_param(params, "session", HASH32)
    limit = _limit(params)
    out: list[dict[str, Any]] = []
    if prefix is None:
        items: Iterator[tuple[str, Any]] = state.committed_items("commit")
    elif session_filter is None:
        items = state.committed_items("commit", prefix + "/", prefix + "0")
    else:
        lower = f"{prefix}/{session_filter}/"
        items = state.committed_items("commit", lower, lower[:-1] + "0")
    for key, record in items:
        node, session, step, shard = key.split("/")
        if session_filter is not None and session != session_filter:
            continue
        if len(out) == limit:
            break
        out.append(
            {"node": node, "session": session, "step": int(step), "shard": int(shard), **record}
        )
    return {"commitments": out}


def _evidence(state: State, params: dict[str, Any]) -> Any:
    node = _str_param(params, "node", NODE_KEY)
    limit = _limit(params)
    items: list[dict[str, Any]] = []
    for _, record in state.committed_items("evidence"):
        if node is not None and record["node"] != node:
            continue
        items.append(record)
        if len(items) == limit:
            break
    return {"evidence": items}


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
    ident = _str_param(params, "id")
    if ident is not None:
        record = state.committed("verdict", ident) if HASH32.match(ident) else None
        if record is None:
            raise QueryError(Code.NOT_FOUND, f"verdict {ascii(ident)[:80]} not found")
        return verdict_view(record)
    confirmed = _bool_param(params, "confirmed")
    out = []
    for _, record in state.committed_items("verdict"):
        if confirmed is not None and record["confirmed"] != confirmed:
            continue
        out.append(verdict_view(record))
    return {"verdicts": out}


def _nonce(state: State, params: dict[str, Any]) -> Any:
    account = _str_param(params, "account") or ""
    nonce = state.committed("acct", account) if NODE_KEY.match(account) else None
    return {"account": account, "nonce": nonce or 0}


def _seeds(state: State, params: dict[str, Any]) -> Any:
    current = state.committed("meta", "current_epoch") or 1
    epoch = _int_param(params, "epoch", current) or 0
    return {"epoch": epoch, "seeds": seeds.seeds_of_epoch(state, epoch)}


def _spot_reports(state: State, params: dict[str, Any]) -> Any:
    current = state.committed("meta", "current_epoch") or 1
    return spot_reports.reports_view(state, _int_param(params, "epoch", current) or 0)


def _verifiers(state: State, params: dict[str, Any]) -> Any:
    return accusations.verifiers_view(state)


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
    "/params": _params,
    "/seeds": _seeds,
    "/verifiers": _verifiers,
    "/spot_reports": _spot_reports,
}

# the settlement routes (`payout_queries.py` reads this module's parameter helpers)
from abci_app.payout_queries import ROUTES as _PAYOUT_ROUTES  # noqa: E402

ROUTES.update(_PAYOUT_ROUTES)


def parse_params(path: str, data: bytes) -> tuple[str, dict[str, Any]]:
    """(route path, parameters) from the query path and JSON `data`; raises QueryError."""
    if len(path) > MAX_PATH:
        raise QueryError(Code.BAD_QUERY, f"query path over {MAX_PATH} characters")
    try:
        parts = urlsplit(path)
        params: dict[str, Any] = dict(parse_qsl(parts.query, max_num_fields=MAX_PARAMS))
    except ValueError:
        raise QueryError(Code.BAD_QUERY, "bad query string") from None
    if data:
        try:
            extra = parse_json(data, max_bytes=MAX_DATA, max_depth=1, max_int_digits=19)
        except JsonInputError as error:
            raise QueryError(Code.BAD_QUERY, f"query data: {error.message}") from None
        if not isinstance(extra, dict) or len(extra) > MAX_PARAMS:
            raise QueryError(Code.BAD_QUERY, "query data must be a JSON object")
        params.update(extra)
    return parts.path.rstrip("/") or "/", params


def query(state: State, path: str, data: bytes) -> tuple[Code, bytes, str]:
    """(code, canonical JSON answer, log) for one ABCI query. Parameters are typed per route
    (strings ≤ 256 chars, integers as JSON integers or ASCII digits within bounds); a
    parameter of the wrong type or out of range answers BAD_QUERY; unknown names are ignored."""
    try:
        route_path, params = parse_params(path, data)
        route = ROUTES.get(route_path)
        if route is None:
            return (
                Code.UNKNOWN_QUERY,
                b"",
                f"unknown query path {ascii(route_path)[:80]}; known: {sorted(ROUTES)}",
            )
        return Code.OK, canonical_json(route(state, params)), ""
    except QueryError as error:
        return error.code, b"", error.message
