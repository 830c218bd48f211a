"""Settlement queries (committed state only; `queries.ROUTES` serves `PAYOUT_ROUTES`).

/payouts        ?epoch ?account ?limit   one statement (`epoch` = its number: page p of committee
                ?after                   epoch e is e + p·2^32), rows and signatures; without
                                         `epoch` a page of the stored statements (newest
                                         first, by key: an epoch's pages from the last to 0),
                                         each with `amount` for `account` when given: {epochs,
                                         next}; `next` is the `after` of the next page (the
                                         number of this page's last statement), null on the
                                         last (1,000 a page at most)
/payouts/proof  ?epoch ?account          amount + Merkle proof for `QueryEscrow.claim`
/credits        ?account ?epoch          redeemed layer-tokens of an account in an epoch
                                         (default: the current one, not yet closed)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from abci_app import schema
from abci_app.codes import Code
from abci_app.query_params import (
    ACCOUNT,
    QueryError,
    int_param,
    limit_param,
    str_param,
)
from abci_app.settlement import statement_record_key
from abci_app.state import State
from shares.merkle import build_tree, payout_leaf_hashes, tree_proof

MAX_EPOCH = (1 << 63) - 1
TREE_CACHE = 4  # payout trees kept for proof queries (a 100,000-row tree is ~15 MB)

# (epoch, root) → (tree, tree node of each row, row of each account): a claim wave asks for
# many proofs of the same epoch; rebuilding the tree each time would cost O(rows) per query.
# Answers depend only on the committed record, so the cache changes no answer.
_trees: OrderedDict[tuple[int, str], tuple[Any, Any, dict[str, int]]] = OrderedDict()


def payout_view(record: dict[str, Any]) -> dict[str, Any]:
    """A stored statement with its signatures sorted by operator address (ascending, as
    `Committee.verify` requires), ready for `postPayoutRoot`."""
    votes = sorted(record["votes"].values(), key=lambda v: int(v["operator"], 16))
    return {
        **{k: v for k, v in record.items() if k != "votes"},
        "statement": {
            "epoch": record["epoch"],
            "root": record["root"],
            "total": record["total"],
            "queries_hash": record["queries_hash"],
            "consumer": record["consumer"],
        },
        "signers": [v["operator"] for v in votes],
        "signatures": [v["signature"] for v in votes],
    }


def _amount(record: dict[str, Any], account: str) -> int:
    for row_account, amount in record["rows"]:
        if row_account == account:
            return int(amount)
    return 0


def _record(state: State, number: int) -> dict[str, Any]:
    key = statement_record_key(number)
    record = state.committed(schema.PAYOUT, key) if key is not None else None
    if record is None:
        raise QueryError(Code.NOT_FOUND, f"no payout statement number {number}")
    return record


def _payouts(state: State, params: dict[str, Any]) -> Any:
    epoch = int_param(params, "epoch", lo=1, hi=MAX_EPOCH)
    account = str_param(params, "account", ACCOUNT)
    if epoch is not None:
        view = payout_view(_record(state, epoch))
        if account is not None:
            view["amount"] = str(_amount(view, account.lower()))
        return view
    limit = limit_param(params)
    after = int_param(params, "after", lo=1, hi=MAX_EPOCH)
    stop = None if after is None else statement_record_key(after)
    if after is not None and stop is None:
        raise QueryError(Code.BAD_QUERY, f"after: {after} is not a statement number")
    summaries: list[dict[str, Any]] = []
    cursor: str | None = None
    for _, record in state.committed_items(schema.PAYOUT, "", stop, descending=True):
        if len(summaries) == limit:
            cursor = str(summaries[-1]["epoch"])  # more follow
            break
        summary = {
            k: record[k]
            for k in (
                "epoch",
                "committee_epoch",
                "page",
                "pages",
                "root",
                "total",
                "queries_hash",
                "consumer",
                "closed_height",
            )
        }
        summary.update(
            confirmed=record["confirmed"],
            power=record["power"],
            signatures=len(record["votes"]),
            queries=len(record["query_ids"]),
            accounts=len(record["rows"]),
        )
        if account is not None:
            summary["amount"] = str(_amount(record, account.lower()))
            summary["shares"] = record["shares"].get(account.lower(), "0")
        summaries.append(summary)
    return {
        "current_epoch": state.committed(schema.META, "current_epoch") or 1,
        "epochs": summaries,
        "next": cursor,
    }


def _proof(state: State, params: dict[str, Any]) -> Any:
    epoch = int_param(params, "epoch", lo=1, hi=MAX_EPOCH)
    account = str_param(params, "account", ACCOUNT)
    if epoch is None or account is None:
        raise QueryError(Code.BAD_QUERY, "epoch and account are required")
    record = _record(state, epoch)
    account = account.lower()
    if not record["rows"]:  # a statement of credit purchases only pays nothing out
        raise QueryError(Code.NOT_FOUND, f"{account} has no payout in epoch {epoch}")
    tree, node_of, row_of = _tree(epoch, record)
    row = row_of.get(account)
    if row is None:
        raise QueryError(Code.NOT_FOUND, f"{account} has no payout in epoch {epoch}")
    return {
        "epoch": epoch,
        "account": account,
        "amount": record["rows"][row][1],
        "root": record["root"],
        "proof": ["0x" + step.hex() for step in tree_proof(tree, node_of[row])],
        "confirmed": record["confirmed"],
    }


def _tree(epoch: int, record: dict[str, Any]) -> tuple[Any, Any, dict[str, int]]:
    cache_key = (epoch, record["root"])
    cached = _trees.get(cache_key)
    if cached is not None:
        _trees.move_to_end(cache_key)
        return cached
    rows = [(a, int(amount)) for a, amount in record["rows"]]
    tree, node_of = build_tree(payout_leaf_hashes(epoch, rows))
    built = (tree, node_of, {a: i for i, (a, _) in enumerate(rows)})
    _trees[cache_key] = built
    while len(_trees) > TREE_CACHE:
        _trees.popitem(last=False)
    return built


def _credits(state: State, params: dict[str, Any]) -> Any:
    account = str_param(params, "account", ACCOUNT)
    if account is None:
        raise QueryError(Code.BAD_QUERY, "account is required")
    current = state.committed(schema.META, "current_epoch") or 1
    epoch = int_param(params, "epoch", current, lo=1, hi=MAX_EPOCH) or current
    prefix = f"{schema.in_epoch(epoch, account.lower())}/"
    credits = [
        {"model": c["model"], "shard": c["shard"], "layer_tokens": c["layer_tokens"]}
        for _, c in state.committed_items(schema.CREDIT, prefix, prefix[:-1] + "0")
    ]
    return {"epoch": epoch, "account": account.lower(), "credits": credits}


PAYOUT_ROUTES: dict[str, Callable[[State, dict[str, Any]], Any]] = {
    "/payouts": _payouts,
    "/payouts/proof": _proof,
    "/credits": _credits,
}
