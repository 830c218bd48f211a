"""ABCI Query: path-based, JSON answers over the committed state.

Parameters come from the path's query string (`/nodes?model=m&shard=1`) and/or a JSON object in
the request's `data` (`query_params.py` types them). Every answer is canonical JSON; unknown
paths answer `UNKNOWN_QUERY`.

    /nodes        ?model ?shard ?status ?role   nodes with lifecycle, stake, reputation, routable,
                  ?limit ?after                 grace (DOWN lately, else routable: liveness.py),
                                                speed (measured tokens/s or null: speeds.py);
                                                by key, 1000 registrations a page (`next` as
                                                /commitments: a page may list fewer)
    /node         ?key                          one node
    /pool_health  ?model ?shards                per-shard routable counts and status
                                                (healthy: every shard ≥ 3; degraded: some 1–2;
                                                 incomplete: some 0), the replica floor and
                                                the shards below it; without model: the
                                                genesis models' pools. Counted from the
                                                staked pools (`pool/`), not the registry
    /commitments  ?node ?session ?limit ?after  commit-reveal records, 1000 a page (`next`:
                                                the `after` of the next page, or null)
    /evidence     ?node ?limit ?after           reveal mismatches and equivocations by id,
                                                1000 a page (`next` as /commitments)
    /reputations  ?limit ?after                 R, window, untrusted per node, by key, 1000 a
                                                page (`next` as /commitments)
    /epochs       ?epoch                        leader, challenge list (default: the current epoch)
    /verdicts     ?id ?confirmed                votes and the signatures sorted by operator address
    /nonce        ?account                      last committed nonce (next must be greater)
    /params                                     genesis parameters, validators, height, app hash
    /seeds        ?epoch                        verifier seed commitments and reveals of an epoch
    /verifiers                                  confirmed / refused accusation marks per validator
    /verifier_endpoints                         where each verifier forwards its findings
    /numerics                                   per numerics version: the verifiers running
                                                it, their power, checked (at the floor) or
                                                not, the power a conviction needs (numerics.py)
    /gateways     ?key ?address                 gateway keys' payee bindings (gateway_bindings.py)
    /spot_reports ?epoch                        spot-check reports of e's checks, credits in e
    /coverage     ?node ?limit ?after           committed vs bought positions per shard, the
                                                `uncommitted` flag (without node: the flagged
                                                nodes, 1000 a page, `next` as /commitments)
    /payouts, /payouts/proof, /credits   settlement (`payout_queries.py`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from abci_app import (
    coverage,
    gateway_bindings,
    liveness,
    numerics,
    prices,
    schema,
    speeds,
    verifier_endpoints,
)
from abci_app.codes import Code
from abci_app.credit_locks import LOCK_ROUTES
from abci_app.credit_queries import CREDIT_ROUTES
from abci_app.payout_queries import PAYOUT_ROUTES
from abci_app.query_params import (
    COMMITMENT_KEY,
    HASH32,
    NODE_KEY,
    QueryError,
    bool_param,
    int_param,
    limit_param,
    parse_params,
    str_param,
)
from abci_app.relay_credits import RELAY_CREDIT_ROUTES
from abci_app.relay_queries import RELAY_ROUTES
from abci_app.state import State
from protocol.canonical import canonical_json

HEALTHY_MIN = 3
MAX_SHARDS = 65536  # shard indexes are 0 … 65535 (register_node)


def node_view(state: State, key: str, node: dict[str, Any]) -> dict[str, Any]:
    rep = state.committed(schema.REPUTATION, key) or {
        "r": state.genesis.reputation.initial,
        "window": [],
    }
    stake = state.committed(schema.STAKE, key) or {"agreed": None, "attestations": {}}
    agreed = stake["agreed"]
    params = state.genesis.reputation
    staked = agreed is not None and int(agreed) >= state.genesis.min_stake.get(node["role"], 0)
    trusted = rep["r"] >= params.untrusted_below
    entries = [r for _, r in state.committed_items(schema.COVERAGE, key + "/", key + "0")]
    uncommitted = coverage.flagged(entries)
    standing = staked and trusted and not uncommitted
    checked = numerics.node_checked(state, node)
    return {
        **node,
        "reputation": rep["r"],
        "untrusted": not trusted,
        "uncommitted": uncommitted,
        "stake": agreed,
        "stake_attestations": len(stake["attestations"]),
        "routable": node["status"] == schema.SERVING and standing,
        # DOWN lately, otherwise routable: a fallback while it answers clients (liveness.py)
        "grace": standing and liveness.in_grace(state, node, state.height),
        "prices": prices.current_prices(state, key),
        # measured decode speed, tokens/s: the verifiers' lower median, or null (speeds.py)
        "speed": speeds.measured_speed(state, key),
        # an announced version below the verifier floor (numerics.py): its bitwise checks
        # convict nobody; the field is absent for an unannounced node (judged by every check)
        **({"numerics_checked": checked} if checked is not None else {}),
    }


def _nodes(state: State, params: dict[str, Any]) -> Any:
    """`/nodes[?model][&shard][&status][&role][&after=KEY][&limit=N]`: the nodes matching the
    filters among the next `limit` registered keys after `after`, in key order. `next` is the
    last key the page passed (pass it back as `after`) when more follow, else null, so paging
    until null lists every matching node once; a page may hold fewer than `limit` nodes (the
    ones it passed over that do not match), never more, and reads at most `limit` records."""
    shard = int_param(params, "shard", hi=MAX_SHARDS - 1)
    model = str_param(params, "model")
    status = str_param(params, "status")
    role = str_param(params, "role")
    after = str_param(params, "after", NODE_KEY)
    limit = limit_param(params)
    out: list[dict[str, Any]] = []
    seen, last = 0, ""
    for key, node in state.committed_items(schema.NODE, after or ""):
        if key == after:
            continue  # the previous page's last key
        if seen == limit:
            return {"nodes": out, "next": last}
        seen += 1
        last = key
        if model is not None and node["model"] != model:
            continue
        if shard is not None and shard not in node["shards"]:
            continue
        if status is not None and node["status"] != status.upper():
            continue
        if role is not None and node["role"] != role:
            continue
        out.append(node_view(state, key, node))
    return {"nodes": out, "next": None}


def _node(state: State, params: dict[str, Any]) -> Any:
    key = str_param(params, "key") or ""
    node = state.committed(schema.NODE, key) if NODE_KEY.match(key) else None
    if node is None:
        raise QueryError(Code.NOT_FOUND, f"node {ascii(key)[:80]} is not registered")
    return node_view(state, key, node)


def routable(state: State, key: str, node: dict[str, Any]) -> bool:
    """`node_view(...)["routable"]` with the cheap tests first: a node that is not SERVING
    costs no further read, one unstaked costs one (its stake record)."""
    if node["status"] != schema.SERVING:
        return False
    stake = state.committed(schema.STAKE, key)
    agreed = None if stake is None else stake["agreed"]
    if agreed is None or int(agreed) < state.genesis.min_stake.get(node["role"], 0):
        return False
    rep = state.committed(schema.REPUTATION, key)
    r = state.genesis.reputation.initial if rep is None else rep["r"]
    if r < state.genesis.reputation.untrusted_below:
        return False
    shards = [e for _, e in state.committed_items(schema.COVERAGE, key + "/", key + "0")]
    return not coverage.flagged(shards)


def _pool_counts(state: State, models: set[str]) -> dict[str, tuple[dict[int, int], int]]:
    """{model: ({shard: routable compute nodes}, highest shard of its staked nodes or -1)} for
    `models`, from the staked pools alone (`pool/<model>/<key>`, registry.py `update_pool`): a
    node outside them cannot be routable, so a free registration or heartbeat costs this query
    no read; each staked node of a model costs its index row, its record and what `routable`
    reads."""
    found: dict[str, tuple[dict[int, int], int]] = {}
    for model in sorted(models):
        counts: dict[int, int] = {}
        highest = -1
        for entry, _ in state.committed_items(schema.POOL, model + "/", model + "0"):
            key = entry[len(model) + 1 :]
            node = None if "/" in key else state.committed(schema.NODE, key)
            if node is None:  # a key of another model whose name goes on after `<model>/`
                continue
            highest = max(highest, *node["shards"])
            if routable(state, key, node):
                for shard in node["shards"]:
                    counts[shard] = counts.get(shard, 0) + 1
        found[model] = (counts, highest)
    return found


def pool_health(
    state: State,
    model: str,
    shard_count: int | None = None,
    counted: tuple[dict[int, int], int] | None = None,
) -> dict[str, Any]:
    """Routable compute nodes per shard and the pool status (UNFED AI pool health);
    `shard_count` ≤ MAX_SHARDS (the answer lists one count per shard). `counted`: the model's
    `_pool_counts` when the caller has them."""
    counts, highest = counted or _pool_counts(state, {model})[model]
    total = min(shard_count or state.genesis.models.get(model) or highest + 1, MAX_SHARDS)
    per_shard = [counts.get(shard, 0) for shard in range(total)]
    floor = state.genesis.replica_floor
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
        # the shards with fewer routable nodes than genesis `replica_floor` (joiners fill them)
        "replica_floor": floor,
        "below_floor": [shard for shard, count in enumerate(per_shard) if count < floor],
    }


def _pool_health(state: State, params: dict[str, Any]) -> Any:
    """With `model`: that pool. Without: the pools of the genesis `models` only (models are
    free to name at registration: listing every model seen made one query read the registry
    once per model, 4 million records for 2 000 one-node models). Either reads the staked
    pools alone (`_pool_counts`), never the free registrations."""
    model = str_param(params, "model")
    shards = int_param(params, "shards", lo=1, hi=MAX_SHARDS)
    if model is not None:
        return pool_health(state, model, shards)
    found = _pool_counts(state, set(state.genesis.models))
    return {"pools": [pool_health(state, m, None, found[m]) for m in sorted(found)]}


def _commitments(state: State, params: dict[str, Any]) -> Any:
    """Records in key order, a page at a time: `next` is the last key of a full page when more
    follow (pass it back as `after`), else null."""
    prefix = str_param(params, "node", NODE_KEY)
    session_filter = str_param(params, "session", HASH32)
    after = str_param(params, "after", COMMITMENT_KEY)
    limit = limit_param(params)
    out: list[dict[str, Any]] = []
    if prefix is None:
        lower, upper = "", None
    elif session_filter is None:
        lower, upper = prefix + "/", prefix + "0"
    else:
        lower = f"{prefix}/{session_filter}/"
        upper = lower[:-1] + "0"
    if after is not None and after > lower:
        lower = after
    last: str | None = None
    for key, record in state.committed_items(schema.COMMITMENT, lower, upper):
        if key == after:
            continue  # the previous page's last record
        node, session, step, shard = key.split("/")
        if session_filter is not None and session != session_filter:
            continue
        if len(out) == limit:
            return {"commitments": out, "next": last}
        out.append(
            {"node": node, "session": session, "step": int(step), "shard": int(shard), **record}
        )
        last = key
    return {"commitments": out, "next": None}


def _evidence(state: State, params: dict[str, Any]) -> Any:
    """Records by id, a page at a time: `next` is the last id of a full page when more follow
    (pass it back as `after`), else null."""
    node = str_param(params, "node", NODE_KEY)
    after = str_param(params, "after", HASH32)
    limit = limit_param(params)
    items: list[dict[str, Any]] = []
    last: str | None = None
    for key, record in state.committed_items(schema.EVIDENCE, after or ""):
        if key == after or (node is not None and record["node"] != node):
            continue
        if len(items) == limit:
            return {"evidence": items, "next": last}
        items.append(record)
        last = key
    return {"evidence": items, "next": None}


def _reputations(state: State, params: dict[str, Any]) -> Any:
    """`/reputations[?after=KEY][&limit=N]`: the reputation records of the next `limit` keys
    after `after`, in key order, as {key: record}. `next` is the page's last key when more
    follow (pass it back as `after`), else null: paging until null lists every record once.
    `scale` and `untrusted_below` are the genesis parameters (`/params` has them too)."""
    rep_params = state.genesis.reputation
    after = str_param(params, "after", NODE_KEY)
    limit = limit_param(params)
    out: dict[str, dict[str, Any]] = {}
    last: str | None = None
    for key, record in state.committed_items(schema.REPUTATION, after or ""):
        if key == after:
            continue  # the previous page's last key
        if len(out) == limit:
            return _reputation_page(state, out, last)
        out[key] = {**record, "untrusted": record["r"] < rep_params.untrusted_below}
        last = key
    return _reputation_page(state, out, None)


def _reputation_page(
    state: State, records: dict[str, dict[str, Any]], cursor: str | None
) -> dict[str, Any]:
    return {
        "scale": 1_000_000,
        "untrusted_below": state.genesis.reputation.untrusted_below,
        "reputations": records,
        "next": cursor,
    }


def _epochs(state: State, params: dict[str, Any]) -> Any:
    current = state.committed(schema.META, "current_epoch") or 1
    wanted = int_param(params, "epoch")
    numbers = [wanted] if wanted is not None else [current]
    epochs = [state.committed(schema.EPOCH, str(n)) for n in numbers]
    return {
        "current": current,
        "height": state.height,
        "epochs": [e for e in epochs if e is not None],
    }


def verdict_view(record: dict[str, Any], total_power: int) -> dict[str, Any]:
    """A verdict as `/verdicts` lists it: the voters' and the ratifiers' signatures together,
    ascending by operator (what `FraudProofs.slashByVerdict` takes), `ratifiers` the operators
    that ratified (abci_app/ratifications.py)."""
    ratifications = record.get("ratifications", {})
    signed = [*record["votes"].values(), *ratifications.values()]
    signed.sort(key=lambda v: int(v["operator"], 16))
    power = record["power"] + record.get("ratified_power", 0)
    return {
        **{k: v for k, v in record.items() if k not in ("votes", "ratifications")},
        "signers": [v["operator"] for v in signed],
        "signatures": [v["signature"] for v in signed],
        "ratifiers": sorted((v["operator"] for v in ratifications.values()), key=_hex_int),
        # confirmed by a numerics version's quorum (numerics.py): FraudProofs accepts its
        # signatures only once votes and ratifications hold 2/3 of all the power (Committee.sol)
        **({"relayable": 3 * power >= 2 * total_power} if "quorum_numerics" in record else {}),
    }


def _hex_int(text: str) -> int:
    return int(text, 16)


def _verdicts(state: State, params: dict[str, Any]) -> Any:
    ident = str_param(params, "id")
    if ident is not None:
        record = state.committed(schema.VERDICT, ident) if HASH32.match(ident) else None
        if record is None:
            raise QueryError(Code.NOT_FOUND, f"verdict {ascii(ident)[:80]} not found")
        return verdict_view(record, state.total_power)
    confirmed = bool_param(params, "confirmed")
    out = []
    for _, record in state.committed_items(schema.VERDICT):
        if confirmed is not None and record["confirmed"] != confirmed:
            continue
        out.append(verdict_view(record, state.total_power))
    return {"verdicts": out}


def _nonce(state: State, params: dict[str, Any]) -> Any:
    account = str_param(params, "account") or ""
    nonce = state.committed(schema.NONCE, account) if NODE_KEY.match(account) else None
    return {"account": account, "nonce": nonce or 0}


def _seeds(state: State, params: dict[str, Any]) -> Any:
    current = state.committed(schema.META, "current_epoch") or 1
    epoch = int_param(params, "epoch", current) or 0
    start, stop = schema.epoch_range(epoch)
    seeds = [
        {"signer": key[len(start) :], **record}
        for key, record in state.committed_items(schema.SEED, start, stop)
    ]
    return {"epoch": epoch, "seeds": seeds}


def _spot_reports(state: State, params: dict[str, Any]) -> Any:
    current = state.committed(schema.META, "current_epoch") or 1
    epoch = int_param(params, "epoch", current) or 0
    start, stop = schema.epoch_range(epoch)
    return {
        "epoch": epoch,
        "reports": [
            {"signer": key[len(start) :], **value}
            for key, value in state.committed_items(schema.SPOT_REPORT, start, stop)
        ],
        "credits": [
            {"account": key[len(start) :], "spot_checks": value}
            for key, value in state.committed_items(schema.SPOT_CREDIT, start, stop)
        ],
    }


def _coverage(state: State, params: dict[str, Any]) -> Any:
    current = state.committed(schema.META, "current_epoch") or 1
    node = str_param(params, "node", NODE_KEY)
    if node is None:  # the flagged nodes, a page at a time (`after`: the last node listed)
        limit = limit_param(params)
        after = str_param(params, "after", NODE_KEY)
        flagged: list[str] = []
        start = "" if after is None else after + "0"  # past every `<after>/<shard>` key
        for key, record in state.committed_items(schema.COVERAGE, start):
            name = key.split("/", 1)[0]
            if record["uncommitted_since"] is not None and name not in flagged:
                if len(flagged) == limit:
                    return {"epoch": current, "uncommitted": flagged, "next": flagged[-1]}
                flagged.append(name)
        return {"epoch": current, "uncommitted": flagged, "next": None}
    items = list(state.committed_items(schema.COVERAGE, node + "/", node + "0"))
    return {
        "node": node,
        "epoch": current,
        "uncommitted": coverage.flagged(r for _, r in items),
        "shards": [coverage.shard_view(state, key, record, current) for key, record in items],
    }


def _verifiers(state: State, params: dict[str, Any]) -> Any:
    return {"verifiers": dict(state.committed_items(schema.VERIFIER_RECORD))}


def _params(state: State, params: dict[str, Any]) -> Any:
    return {
        "chain_id": state.chain_id,
        "height": state.height,
        "app_hash": state.app_hash.hex(),
        "vote_extensions_enable_height": state.ve_enable_height,
        "genesis": state.genesis.view(),
        "validators": state.validators,
    }


Route = Callable[[State, dict[str, Any]], Any]
ROUTES: dict[str, Route] = {
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
    "/verifier_endpoints": verifier_endpoints.endpoints,
    "/numerics": numerics.view,
    "/gateways": gateway_bindings.gateways,
    "/spot_reports": _spot_reports,
    "/coverage": _coverage,
    "/prices": prices.prices_query,
    **PAYOUT_ROUTES,
    **CREDIT_ROUTES,
    **LOCK_ROUTES,
    **RELAY_ROUTES,
    **RELAY_CREDIT_ROUTES,
}


def query(
    state: State, path: str, data: bytes, local: dict[str, Route] | None = None
) -> tuple[Code, bytes, str]:
    """(code, canonical JSON answer, log) for one ABCI query. Parameters are typed per route
    (strings ≤ 256 chars, integers as JSON integers or ASCII digits within bounds); a
    parameter of the wrong type or out of range answers BAD_QUERY; unknown names are ignored.
    `local`: routes whose answer needs this validator's own files (its credit keys)."""
    try:
        route_path, params = parse_params(path, data)
        route = ROUTES.get(route_path) or (local or {}).get(route_path)
        if route is None:
            return (
                Code.UNKNOWN_QUERY,
                b"",
                f"unknown query path {ascii(route_path)[:80]}; known: {sorted(ROUTES)}",
            )
        return Code.OK, canonical_json(route(state, params)), ""
    except QueryError as error:
        return error.code, b"", error.message
