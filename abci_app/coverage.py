"""Commitment coverage: no commitment, no pay, no routing.

A compute node commits one record per block of 32 positions it served (commitments.py), and
locks on the committee the credits its clients paid it with before it serves them
(`credit_lock`, credit_locks.py). This module holds the two side by side: what the node
committed and what credits bought from it. Both counts come from txs the node signs itself;
nothing another party reports (a gateway's served counts included) decides anything here
(issue 45: no trusted list of gateways). Five rules:

1. **No commitment, no pay.** A compute node is paid through the credits it redeems, and a
   `redeem` of n credits on a shard consumes n × price committed positions of the same node
   and shard, committed in the block's epoch or the `commit_grace_epochs` before it, oldest
   epoch first (`take_positions`; `UNCOMMITTED_REDEMPTION` when nothing is left; each record
   stands for 32 positions, a session's last, partial block too: an upper bound). Credit-paid
   work is committed, and so selectable for spot checks, or it is not paid.
2. **No commitment, no routing.** A `credit_lock` of n new credits on a shard adds n × p positions
   to what credits bought there (`bought`; p = the node's registered price on the shard in the
   block's epoch, at least 1: a credit buys at least one position). A session's last credit is paid
   ahead and may be used in part, so each session begun (a committed step 0) adds p − 1 positions of
   slack to the covered side (`slack`, at the price of the commit's epoch). When an epoch e closes,
   with g = `commit_grace_epochs` and a window of W = `WINDOW_FACTOR` · (g + 1) epochs (30 at the
   default g = 2): every (node, shard) whose charged positions (rule 4) plus slack of epochs e − g −
   W + 1 .. e are below `COVER_MIN_PPM` of the positions credits bought there in epochs e − g − W +
   1 .. e − g is flagged `uncommitted` (`uncommitted_since` = the first such epoch); `/node` and
   `/nodes` then answer `uncommitted: true, routable: false`, so gateways and next hops stop routing
   to it. The flag clears at the first close where the window is covered again: a node that stopped
   selling uncommitted positions (or sold nothing since) is routable again W + g epochs later, so a
   burst of failed sessions — or a client paying for sessions it then breaks, at its own cost —
   never shuts a node out for good, while a node that keeps selling uncommitted positions is routed
   again only for the g epochs it takes to flag its next sales, once per W + g. An honest node
   commits every position it serves within seconds and locks only the credits of sessions it serves,
   so committed + slack ≥ bought (ceil(s / p) · p ≤ s + p − 1 per session); half is a wide margin,
   and the grace epochs absorb the lag of sessions sealed late. A node that sells positions it does
   not commit (to keep its work out of spot checks) is flagged while it does; it cannot redeem those
   credits either (rule 1). Nobody but the node moves either count: a stranger can neither flag an
   honest node nor clear a flag.
3. **Checks scale with the work, not with what the node chooses to commit.** The number of
   records a node committed in an epoch (`blocks_in`) sets its spot-check floor
   (protocol/spotcheck.py `node_rate_ppm`): a node that commits only a little is checked on a
   larger share of it, and one that commits less than half of what credits bought is flagged.
4. **Free positions cover nothing.** An epoch's records are *charged* when the node's
   registered price on the shard in that epoch is above 0, else *free* (0, or no price yet; the
   price of an epoch is final once it has begun, prices.py, so its close settles them:
   `charged`, `free`). Free records are stored and selectable for spot checks like any, and
   count in the floor's n (rule 3), but nobody paid for them: a redemption consumes charged
   records only (rule 1), and only charged positions (+ slack) cover a sale (rule 2). Before,
   a node could serve free traffic, start charging and cash its new clients' credits against
   the free commitments, leaving the paid work uncommitted. A free node's commitments are
   judged by spot checks alone: nothing was sold, so rules 2 and 5 have nothing to compare.
5. **No sale, no charged commitments.** A charging node computes a session's positions only
   while its client's credits cover them, and its agent locks each credit it takes (or redeems
   it, which locks and spends it at once: `credits.credit_work` adds it to `bought`). So at the
   close of e, a (node, shard) with charged positions committed in epochs e − g − W + 1 .. e − g
   while credits bought nothing there in epochs e − 2g − W + 1 .. e (a lock may land up to g
   epochs either side of the work it paid for) served sessions the chain never saw sold — its
   clients' credits unlocked, or junk committed to cover later sales — and is flagged like an
   uncovered one (`unsold`; same flag, same window, same way out). A node that locks nothing
   and commits nothing leaves no trace on the chain at all: it is paid nothing (rule 1), and
   no rule built on its own txs can see it (gateways' counts are no evidence).

Gateways' reports carry no served counts (settlement.py): nothing another party says enters
these counts.

State: `cover/<node>/<shard:05d>` = {committed (positions, cumulative, charged or free), charged
(positions of charged epochs, cumulative, settled at each close), free (positions of free epochs,
likewise), bought (positions, cumulative), slack (positions, cumulative), marks [[epoch, bought,
charged + slack, charged at that epoch's close]] (the window's closes and the g before them), recent
[[epoch, records, consumed positions, sessions begun]] (epochs still redeemable or selectable),
uncommitted_since (epoch or null)}.

Who is judged (issue 42: work at the epoch boundary grows with stake, not with what strangers
register). Only a compute node of the staked pools may `commit` (`NOT_STAKED`, commitments.py), so
no free registration adds a record; an epoch close reads the entries of the staked pools' members
and of the nodes that left the pools during the epoch (`covdue/<node>`, `left_pool`), never the
whole `cover/` prefix (`judged_nodes`). A node whose stake ends mid-epoch is judged at that close,
so the records it committed while staked are settled as charged or free like any; they stay
redeemable for their grace epochs (a redemption asks no stake), and the node reveals them as usual.
While it is unstaked its entries are frozen (no marks, no flag change: it is not routable anyway);
once staked again it is judged at every close, the epochs it missed read as no change
(`_marks_from`). A node that stakes mid-epoch commits from its staking block on and is judged at
that epoch's close. Entries of nodes that have LEFT are deleted at the next close; those of an
expired registration when it is deleted (`forget`). An unstaked node can still write an entry
through `credit_lock` (on a chain without `credits.holder_bound` a lock names any id): no close
reads it, and it goes when the registration expires.

Queries: `/coverage?node=` (per shard, creditable positions, blocks per recent epoch, the flag)
and `/coverage` (the flagged nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from abci_app import left_shards, prices, rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.fingerprint import BLOCK_POSITIONS

COVER_MIN_PPM = 500_000  # committed positions (+ slack) must reach half of the bought ones
REPORT_LAG = 2  # epochs after e during which e's spot checks are judged (spot_reports.py)
MAX_COUNT = (1 << 63) - 1
# the flag judges the sales of WINDOW_FACTOR · (grace + 1) epochs: long enough that a node that
# keeps selling uncommitted positions is flagged most of the time (it is routed again only
# after its last sales leave the window), short enough that a burst of unserved credits does
# not shut an honest node out for good (it was routed nothing meanwhile, so it could not commit)
WINDOW_FACTOR = 10


def _empty() -> dict[str, Any]:
    return {
        "committed": 0,
        "charged": 0,
        "free": 0,
        "bought": 0,
        "slack": 0,
        "marks": [],
        "recent": [],
        "uncommitted_since": None,
    }


def _keep_from(state: State, epoch: int) -> int:
    """The oldest epoch whose `recent` row still matters at `epoch`."""
    return epoch - max(state.genesis.commit_grace_epochs, REPORT_LAG) - 1


def _load(state: State, node: str, shard: int) -> dict[str, Any]:
    record = state.get(schema.COVERAGE, schema.coverage_key(node, shard))
    return {**_empty(), **record} if record is not None else _empty()


def unit_price(state: State, node: str, shard: int, epoch: int) -> int:
    """Positions one credit buys from `node` on `shard` in `epoch`: its registered price, at
    least 1 (unpriced or free: a credit still buys one position)."""
    record = state.get(schema.PRICE, schema.price_key(node, shard))
    return max(1, prices.price_at(record, epoch) or 0)


def epoch_price(state: State, node: str, shard: int, epoch: int) -> int:
    """The node's registered price on `shard` in `epoch` as the chain holds it (0: free or
    unpriced; a shard it moved away from: its price there, left_shards.py). Exact for the
    epochs a redemption or a close reads (prices.py keeps the schedule from e − G)."""
    record = state.get(schema.PRICE, schema.price_key(node, shard))
    if record is None:
        record = left_shards.price_record(state, node, shard)
    return prices.price_at(record, epoch) or 0


def _charged_epochs(state: State, node: str, shard: int, record: dict[str, Any]) -> set[int]:
    """The epochs of `record`'s `recent` rows whose price on the shard was above 0: only their
    records pay a redemption (rule 4: free positions cover nothing)."""
    return {r[0] for r in record["recent"] if epoch_price(state, node, shard, r[0]) > 0}


def _row(record: dict[str, Any], epoch: int) -> list[int]:
    """The `recent` row of `epoch` (appended when missing; rows stay in epoch order; a row of
    three, written before sessions were counted, gets its fourth: 0)."""
    for index, row in enumerate(record["recent"]):
        if row[0] == epoch:
            if len(row) < 4:
                row = record["recent"][index] = [*row, 0]
            return row
    row = [epoch, 0, 0, 0]
    record["recent"] = [*record["recent"], row]
    return row


def _trim(state: State, record: dict[str, Any], epoch: int) -> dict[str, Any]:
    oldest = _keep_from(state, epoch)
    return {**record, "recent": [list(r) for r in record["recent"] if r[0] >= oldest]}


# --- hooks of other rules -------------------------------------------------------------------------


def record_commits(
    state: State, node: str, per_shard: dict[int, int], sessions: dict[int, int] | None = None
) -> None:
    """`commit` stored `per_shard[s]` new records of `node` on shard s, `sessions[s]` of them a
    session's first block (commitments.py)."""
    epoch = rules.epoch_of(state, state.block_height)
    for shard in sorted(per_shard):
        count = per_shard[shard]
        if count <= 0:
            continue
        record = _trim(state, _load(state, node, shard), epoch)
        row = _row(record, epoch)
        row[1] = min(MAX_COUNT, row[1] + count)
        begun = (sessions or {}).get(shard, 0)
        if begun:
            row[3] = min(MAX_COUNT, row[3] + begun)
            slack = begun * (unit_price(state, node, shard, epoch) - 1)
            record["slack"] = min(MAX_COUNT, record["slack"] + slack)
        record["committed"] = min(MAX_COUNT, record["committed"] + count * BLOCK_POSITIONS)
        state.put(schema.COVERAGE, schema.coverage_key(node, shard), record)


def record_bought(state: State, node: str, shard: int, credits: int) -> None:
    """`credit_lock` locked `credits` new credits of `node` on `shard`: they bought credits ×
    price positions of it (rule 2)."""
    if credits <= 0:
        return
    epoch = rules.epoch_of(state, state.block_height)
    record = _load(state, node, shard)
    positions = credits * unit_price(state, node, shard, epoch)
    record["bought"] = min(MAX_COUNT, record["bought"] + positions)
    state.put(schema.COVERAGE, schema.coverage_key(node, shard), record)


def _capacity(row: list[int], price: int) -> int:
    """What a `recent` row can still pay for at `price` positions per credit: its records'
    positions, plus price − 1 per session begun (each session's last credit is paid ahead and
    may be used in part: ceil(s / price) · price ≤ s + price − 1), less what was consumed."""
    sessions = row[3] if len(row) > 3 else 0
    return row[1] * BLOCK_POSITIONS + sessions * (price - 1) - row[2]


def creditable(
    state: State, record: dict[str, Any], epoch: int, charged: set[int], price: int = 1
) -> int:
    """Committed positions of the creditable epochs not yet consumed by redemptions (at
    `price` positions per credit: see `_capacity`), of the `charged` epochs only (rule 4)."""
    oldest = epoch - state.genesis.commit_grace_epochs
    return sum(
        max(0, _capacity(r, price))
        for r in record["recent"]
        if oldest <= r[0] <= epoch and r[0] in charged
    )


def take_positions(state: State, node: str, shard: int, count: int, price: int = 1) -> None:
    """A redemption of `count` credits on `shard` at `price` positions per credit (the node's
    registered price, prices.py `redemption_price`) needs count × price committed positions of
    the node there not yet consumed (`_capacity`: an honest node that commits what it serves
    always has them); consumes them. Refuses the tx otherwise: `UNCOMMITTED_REDEMPTION` when
    nothing is left at all (a node serving credit-paid work without committing it is never
    paid for it, and what it commits is what spot checks select from),
    `REDEMPTION_OVER_PRICE` when what is left pays for fewer credits at the registered price."""
    epoch = rules.epoch_of(state, state.block_height)
    record = _trim(state, _load(state, node, shard), epoch)
    charged = _charged_epochs(state, node, shard, record)
    available = creditable(state, record, epoch, charged, price)
    needed = count * price
    if available < needed:
        if available == 0 or price == 1:
            rules.reject(
                Code.UNCOMMITTED_REDEMPTION,
                f"{count} credits need {needed} committed served positions on shard {shard}; "
                f"{available} are left (commit first)",
            )
        rules.reject(
            Code.REDEMPTION_OVER_PRICE,
            f"{count} credits at the registered price of {price} positions each need {needed} "
            f"committed served positions on shard {shard}; {available} are left: at most "
            f"{available // price} credits",
        )
    _consume(state, node, shard, record, needed, epoch, charged, price)


def _consume(
    state: State,
    node: str,
    shard: int,
    record: dict[str, Any],
    positions: int,
    epoch: int,
    charged: set[int],
    price: int = 1,
) -> None:
    """Mark `positions` committed positions of the creditable, charged epochs used, oldest
    first."""
    oldest = epoch - state.genesis.commit_grace_epochs
    for index, row in enumerate(record["recent"]):
        if positions == 0:
            break
        if not oldest <= row[0] <= epoch or row[0] not in charged:
            continue
        used = min(positions, max(0, _capacity(row, price)))
        record["recent"][index] = [row[0], row[1], row[2] + used, *row[3:]]
        positions -= used
    state.put(schema.COVERAGE, schema.coverage_key(node, shard), record)


# --- epoch close ---------------------------------------------------------------------------------


def _at(marks: list[list[int]], epoch: int, column: int) -> int:
    """A count at the close of `epoch`: the latest mark at or before it (0 before the first:
    the entry did not exist yet)."""
    return max((m[column] for m in marks if m[0] <= epoch and len(m) > column), default=0)


def _settle_epoch(state: State, node: str, shard: int, record: dict[str, Any], epoch: int) -> None:
    """At `epoch`'s close its price is final: its records' positions join `charged` (price
    above 0) or `free` (0 or unpriced), rule 4."""
    row = next((r for r in record["recent"] if r[0] == epoch), None)
    if row is None or row[1] == 0:
        return
    column = "charged" if epoch_price(state, node, shard, epoch) > 0 else "free"
    record[column] = min(MAX_COUNT, record[column] + row[1] * BLOCK_POSITIONS)


def judged_nodes(state: State) -> tuple[list[str], list[str]]:
    """The nodes whose cover entries an epoch close reads, in key order: the members of the
    staked pools (`pool/<model>/<key>`) and the nodes that left them since the last close
    (`covdue/<key>`, `left_pool`); and the latter alone. Only a member may commit
    (commitments.py NOT_STAKED), so every record committed in the epoch belongs to one of them;
    a free registration is neither."""
    staked = {entry.rsplit("/", 1)[1] for entry in state.keys(schema.POOL)}
    left = state.keys(schema.COVERAGE_DUE)
    return sorted(staked.union(left)), left


def left_pool(state: State, node: str) -> None:
    """`node` left the staked pools (its agreed stake fell below min_stake.compute, or it
    left): the next close still judges its entries once, settling what it committed while
    staked (registry.py `update_pool`)."""
    state.put(schema.COVERAGE_DUE, node, 1)


def forget(state: State, node: str) -> None:
    """`node`'s registration was deleted (registry.py `delete_node`): its cover entries go now,
    since no close reads an entry of a node outside the pools."""
    for key, _ in state.items(schema.COVERAGE, node + "/", node + "0"):
        state.delete(schema.COVERAGE, key)
    if state.get(schema.COVERAGE_DUE, node) is not None:
        state.delete(schema.COVERAGE_DUE, node)


def close(state: State, epoch: int) -> None:
    """EndBlock of epoch `epoch`'s last height: for the nodes `judged_nodes` names (the staked
    pools and those that left them in the epoch, never a free registration), settle the
    epoch's records as charged or free, mark what credits bought and what was covered,
    (un)flag uncovered nodes (rules 2 and 5, over the window of `window_epochs`); delete the
    entries of nodes that left or are gone."""
    grace = state.genesis.commit_grace_epochs
    window = window_epochs(state)
    start = epoch - grace - window  # the window's sales are those of epochs start+1 .. e-grace
    judged, left = judged_nodes(state)
    for node_key in judged:
        node = state.get(schema.NODE, node_key)
        gone = node is None or node["status"] == schema.LEFT  # gone for good: nothing to judge
        for key, record in state.items(schema.COVERAGE, node_key + "/", node_key + "0"):
            if gone:
                state.delete(schema.COVERAGE, key)
            else:
                _close_entry(state, key, record, epoch, start, grace)
    for node_key in left:
        state.delete(schema.COVERAGE_DUE, node_key)


def _close_entry(
    state: State, key: str, record: dict[str, Any], epoch: int, start: int, grace: int
) -> None:
    """One (node, shard) entry at `epoch`'s close (`close`)."""
    node_key, shard = key.split("/", 1)
    record = {**_empty(), **record}
    _settle_epoch(state, node_key, int(shard), record, epoch)
    covered = record["charged"] + record["slack"]
    mark = [epoch, record["bought"], covered, record["charged"]]
    marks = _marks_from(record["marks"], mark, start - grace)
    sold = _at(marks, epoch - grace, 1) - _at(marks, start, 1)
    committed = covered - _at(marks, start, 2)
    uncovered = committed * 1_000_000 < sold * COVER_MIN_PPM
    updated = _trim(state, {**record, "marks": marks}, epoch + 1)
    updated["uncommitted_since"] = (
        (record["uncommitted_since"] or epoch)
        if uncovered or unsold(marks, epoch, start, grace)
        else None
    )
    state.put(schema.COVERAGE, key, updated)


def _marks_from(marks: list[list[int]], mark: list[int], floor: int) -> list[list[int]]:
    """`marks` and the close's `mark`, back to epoch `floor` (start − grace: rule 5 reads what
    credits bought from then on). A node judged at every close has a mark at `floor` itself;
    one that missed closes while unstaked may not: the latest mark before `floor` is then kept,
    dated `floor`, so the window starts from the counts it had then (the missed closes read as
    no change), not from 0 (its whole history)."""
    every = [*marks, mark]
    kept = [m for m in every if m[0] >= floor]
    before = [m for m in every if m[0] < floor]
    if before and (not kept or kept[0][0] > floor):
        kept = [[floor, *before[-1][1:]], *kept]
    return kept


def unsold(marks: list[list[int]], epoch: int, start: int, grace: int) -> bool:
    """Rule 5: positions committed at a price in epochs start+1 .. e − grace while credits
    bought nothing of the node there in epochs start − grace + 1 .. e (a lock may land up to
    `grace` epochs before or after the positions it paid for are committed)."""
    charged = _at(marks, epoch - grace, 3) - _at(marks, start, 3)
    bought = _at(marks, epoch, 1) - _at(marks, start - grace, 1)
    return charged > 0 and bought == 0


def window_epochs(state: State) -> int:
    """Epochs of sales one close judges: WINDOW_FACTOR · (grace + 1) (module docstring, rule
    2)."""
    return WINDOW_FACTOR * (state.genesis.commit_grace_epochs + 1)


# --- readers (tx rules and queries) --------------------------------------------------------------


def blocks_in(records: Iterable[dict[str, Any]], epoch: int) -> int:
    """Records a node committed in `epoch` over all its shards (`records`: its cover entries)."""
    return sum(r[1] for record in records for r in record["recent"] if r[0] == epoch)


def node_entries(state: State, node: str) -> list[dict[str, Any]]:
    """The node's cover entries in the current tx's view (every shard)."""
    return [record for _, record in state.items(schema.COVERAGE, node + "/", node + "0")]


def flagged(records: Iterable[dict[str, Any]]) -> bool:
    """Whether any of a node's shards is flagged uncommitted."""
    return any(record["uncommitted_since"] is not None for record in records)


def shard_view(state: State, key: str, record: dict[str, Any], epoch: int) -> dict[str, Any]:
    node, shard = key.split("/", 1)[0], int(key.rsplit("/", 1)[1])
    record = {**_empty(), **record}
    price = state.committed(schema.PRICE, schema.price_key(node, shard))  # the committed view
    charged = {r[0] for r in record["recent"] if (prices.price_at(price, r[0]) or 0) > 0}
    return {
        "shard": shard,
        "committed_positions": record["committed"],
        "bought_positions": record.get("bought", 0),
        "slack_positions": record.get("slack", 0),
        "charged_positions": record.get("charged", 0),
        "free_positions": record.get("free", 0),
        "creditable_tokens": creditable(state, record, epoch, charged),
        "blocks": {str(r[0]): r[1] for r in record["recent"]},
        "uncommitted_since": record["uncommitted_since"],
    }
