"""Measured decode speeds per node: what the verifiers' vote extensions report, aggregated.

Each validator's vote extension at the close of epoch e may carry `speeds`: {node key: tokens/s}
for nodes its own report scores (abci_app/extensions.py refuses any other node, a value outside
[1, 100 000], a second vote of one validator, and a vote not signed by a validator). When the
next block applies the extended commit (machine.py), `apply_speeds` updates, per node with at
least one counted report:

    speed/<node key> = {"speed": lower median, "epoch": e,
                        "reports": {validator address: [epoch reported, tokens/s]}}

- `reports` keeps each verifier's latest report only (a new one replaces its older one), drops
  a report older than `retention_epochs` epochs (genesis, default 10) and one of a validator
  no longer in the set or benched for a false accusation (`allowed`);
- `speed` is `protocol.speeds.lower_median` of the kept reports: one per distinct verifier, so
  one lying verifier among three or more never moves it outside the others' range;
- a node that is not a registered compute node is skipped (its speed is not kept).

The record goes with the node's registration (registry.NODE_NAMESPACES). `measured_speed`
answers it for queries (`/nodes`, `/node`: the `speed` field) from committed state, or None
when no verifier reported the node within `retention_epochs` of the current epoch. Integers
only, no clock: the epoch is the chain's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol

from abci_app import schema
from abci_app.state import State
from protocol.speeds import lower_median


class SpeedReport(Protocol):
    """What `apply_speeds` reads of a validator's report (extensions.Report)."""

    @property
    def speeds(self) -> dict[str, int]: ...


def apply_speeds(
    state: State, epoch: int, reports: Mapping[str, SpeedReport], allowed: Collection[str]
) -> int:
    """Record the counted `reports` ({validator address: report}) of `epoch`'s close; `allowed`:
    the validator addresses whose kept reports still count. Returns how many nodes' speeds were
    updated."""
    fresh: dict[str, dict[str, int]] = {}
    for address in sorted(reports):
        for node, speed in reports[address].speeds.items():
            fresh.setdefault(node, {})[address] = speed
    window = state.genesis.retention_epochs
    updated = 0
    for node in sorted(fresh):
        registered = state.get(schema.NODE, node)
        if registered is None or registered["role"] != "compute":
            continue
        record = state.get(schema.SPEED, node)
        if record is not None and record["epoch"] >= epoch:
            continue  # this close was applied already
        kept: dict[str, list[int]] = {}
        for address, (when, speed) in (record or {"reports": {}})["reports"].items():
            if address in allowed and epoch - when < window:
                kept[address] = [when, speed]
        for address, speed in fresh[node].items():
            kept[address] = [epoch, speed]
        state.put(
            schema.SPEED,
            node,
            {
                "speed": lower_median(speed for _, speed in kept.values()),
                "epoch": epoch,
                "reports": dict(sorted(kept.items())),
            },
        )
        updated += 1
    return updated


def measured_speed(state: State, key: str) -> int | None:
    """The node's agreed speed (tokens/s) in committed state, or None when none was reported
    within `retention_epochs` of the current epoch."""
    record: dict[str, Any] | None = state.committed(schema.SPEED, key)
    if record is None:
        return None
    current = state.committed(schema.META, "current_epoch") or 0
    if current - record["epoch"] > state.genesis.retention_epochs:
        return None
    return int(record["speed"])
