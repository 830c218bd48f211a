"""Numerics versions on chain: a node changes its version, verifiers announce theirs, and a
spot-check verdict on a node is counted among the verifiers that run the node's version.

    set_numerics{numerics}       signer: a registered compute node that has not left
    verifier_numerics{numerics}  signer: a validator (its consensus key), for its verifier

A change asked for in epoch c **takes effect when epoch c + 1 opens** (`numdue/<c + 1>`,
applied by `apply_due` at the boundary), so one epoch's work is judged under one version. A
record then holds `numerics` (in effect), `numerics_epoch` (its first epoch),
`numerics_previous` (the one before; absent: unannounced) and, until the boundary,
`numerics_next` {numerics, epoch}: `in_effect(record, e)` is the version of epoch e. The node
record is `node/<key>` (registry.py), a verifier's `vnum/<validator address>`.

Refused by name (nothing written): a version genesis `numerics` does not list
(NUMERICS_NOT_ACCEPTED 105); the version already in effect with nothing pending, or the one
already pending (NUMERICS_UNCHANGED 107: a restarted verifier re-announcing is told so); a
change while one is pending, or one that would take effect less than NUMERICS_COOLDOWN_EPOCHS
after the last one did (NUMERICS_TOO_SOON 108: no flapping to dodge the checks of a version,
nor to move between verifier groups). A node's first change (from its registration's version)
and a verifier's first announcement have no cooldown. Signer checks: UNKNOWN_NODE, WRONG_ROLE,
INVALID_LIFECYCLE; NOT_VALIDATOR.

**Version quorum.** A verdict is confirmed at ≥ 2/3 of all validator power (verdicts.py,
unchanged) or, failing that, by the quorum of one version V the accused node computed with in
the epochs a spot check can still judge (`judged_versions`: epochs c − CHECK_LOOKBACK_EPOCHS …
c at the verdict's first vote c, pinned in the verdict record as `numerics`; the cooldown
outlasts that window, so at most two versions). V's group G is the validators whose verifier
announces V in the current epoch, of power P (of all power T). V is **checked** iff

    |G| ≥ MIN_GROUP_VERIFIERS (2)   and   3·P ≥ T                      (the floor)

and a verdict reaches V's quorum when the voters in G number ≥ MIN_GROUP_VERIFIERS and their
power p satisfies 3·p ≥ 2·P and 3·p ≥ T. Why this floor: CometBFT is safe while faulty power
is < T/3, so any set of voters with ≥ T/3 contains an honest verifier, whatever the faulty
ones announce (announcing a version they do not run only adds them to G, raising the 2/3 of P
the honest members must cover, and never lowers the T/3); two verifiers at least, so no single
verifier's bug or hardware drift convicts even where it holds a third of the power. A version
below the floor is **unchecked**: only the 2/3-of-all rule can convict its nodes, which its
minority of verifiers cannot reach; `/numerics` lists it so and `/node` says
`numerics_checked: false` for its nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from abci_app import rules, schema
from abci_app.codes import Code
from abci_app.state import State
from protocol.committee.envelope import SignedTx
from protocol.committee.registry import SetNumerics
from protocol.committee.verification import VerifierNumerics
from protocol.numerics import NUMERICS_COOLDOWN_EPOCHS
from protocol.spotcheck import CHECK_LOOKBACK_EPOCHS

# NUMERICS_COOLDOWN_EPOCHS (protocol/numerics.py), epochs between two changes of one record
# taking effect: longer than the window of epochs a spot check still judges
# (CHECK_LOOKBACK_EPOCHS + 1), so a verdict's window holds at most two versions and
# `numerics_previous` is enough to know each epoch's
MIN_GROUP_VERIFIERS = 2  # a version group needs two verifiers at least, and a conviction two votes

Reader = Callable[[str, str], Any]


def in_effect(record: dict[str, Any] | None, epoch: int) -> int | None:
    """The version a node record or a `vnum/` record holds for `epoch` (None: unannounced)."""
    if record is None:
        return None
    pending = record.get("numerics_next")
    if pending is not None and epoch >= pending["epoch"]:
        return int(pending["numerics"])
    since = record.get("numerics_epoch")
    if since is not None and epoch < since:
        return record.get("numerics_previous")
    return record.get("numerics")


# --- txs ----------------------------------------------------------------------------------------


def set_numerics(state: State, tx: SignedTx) -> None:
    body: SetNumerics = tx.body
    node = rules.compute_node(state, tx.signer)
    effective = _schedule(state, node, body.numerics, f"node {tx.signer}", "nodes", tx.signer)
    state.put(schema.NODE, tx.signer, {**node, "numerics_next": _next(body.numerics, effective)})
    state.emit("planet.numerics", node=tx.signer, numerics=body.numerics, epoch=effective)


def verifier_numerics(state: State, tx: SignedTx) -> None:
    body: VerifierNumerics = tx.body
    address = rules.validator(state, tx.signer)["address"]
    record = state.get(schema.VERIFIER_NUMERICS, address) or {}
    effective = _schedule(state, record, body.numerics, f"verifier {address}", "verifiers", address)
    state.put(
        schema.VERIFIER_NUMERICS,
        address,
        {**record, "numerics_next": _next(body.numerics, effective)},
    )
    state.emit("planet.numerics", validator=address, numerics=body.numerics, epoch=effective)


def _next(version: int, epoch: int) -> dict[str, int]:
    return {"epoch": epoch, "numerics": version}


def _schedule(
    state: State, record: dict[str, Any], version: int, who: str, kind: str, key: str
) -> int:
    """Check a change of `record` to `version` (refusing by name) and index it for the next
    boundary; returns the epoch it takes effect."""
    accepted = state.genesis.numerics
    if version not in accepted:
        rules.reject(
            Code.NUMERICS_NOT_ACCEPTED,
            f"numerics {version} is not accepted by this chain (genesis numerics {list(accepted)})",
        )
    current = rules.epoch_of(state, state.block_height)
    pending = record.get("numerics_next")
    if pending is not None and pending["numerics"] == version:
        rules.reject(
            Code.NUMERICS_UNCHANGED,
            f"{who} already changes to numerics {version} at epoch {pending['epoch']}",
        )
    if pending is not None:
        rules.reject(
            Code.NUMERICS_TOO_SOON,
            f"{who} already changes to numerics {pending['numerics']} at epoch "
            f"{pending['epoch']}; one change at a time",
        )
    if record.get("numerics") == version:
        rules.reject(Code.NUMERICS_UNCHANGED, f"{who} already has numerics {version}")
    since = record.get("numerics_epoch")
    if since is not None and current + 1 < since + NUMERICS_COOLDOWN_EPOCHS:
        rules.reject(
            Code.NUMERICS_TOO_SOON,
            f"{who} changed numerics at epoch {since}; the next change takes effect no earlier "
            f"than epoch {since + NUMERICS_COOLDOWN_EPOCHS} (send it from epoch "
            f"{since + NUMERICS_COOLDOWN_EPOCHS - 1})",
        )
    due = schema.epoch_key(current + 1)
    entry = state.get(schema.NUMERICS_DUE, due) or {"nodes": [], "verifiers": []}
    state.put(schema.NUMERICS_DUE, due, {**entry, kind: sorted({*entry[kind], key})})
    return current + 1


# --- the epoch boundary -------------------------------------------------------------------------


def apply_due(state: State, epoch: int) -> None:
    """EndBlock of the last height before `epoch`: the changes due then take effect."""
    due = schema.epoch_key(epoch)
    entry = state.get(schema.NUMERICS_DUE, due)
    if entry is None:
        return
    for ns, keys in ((schema.NODE, entry["nodes"]), (schema.VERIFIER_NUMERICS, entry["verifiers"])):
        for key in keys:
            record = state.get(ns, key)
            if record is None or record.get("numerics_next", {}).get("epoch") != epoch:
                continue  # expired since, or nothing pending for this boundary
            state.put(ns, key, _applied(record, epoch))
    state.delete(schema.NUMERICS_DUE, due)


def _applied(record: dict[str, Any], epoch: int) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k not in ("numerics_next", "numerics_previous")}
    if record.get("numerics") is not None:
        out["numerics_previous"] = record["numerics"]
    out["numerics"] = record["numerics_next"]["numerics"]
    out["numerics_epoch"] = epoch
    return out


# --- version groups and their quorum ------------------------------------------------------------


def groups(state: State, epoch: int, read: Reader) -> dict[int, dict[str, int]]:
    """Version → {validator address: power} of the validators whose verifier announces it for
    `epoch`; a validator that announced nothing is in no group."""
    out: dict[int, dict[str, int]] = {}
    for validator in state.validators:
        version = in_effect(read(schema.VERIFIER_NUMERICS, validator["address"]), epoch)
        if version is not None:
            out.setdefault(version, {})[validator["address"]] = validator["power"]
    return out


def checked(members: dict[str, int], total: int) -> bool:
    """Whether a version group is at the floor: ≥ MIN_GROUP_VERIFIERS verifiers holding ≥ 1/3
    of all power (below it, its quorum could not include an honest verifier for sure)."""
    return len(members) >= MIN_GROUP_VERIFIERS and 3 * sum(members.values()) >= total


def threshold(members: dict[str, int], total: int) -> int:
    """The least voting power of a group's verifiers that convicts: max(⌈2P/3⌉, ⌈T/3⌉)."""
    power = sum(members.values())
    return max(-(-2 * power // 3), -(-total // 3))


def reaches_quorum(members: dict[str, int], voters: Iterable[str], total: int) -> bool:
    """Whether `voters` (validator addresses) reach the quorum of the version group `members`."""
    if not checked(members, total):
        return False
    inside = [a for a in voters if a in members]
    return len(inside) >= MIN_GROUP_VERIFIERS and sum(members[a] for a in inside) >= threshold(
        members, total
    )


def judged_versions(state: State, account: str, epoch: int) -> list[int]:
    """The versions the node bound to EVM `account` computed with in the epochs a spot check
    voted in `epoch` may judge (CHECK_LOOKBACK_EPOCHS back), ascending; [] for an unknown or
    unannounced node."""
    key = state.get(schema.EVM_BINDING, account.lower())
    record = state.get(schema.NODE, key) if key is not None else None
    if record is None:
        return []
    first = max(1, epoch - CHECK_LOOKBACK_EPOCHS)
    versions = {in_effect(record, e) for e in range(first, epoch + 1)}
    return sorted(v for v in versions if v is not None)


def version_quorum(
    state: State, versions: list[int], votes: Iterable[str], epoch: int
) -> int | None:
    """The first of `versions` whose group's quorum the `votes` reach in `epoch`, or None."""
    voters = list(votes)
    by_version = groups(state, epoch, state.get)
    for version in versions:
        if reaches_quorum(by_version.get(version, {}), voters, state.total_power):
            return version
    return None


# --- queries ------------------------------------------------------------------------------------


def node_checked(state: State, node: dict[str, Any]) -> bool | None:
    """`/node`'s `numerics_checked`: whether the node's version now is at the floor (None for
    an unannounced node: every verifier judges it)."""
    epoch = rules.epoch_of(state, state.height + 1)
    version = in_effect(node, epoch)
    if version is None:
        return None
    members = groups(state, epoch, state.committed).get(version, {})
    return checked(members, state.total_power)


def view(state: State, params: dict[str, Any]) -> Any:
    """`/numerics`: per version (genesis-listed or announced), the verifiers announcing it in
    the current epoch, their power, whether it is checked and the power a conviction needs."""
    epoch = rules.epoch_of(state, state.height + 1)
    total = state.total_power
    by_version = groups(state, epoch, state.committed)
    announced = {a for members in by_version.values() for a in members}
    versions = []
    for version in sorted({*state.genesis.numerics, *by_version}):
        members = by_version.get(version, {})
        ok = checked(members, total)
        versions.append(
            {
                "numerics": version,
                "verifiers": sorted(members),
                "power": sum(members.values()),
                "checked": ok,
                "threshold": threshold(members, total) if ok else None,
            }
        )
    pending = {
        address: record["numerics_next"]
        for address, record in state.committed_items(schema.VERIFIER_NUMERICS)
        if "numerics_next" in record
    }
    return {
        "epoch": epoch,
        "total_power": total,
        "floor": {"verifiers": MIN_GROUP_VERIFIERS, "power": -(-total // 3)},
        "versions": versions,
        "unannounced": sorted(
            v["address"] for v in state.validators if v["address"] not in announced
        ),
        "pending": pending,
    }
