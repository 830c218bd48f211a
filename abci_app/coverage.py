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
recent [[epoch, records, consumed positions]] (epochs still redeemable or selectable),
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
    """The `recent` row of `epoch` (appended when missing; rows stay in epoch order)."""
    for row in record["recent"]:
        if row[0] == epoch:
            return row
    row = [epoch, 0, 0]
    record["recent"] = [*record["recent"], row]
    return row


def _trim(state: State, record: dict[str, Any], epoch: int) -> dict[str, Any]:
    oldest = _keep_from(state, epoch)
    return {**record, "recent": [list(r) for r in record["recent"] if r[0] >= oldest]}


# --- hooks of other rules -------------------------------------------------------------------------


def record_commits(state: State, node: str, per_shard: dict[int, int]) -> None:
    """`commit` stored `per_shard[s]` new records of `node` on shard s (commitments.py)."""
    epoch = rules.epoch_of(state, state.block_height)
    for shard in sorted(per_shard):
        count = per_shard[shard]
        if count <= 0:
            continue
        record = _trim(state, _load(state, node, shard), epoch)
        row = _row(record, epoch)
        row[1] = min(MAX_COUNT, row[1] + count)
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


def creditable(state: State, record: dict[str, Any], epoch: int) -> int:
    """Committed positions of the creditable epochs not yet consumed by redemptions."""
    oldest = epoch - state.genesis.commit_grace_epochs
    return sum(r[1] * BLOCK_POSITIONS - r[2] for r in record["recent"] if oldest <= r[0] <= epoch)


def take_positions(state: State, node: str, shard: int, count: int) -> None:
    """A redemption of `count` credits on `shard` needs `count` committed positions of the node
    there not yet consumed (one per credit: a credit buys at least one position, so an honest
    node that commits what it serves always has them); consumes them. Refuses the tx
    (`UNCOMMITTED_REDEMPTION`) otherwise: a node serving credit-paid work without committing it
    is never paid for it, and what it commits is what spot checks select from."""
    epoch = rules.epoch_of(state, state.block_height)
    record = _trim(state, _load(state, node, shard), epoch)
    available = creditable(state, record, epoch)
    if available < count:
        rules.reject(
            Code.UNCOMMITTED_REDEMPTION,
            f"{count} credits need as many committed served positions on shard {shard}; "
            f"{available} are left (commit first)",
        )
    _consume(state, node, shard, record, count, epoch)


def _consume(
    state: State, node: str, shard: int, record: dict[str, Any], positions: int, epoch: int
) -> None:
    """Mark `positions` committed positions of the creditable epochs used, oldest first."""
    oldest = epoch - state.genesis.commit_grace_epochs
    for row in record["recent"]:
        if positions == 0:
            break
        if not oldest <= row[0] <= epoch:
            continue
        used = min(positions, row[1] * BLOCK_POSITIONS - row[2])
        row[2] += used
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
