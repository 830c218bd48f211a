"""`StakeWatcher`: one validator's bridge from the Staking contract to `attest_stake` txs.

Each validator runs its own watcher, signing with its own consensus key; a node's stake is
`agreed` on the committee chain only when validators with ≥ 2/3 of the power attest the same
amount, so no single party decides routability.

One `step()`:
1. read the Staking events (Staked, UnstakeRequested, Withdrawn, Slashed) of the blocks not
   seen yet → the EVM addresses whose stake changed;
2. list the registered nodes (not LEFT) on the committee chain;
3. for every node that is new to this watcher, whose address's stake changed (an event), whose
   registered address or role is not the one its stake was last read for, or all of them on
   a periodic resync: read its effective stake and attest it when it differs from what this
   watcher attested last.

Every change of a stake emits one of the four events (Staking.sol writes `_stakes` only in
`stake`, `requestUnstake`, `withdraw` and `slash`), so step 1 finds each change in the first
pass after its block, and a registration's changes are seen in the committee's `/nodes`: the
resync only heals a log read that missed an event, and runs every `RESYNC_S` (10 minutes), not
every pass. The pass's EVM block is read once (`latest_block`, the runner's `PassHead`) and used
by every step of it.

Effective stake (`effective_stake`): `stakeOf` while the stake is Active and its role is the
node's registered role; 0 while unbonding, after withdrawal, or for another role — a node that
asked to leave its stake is no longer backed by it. Slashing lowers `stakeOf`, so the lower
amount is attested.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from node.chain.committee_rpc import TxRejectedError
from protocol.committee.registry import AttestStake
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

ROLE_NUMBERS = {"compute": 1, "verifier": 2, "relay": 3}  # the Staking contract's Role
STATUS_ACTIVE = 1
RESYNC_S = 600.0  # seconds between two reads of every node's stake (the events' safety net)


@dataclass(frozen=True)
class StakeInfo:
    """What the Staking contract says about one address."""

    amount: int  # stakeOf, wei
    role: int  # roleOf: 0 None, 1 Compute, 2 Verifier, 3 Relay
    status: int  # statusOf: 0 None, 1 Active, 2 Unbonding


def effective_stake(info: StakeInfo, registered_role: str) -> int:
    """The wei a node's registration is backed by (see the module docstring)."""
    if info.status != STATUS_ACTIVE or info.role != ROLE_NUMBERS.get(registered_role):
        return 0
    return info.amount


class StakeSource(Protocol):
    """The EVM side (`node.watcher.evm.StakingReader`, or a fake in unit tests)."""

    def latest_block(self) -> int: ...
    def changed_addresses(self, from_block: int, to_block: int) -> set[str]: ...
    def stake_info(self, address: str) -> StakeInfo: ...


class Attester(Protocol):
    """The committee side (`CommitteeLink`)."""

    async def nodes(self, **filters: Any) -> list[dict[str, Any]]: ...
    async def send(self, body: Any, *, timeout_s: float = ...) -> tuple[int, str]: ...


@dataclass
class StakeWatcher:
    evm: StakeSource
    committee: Attester
    start_block: int  # first EVM block to read events from (the deployment's block)
    resync_s: float = RESYNC_S  # re-read every node's stake this often (heals missed events)
    clock: Callable[[], float] = time.monotonic
    attested: dict[str, int] = field(default_factory=dict)  # node key → amount last attested
    read_as: dict[str, tuple[str, str]] = field(default_factory=dict)  # key → (address, role)
    # its stake was last read for: a registration that changes either is read again at once
    next_block: int = -1
    _last_resync: float = field(default=float("-inf"))

    def __post_init__(self) -> None:
        if self.next_block < 0:
            self.next_block = self.start_block

    async def step(self) -> list[tuple[str, int]]:
        """One pass; returns the (node key, amount) attestations sent."""
        latest = self.evm.latest_block()
        changed: set[str] = set()
        if latest >= self.next_block:
            changed = {a.lower() for a in self.evm.changed_addresses(self.next_block, latest)}
        nodes = await self.committee.nodes()
        now = self.clock()
        resync = now - self._last_resync >= self.resync_s
        sent = []
        for key, address, role in due_nodes(nodes, changed, self.attested, resync, self.read_as):
            amount = effective_stake(self.evm.stake_info(address), role)
            self.read_as[key] = (address.lower(), role)
            if self.attested.get(key) == amount:
                continue
            # sent and waited for: this validator's verifier signs with the same key, and an
            # attestation lost in its block would never be sent again (the amount is unchanged)
            try:
                code, text = await self.committee.send(AttestStake(node=key, amount=amount))
            except TxRejectedError as error:
                code, text = error.tx_code, error.log_text
            except PlanetError as error:  # not committed in time: the rest next pass
                log.warning("attest_stake not sent node=%s: %s", key[:16], error.message)
                break
            if code != 0:
                log.warning("attest_stake refused node=%s code=%d log=%s", key[:16], code, text)
                continue
            self.attested[key] = amount
            sent.append((key, amount))
            log.info("attested node=%s address=%s amount=%d", key[:16], address, amount)
        # Only after every read succeeded: a failure above re-reads the same blocks next time.
        self.next_block = max(self.next_block, latest + 1)
        if resync:
            self._last_resync = now
        return sent


def due_nodes(
    nodes: Iterable[dict[str, Any]],
    changed: set[str],
    attested: dict[str, int],
    resync: bool,
    read_as: Mapping[str, tuple[str, str]] | None = None,
) -> list[tuple[str, str, str]]:
    """(key, evm address, role) of the nodes whose stake must be (re)read: not LEFT, and new to
    this watcher, or whose address's stake changed, or registered with another address or role
    than their stake was last read for (`read_as`), or all on a resync."""
    due = []
    for node in nodes:
        if node.get("status") == "LEFT":
            continue
        key, address = str(node["key"]), str(node["evm_address"])
        role = str(node.get("role", "compute"))
        moved = read_as is not None and read_as.get(key, (address.lower(), role)) != (
            address.lower(),
            role,
        )
        if resync or key not in attested or address.lower() in changed or moved:
            due.append((key, address, role))
    return due
