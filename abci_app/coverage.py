"""Commitment coverage: no commitment, no pay, no routing.

A compute node commits one record per block of 32 positions it served (commitments.py). The
gateways report, per node and shard, the tokens of the questions they served through it
(settlement's `work_report`: a count for this module only, never a basis for pay). This module
holds the two counts side by side and enforces three rules:

1. **No commitment, no pay.** A compute node is paid through the credits it redeems, and a
   `redeem` of n credits on a shard consumes n committed positions of the same node and
   shard, committed in the block's epoch or the `commit_grace_epochs` before it, oldest epoch
   first (`take_positions`; `UNCOMMITTED_REDEMPTION` when fewer are left; each record stands
   for 32 positions, a session's last, partial block too: an upper bound). Credit-paid work is
   committed, and so selectable for spot checks, or it is not paid.
2. **No commitment, no routing.** When an epoch e closes, every (node, shard) whose committed
   positions are below `COVER_MIN_PPM` of the tokens gateways reported for it up to the close
   of epoch e − `commit_grace_epochs` is flagged `uncommitted` (`uncommitted_since` = the
   first such epoch); `/node` and `/nodes` then answer `uncommitted: true, routable: false`,
   so gateways and next hops stop routing to it. The flag clears at the first close where the
   commitments cover the reports again. Honest nodes commit ≥ (prompt + completion − 1) of
   each question's prompt + completion tokens within seconds (their spool, then their agent),
   so half is a wide margin; the grace window absorbs the lag of sessions sealed late.
3. **Checks scale with the work, not with what the node chooses to commit.** The number of
   records a node committed in an epoch (`blocks_in`) sets its spot-check floor
   (protocol/spotcheck.py `node_rate_ppm`): a node that commits only a little is checked on a
   larger share of it, and one that commits less than half of what it served is flagged.

State: `cover/<node>/<shard:05d>` = {committed (positions, cumulative), reported (tokens,
cumulative), marks [[epoch, reported at that epoch's close]] (the last grace + 1 closes),
recent [[epoch, records, consumed positions, sessions begun]] (epochs still redeemable or
selectable),
uncommitted_since (epoch or null)}. Entries of nodes that are no longer registered, or have
LEFT, are deleted at the next close. Queries: `/coverage?node=` (per shard, creditable
tokens, blocks per recent epoch, the flag) and `/coverage` (the flagged nodes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.settlement import WorkReport
from protocol.fingerprint import BLOCK_POSITIONS

COVER_MIN_PPM = 500_000  # committed positions must reach half of the reported tokens
REPORT_LAG = 2  # epochs after e during which e's spot checks are judged (spot_reports.py)
MAX_COUNT = (1 << 63) - 1


def _empty() -> dict[str, Any]:
    return {"committed": 0, "reported": 0, "marks": [], "recent": [], "uncommitted_since": None}


def _keep_from(state: State, epoch: int) -> int:
    """The oldest epoch whose `recent` row still matters at `epoch`."""
    return epoch - max(state.genesis.commit_grace_epochs, REPORT_LAG) - 1


def _load(state: State, node: str, shard: int) -> dict[str, Any]:
    record = state.get(schema.COVERAGE, schema.coverage_key(node, shard))
    return dict(record) if record is not None else _empty()


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
        record["committed"] = min(MAX_COUNT, record["committed"] + count * BLOCK_POSITIONS)
        state.put(schema.COVERAGE, schema.coverage_key(node, shard), record)


def record_report(state: State, body: WorkReport) -> None:
    """A gateway's `work_report` was accepted: count its tokens per registered compute node."""
    for item in body.work:
        node = state.get(schema.NODE, item.node)
        if node is None or node["role"] != "compute":
            continue
        record = _load(state, item.node, item.shard)
        record["reported"] = min(MAX_COUNT, record["reported"] + item.tokens)
        state.put(schema.COVERAGE, schema.coverage_key(item.node, item.shard), record)


def _capacity(row: list[int], price: int) -> int:
    """What a `recent` row can still pay for at `price` positions per credit: its records'
    positions, plus price − 1 per session begun (each session's last credit is paid ahead and
    may be used in part: ceil(s / price) · price ≤ s + price − 1), less what was consumed."""
    sessions = row[3] if len(row) > 3 else 0
    return row[1] * BLOCK_POSITIONS + sessions * (price - 1) - row[2]


def creditable(state: State, record: dict[str, Any], epoch: int, price: int = 1) -> int:
    """Committed positions of the creditable epochs not yet consumed by redemptions (at
    `price` positions per credit: see `_capacity`)."""
    oldest = epoch - state.genesis.commit_grace_epochs
    return sum(max(0, _capacity(r, price)) for r in record["recent"] if oldest <= r[0] <= epoch)


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
    available = creditable(state, record, epoch, price)
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
    _consume(state, node, shard, record, needed, epoch, price)


def _consume(
    state: State,
    node: str,
    shard: int,
    record: dict[str, Any],
    positions: int,
    epoch: int,
    price: int = 1,
) -> None:
    """Mark `positions` committed positions of the creditable epochs used, oldest first."""
    oldest = epoch - state.genesis.commit_grace_epochs
    for index, row in enumerate(record["recent"]):
        if positions == 0:
            break
        if not oldest <= row[0] <= epoch:
            continue
        used = min(positions, max(0, _capacity(row, price)))
        record["recent"][index] = [row[0], row[1], row[2] + used, *row[3:]]
        positions -= used
    state.put(schema.COVERAGE, schema.coverage_key(node, shard), record)


# --- epoch close ---------------------------------------------------------------------------------


def close(state: State, epoch: int) -> None:
    """EndBlock of epoch `epoch`'s last height: mark the reports, (un)flag uncovered nodes."""
    grace = state.genesis.commit_grace_epochs
    for key, record in state.items(schema.COVERAGE):
        node = state.get(schema.NODE, key.split("/", 1)[0])
        if node is None or node["status"] == schema.LEFT:  # gone for good: nothing to judge
            state.delete(schema.COVERAGE, key)
            continue
        marks = [*record["marks"], [epoch, record["reported"]]][-(grace + 1) :]
        old = max((m[1] for m in marks if m[0] <= epoch - grace), default=0)
        uncovered = record["committed"] * 1_000_000 < old * COVER_MIN_PPM
        since = record["uncommitted_since"]
        updated = _trim(state, {**record, "marks": marks}, epoch + 1)
        updated["uncommitted_since"] = (since or epoch) if uncovered else None
        state.put(schema.COVERAGE, key, updated)


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
    return {
        "shard": int(key.rsplit("/", 1)[1]),
        "committed_positions": record["committed"],
        "reported_tokens": record["reported"],
        "creditable_tokens": creditable(state, record, epoch),
        "blocks": {str(r[0]): r[1] for r in record["recent"]},
        "uncommitted_since": record["uncommitted_since"],
    }
