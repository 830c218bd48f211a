"""The stake watcher's event → attestation logic against in-process fakes of both chains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from node.chain.committee_rpc import TxRejectedError
from node.watcher.watcher import StakeInfo, StakeWatcher, due_nodes, effective_stake
from protocol.committee.registry import AttestStake
from protocol.errors import UnavailableError

pytestmark = pytest.mark.unit

ETHER = 10**18
A, B = "0x" + "aa" * 20, "0x" + "bB" * 20
KEY_A, KEY_B = "0a" * 32, "0b" * 32
ACTIVE, UNBONDING = 1, 2


@dataclass
class FakeStaking:
    stakes: dict[str, StakeInfo] = field(default_factory=dict)
    events: list[tuple[int, str]] = field(default_factory=list)  # (block, address)
    block: int = 5
    reads: list[str] = field(default_factory=list)
    fail_logs: bool = False

    def latest_block(self) -> int:
        return self.block

    def changed_addresses(self, from_block: int, to_block: int) -> set[str]:
        if self.fail_logs:
            raise UnavailableError("evm down")
        return {a for b, a in self.events if from_block <= b <= to_block}

    def stake_info(self, address: str) -> StakeInfo:
        self.reads.append(address.lower())
        return self.stakes.get(address.lower(), StakeInfo(0, 0, 0))

    def set(self, address: str, amount: int, status: int = ACTIVE, role: int = 1) -> None:
        self.block += 1
        self.stakes[address.lower()] = StakeInfo(amount, role if amount else 0, status)
        self.events.append((self.block, address))


@dataclass
class FakeCommittee:
    nodes_list: list[dict[str, Any]] = field(default_factory=list)
    sent: list[AttestStake] = field(default_factory=list)
    refuse: bool = False

    async def nodes(self, **_filters: Any) -> list[dict[str, Any]]:
        return [dict(n) for n in self.nodes_list]

    lost: int = 0  # the next sends refused in their block (another signer took the nonce)

    async def send(self, body: Any, *, timeout_s: float = 15) -> tuple[int, str]:
        if self.refuse:
            raise TxRejectedError("rpc", code=14, log_text="not a validator")
        if self.lost:
            self.lost -= 1
            return 3, "nonce 7 ≤ last nonce 7"
        self.sent.append(body)
        return 0, ""


def _node(key: str, address: str, status: str = "SERVING", role: str = "compute") -> dict:
    return {"key": key, "evm_address": address, "status": status, "role": role}


def _watcher(staking: FakeStaking, committee: FakeCommittee, clock: list[float]) -> StakeWatcher:
    return StakeWatcher(staking, committee, start_block=0, resync_s=30.0, clock=lambda: clock[0])


async def test_watcher_attests_new_node_then_only_changes() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)]), [0.0]
    staking.set(A, ETHER)
    watcher = _watcher(staking, committee, clock)
    assert await watcher.step() == [(KEY_A, ETHER)]
    assert committee.sent == [AttestStake(node=KEY_A, amount=ETHER)]
    assert await watcher.step() == []  # nothing changed, no resync due: no tx, no read
    staking.set(A, 2 * ETHER)  # a top-up event
    assert await watcher.step() == [(KEY_A, 2 * ETHER)]


async def test_watcher_attests_zero_after_unstake_and_lower_after_slash() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)]), [0.0]
    staking.set(A, 2 * ETHER)
    watcher = _watcher(staking, committee, clock)
    await watcher.step()
    staking.set(A, ETHER)  # slashed by half: stakeOf is lower, still active
    assert await watcher.step() == [(KEY_A, ETHER)]
    staking.set(A, ETHER, status=UNBONDING)  # requestUnstake: amount stays, status unbonding
    assert await watcher.step() == [(KEY_A, 0)]


async def test_watcher_event_for_an_address_with_no_node_sends_nothing() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)]), [0.0]
    staking.set(A, ETHER)
    watcher = _watcher(staking, committee, clock)
    await watcher.step()
    staking.set(B, ETHER)  # B staked but never registered a node key
    assert await watcher.step() == []


async def test_watcher_node_registered_after_stake_gets_attested() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)]), [0.0]
    staking.set(A, ETHER)
    staking.set(B, 3 * ETHER)
    watcher = _watcher(staking, committee, clock)
    await watcher.step()
    committee.nodes_list.append(_node(KEY_B, B.lower()))  # address spelled differently
    assert await watcher.step() == [(KEY_B, 3 * ETHER)]


async def test_watcher_skips_left_nodes_and_resyncs_periodically() -> None:
    staking = FakeStaking()
    committee = FakeCommittee([_node(KEY_A, A), _node(KEY_B, B, status="LEFT")])
    clock = [0.0]
    staking.set(A, ETHER)
    staking.set(B, ETHER)
    watcher = _watcher(staking, committee, clock)
    assert await watcher.step() == [(KEY_A, ETHER)]
    staking.stakes[A.lower()] = StakeInfo(ETHER // 2, 1, ACTIVE)  # changed without an event seen
    assert await watcher.step() == []
    clock[0] = 31.0
    assert await watcher.step() == [(KEY_A, ETHER // 2)]


async def test_watcher_refused_attestation_is_retried_next_pass() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)], refuse=True), [0.0]
    staking.set(A, ETHER)
    watcher = _watcher(staking, committee, clock)
    assert await watcher.step() == []
    committee.refuse = False
    assert await watcher.step() == [(KEY_A, ETHER)]


async def test_watcher_evm_outage_rereads_the_same_blocks_later() -> None:
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)]), [0.0]
    staking.set(A, ETHER)
    watcher = _watcher(staking, committee, clock)
    await watcher.step()
    staking.set(A, 5 * ETHER)
    staking.fail_logs = True
    with pytest.raises(UnavailableError):
        await watcher.step()
    staking.fail_logs = False
    assert await watcher.step() == [(KEY_A, 5 * ETHER)]


@pytest.mark.parametrize(
    ("info", "role", "expected"),
    [
        (StakeInfo(ETHER, 1, ACTIVE), "compute", ETHER),
        (StakeInfo(ETHER, 1, UNBONDING), "compute", 0),
        (StakeInfo(ETHER, 2, ACTIVE), "compute", 0),  # staked as verifier, registered compute
        (StakeInfo(ETHER, 2, ACTIVE), "verifier", ETHER),
        (StakeInfo(0, 0, 0), "compute", 0),
        (StakeInfo(ETHER // 10, 3, ACTIVE), "relay", ETHER // 10),  # Staking's Relay role
        (StakeInfo(ETHER // 10, 3, UNBONDING), "relay", 0),
        (StakeInfo(ETHER, 1, ACTIVE), "relay", 0),  # a compute stake backs no relay
        (StakeInfo(ETHER // 10, 3, ACTIVE), "compute", 0),
    ],
)
def test_effective_stake(info: StakeInfo, role: str, expected: int) -> None:
    assert effective_stake(info, role) == expected


def test_due_nodes_new_changed_or_resync() -> None:
    nodes = [_node(KEY_A, A), _node(KEY_B, B)]
    assert due_nodes(nodes, set(), {KEY_A: 1, KEY_B: 1}, resync=False) == []
    assert [k for k, _, _ in due_nodes(nodes, {B.lower()}, {KEY_A: 1, KEY_B: 1}, False)] == [KEY_B]
    assert [k for k, _, _ in due_nodes(nodes, set(), {KEY_A: 1}, False)] == [KEY_B]
    assert len(due_nodes(nodes, set(), {KEY_A: 1, KEY_B: 1}, resync=True)) == 2


async def test_watcher_attestation_lost_in_its_block_is_sent_again() -> None:
    """The verifier signs with the watcher's key: an attestation refused in its block (its
    nonce taken) changed nothing and must go again, although the amount did not change."""
    staking, committee, clock = FakeStaking(), FakeCommittee([_node(KEY_A, A)], lost=1), [0.0]
    staking.set(A, ETHER)
    watcher = _watcher(staking, committee, clock)
    assert await watcher.step() == []
    assert await watcher.step() == [(KEY_A, ETHER)]
