"""Prices on chain: how many positions one bearer credit buys on a compute node's shard.

    set_price{model, shard, positions}
        a compute node, not LEFT, on a (model, shard) it registered (PRICE_SHARD; WRONG_ROLE,
        INVALID_LIFECYCLE, NOT_REGISTERED by `rules.compute_node`), registers its price:
        `positions` per credit, 0 = free. The node's first price on the shard counts from the
        block's own epoch (nothing was on the chain before it that anyone relied on); every
        later change counts from the NEXT epoch, so the price of an epoch is fixed once the
        epoch has begun and clients paying during it pay what the chain said at its start.
        A second change in the same epoch replaces the first; a change back to the current
        price cancels the pending one. → `price/<node>/<shard>` = {model, schedule [[from
        epoch, positions], ...]}, trimmed to the entries a creditable epoch still reads.

**Reading a price** (`price_at`): the positions of the last schedule entry whose `from` ≤ the
epoch; none before the first entry (unpriced).

**What a redemption consumes** (`redemption_price`, used by credits.py `redeem`): a redemption
of N credits on a shard consumes N × p committed served positions, p = the lowest positive
price the node had registered on that shard during the creditable epochs (the block's epoch
and the `commit_grace_epochs` before it: the epochs whose commitments a redemption may
consume, coverage.py). The lowest, because credits taken in one of those epochs at its price
may be redeemed in a later one: an honest node never needs more positions than it served, and a
node can never redeem more credits than its lowest recent price allows.

**A shard with no price is paid nothing** (`REDEMPTION_UNPRICED`): a node that registered no
price above 0 there during the creditable epochs — none at all, or 0 (free, what `--free` nodes
register) — redeems no credit on it. The chain's price is the only one anybody pays: gateways
and clients never pay a node the chain has no price for (`price_unregistered`,
node/client/paying.py; the gateway's router does not route a charging node without one), so
such a node holds no credit it was paid at a price the chain knows, and a credit it redeemed
anyway would pay it what the chain never said.

**The going price** (`protocol.committee.prices.going_price`): the median of the positive
current prices registered for the model (the lower middle of an even count), else
`DEFAULT_PRICE_POSITIONS`: what `planet join` charges when not told. `/prices?model=` pages
(registering is free, so no answer lists every price): the reader works it out from every page.
"""

from __future__ import annotations

from typing import Any

from abci_app import left_shards, rules, schema
from abci_app.codes import Code
from abci_app.query_params import NODE_KEY, PRICE_CURSOR, limit_param, str_param
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.prices import SetPrice


def price_at(record: dict[str, Any] | None, epoch: int) -> int | None:
    """The registered positions per credit in `epoch` (None: not priced yet then)."""
    price = None
    for start, positions in (record or {}).get("schedule", []):
        if start > epoch:
            break
        price = positions
    return price


def _trimmed(schedule: list[list[int]], oldest: int) -> list[list[int]]:
    """`schedule` without the entries no epoch ≥ `oldest` reads (the last one with from ≤
    oldest stays: it is the price of `oldest`)."""
    first = 0
    for index, (start, _) in enumerate(schedule):
        if start <= oldest:
            first = index
    return [list(entry) for entry in schedule[first:]]


def set_price(state: State, tx: SignedTx) -> None:
    body: SetPrice = tx.body
    node = rules.compute_node(state, tx.signer)
    if body.model != node["model"] or body.shard not in node["shards"]:
        rules.reject(
            Code.PRICE_SHARD, f"shard {body.shard} of {body.model} is not registered by this node"
        )
    current = rules.epoch_of(state, state.block_height)
    key = schema.price_key(tx.signer, body.shard)
    record = state.get(schema.PRICE, key)
    if record is None:
        schedule = [[current, body.positions]]
        starts = current
    else:
        schedule = [list(e) for e in record["schedule"] if e[0] <= current]
        starts = current + 1
        if price_at({"schedule": schedule}, current) != body.positions:
            schedule.append([starts, body.positions])
    oldest = current - state.genesis.commit_grace_epochs
    state.put(schema.PRICE, key, {"model": body.model, "schedule": _trimmed(schedule, oldest)})
    state.emit(
        "planet.price", node=tx.signer, shard=body.shard, positions=body.positions, epoch=starts
    )


def redemption_price(state: State, node: str, shard: int) -> int:
    """Positions one credit redeemed by `node` on `shard` in this block consumes (module doc);
    refuses the tx `REDEMPTION_UNPRICED` when the node had no price above 0 there."""
    current = rules.epoch_of(state, state.block_height)
    record = state.get(schema.PRICE, schema.price_key(node, shard))
    if record is None:  # a shard the node moved away from: its price there (left_shards.py)
        record = left_shards.price_record(state, node, shard)
    grace = state.genesis.commit_grace_epochs
    prices = [price_at(record, epoch) for epoch in range(max(1, current - grace), current + 1)]
    positive = [p for p in prices if p]
    if not positive:
        rules.reject(
            Code.REDEMPTION_UNPRICED,
            f"no price above 0 registered on shard {shard} in epochs {max(1, current - grace)}"
            f"..{current}: credits are redeemed only at a price on the chain (set_price first)",
        )
    return min(positive)


def forget(state: State, node: str) -> None:
    """The node's registration was deleted: its prices go with it."""
    for key, _ in state.items(schema.PRICE, node + "/", node + "0"):
        state.delete(schema.PRICE, key)


# --- queries ------------------------------------------------------------------------------------


def current_prices(state: State, node: str) -> dict[str, int]:
    """{shard: positions per credit} of `node` in the epoch of the next block (committed view;
    unpriced shards absent)."""
    epoch = rules.epoch_of(state, state.height + 1)
    out: dict[str, int] = {}
    for key, record in state.committed_items(schema.PRICE, node + "/", node + "0"):
        price = price_at(record, epoch)
        if price is not None:
            out[str(int(key.rsplit("/", 1)[1]))] = price
    return out


def prices_query(state: State, params: dict[str, Any]) -> Any:
    """`/prices[?model=M][&node=K][&after=CURSOR][&limit=N]`: the registered prices among the
    next `limit` price records after `after` (key order: node, then shard; one node's only with
    `node`), in the next block's epoch, and the next change of each. `next` is the last record
    key the page passed (`<node>/<shard, 5 digits>`, pass it back as `after`) when more follow,
    else null; a page lists at most `limit` rows (fewer when it passed another model's or a
    departed node's records) and reads at most `limit` price records. The model's going price
    (`protocol.committee.prices.going_price`) is the reader's to work out from every page."""
    model = str_param(params, "model")
    only = str_param(params, "node", NODE_KEY)
    after = str_param(params, "after", PRICE_CURSOR)
    limit = limit_param(params)
    epoch = rules.epoch_of(state, state.height + 1)
    lower, upper = ("", None) if only is None else (only + "/", only + "0")
    if after is not None and after > lower:
        lower = after
    rows: list[dict[str, Any]] = []
    seen, last = 0, ""
    for key, record in state.committed_items(schema.PRICE, lower, upper):
        if key == after:
            continue  # the previous page's last record
        if seen == limit:
            return {"epoch": epoch, "prices": rows, "next": last}
        seen += 1
        last = key
        node_key, shard = key.split("/", 1)
        if model is not None and record["model"] != model:
            continue
        node = state.committed(schema.NODE, node_key)
        if node is None or node["status"] == schema.LEFT:
            continue
        pending = [e for e in record["schedule"] if e[0] > epoch]
        rows.append(
            {
                "node": node_key,
                "model": record["model"],
                "shard": int(shard),
                "positions": price_at(record, epoch),
                "next": {"epoch": pending[0][0], "positions": pending[0][1]} if pending else None,
            }
        )
    return {"epoch": epoch, "prices": rows, "next": None}
