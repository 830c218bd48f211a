"""Verifiers' track record: a verdict the committee does not confirm counts against its voters.

Every validator's verifier may vote for a verdict (`verdict_vote`) when its checks say a node
cheated. A vote is an accusation: when the verdict it supports is not confirmed (≥ 2/3 of the
power) by the end of the epoch AFTER the one of its first vote, it is *refused* and every
validator that voted for it gets one `refused` mark; a confirmed verdict gives its voters one
`confirmed` mark. Deterministic and height-driven:

- the first vote of a verdict in epoch e adds its id to `vdue/<e+1, 12 digits>` (a list);
- EndBlock of the last height of epoch d settles `vdue/<d>`: the verdict record gets
  `settled: "confirmed" | "refused"`, each voter's `vrep/<validator address>` =
  {confirmed, refused, last_epoch} is counted, then `vdue/<d>` is deleted.

Query `/verifiers` → {"verifiers": {address: {confirmed, refused, last_epoch}}}. What a refused
mark costs beyond the record (reputation-weighted votes, slashing a colluding verifier) is for
the settlement rules to decide; the record is the chain's memory of who accused wrongly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from abci_app import retention

if TYPE_CHECKING:
    from abci_app.state import State

DUE = "vdue"
REP = "vrep"


def _due_key(epoch: int) -> str:
    return f"{epoch:012d}"


def first_vote(state: State, verdict_id: str) -> None:
    """Called by the verdict_vote handler when a verdict gets its first vote."""
    deadline = retention.epoch_of(state, state.block_height) + 1
    pending = state.get(DUE, _due_key(deadline)) or []
    if verdict_id not in pending:
        state.put(DUE, _due_key(deadline), sorted([*pending, verdict_id]))


def settle_epoch(state: State, epoch: int) -> None:
    """At the last block of `epoch`: settle the verdicts whose deadline it is."""
    pending = state.get(DUE, _due_key(epoch))
    if pending is None:
        return
    for verdict_id in pending:
        record = state.get("verdict", verdict_id)
        if record is None or "settled" in record:
            continue
        outcome = "confirmed" if record["confirmed"] else "refused"
        state.put("verdict", verdict_id, {**record, "settled": outcome})
        for address in sorted(record["votes"]):
            mark = state.get(REP, address) or {"confirmed": 0, "refused": 0, "last_epoch": 0}
            state.put(REP, address, {**mark, outcome: mark[outcome] + 1, "last_epoch": epoch})
        if outcome == "refused":
            state.emit("planet.accusation", id=verdict_id, outcome=outcome)
    state.delete(DUE, _due_key(epoch))


def verifiers_view(state: State) -> dict[str, Any]:
    return {"verifiers": dict(state.committed_items(REP))}
