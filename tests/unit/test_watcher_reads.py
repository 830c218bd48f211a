"""Issue 41: what one watcher pass reads, counted on in-process fakes (no chain, no devnet).

- the latest EVM block: once a pass, shared by the stake watcher and the mint funder's deposit
  log (`PassHead`);
- every node's stake: on a full resync every `RESYNC_S` (10 minutes), not every 30 s; a change
  is still attested in the first pass after its block (its event), and a registration that
  moves to another address or role is read again in the next pass.
"""

from __future__ import annotations

from typing import Any

import pytest

from node.chain.evm.deployment import DeployedContract, Deployment
from node.watcher import depositors as depositors_module
from node.watcher import evm as evm_module
from node.watcher.depositors import EscrowDepositors
from node.watcher.evm import StakingReader
from node.watcher.watcher import StakeInfo, StakeWatcher
from tests.unit.test_watcher import (
    ACTIVE,
    ETHER,
    FakeCommittee,
    FakeStaking,
    _node,
)

pytestmark = pytest.mark.unit

ADDRESSES = ["0x" + f"{i:02x}" * 20 for i in (0xA1, 0xA2, 0xA3)]
TEN_MINUTES = 600  # the default full resync interval (RESYNC_S)
KEYS = [f"{i:02x}" * 32 for i in (0xA1, 0xA2, 0xA3)]


def _event(name: str, *types: str) -> dict[str, Any]:
    inputs = [{"name": f"a{i}", "type": t, "indexed": i == 0} for i, t in enumerate(types)]
    return {"type": "event", "name": name, "anonymous": False, "inputs": inputs}


STAKING_ABI = [
    _event("Staked", "address", "uint8", "uint256", "uint256"),
    _event("UnstakeRequested", "address", "uint256", "uint256"),
    _event("Withdrawn", "address", "uint256"),
    _event("Slashed", "address", "uint8", "uint256", "address", "uint256", "uint256"),
]
ESCROW_ABI = [_event("BalanceDeposited", "address", "address", "uint256")]


class _Eth:
    def __init__(self) -> None:
        self.block_reads = 0
        self.log_reads: list[tuple[int, int]] = []

    @property
    def block_number(self) -> int:
        self.block_reads += 1
        return 100 + self.block_reads  # a new block at every read

    def get_logs(self, query: dict[str, Any]) -> list[Any]:
        self.log_reads.append((query["fromBlock"], query["toBlock"]))
        return []

    def contract(self, **_kwargs: Any) -> object:
        return object()


class _Web3:
    def __init__(self) -> None:
        self.eth = _Eth()


def test_one_pass_reads_the_latest_block_once_for_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stake watcher's event range and the deposit log both read up to the pass's block,
    read once: two passes, two `eth_blockNumber` (the old code read it in each step)."""
    w3 = _Web3()
    monkeypatch.setattr(evm_module, "connect", lambda _url: w3)
    monkeypatch.setattr(depositors_module, "connect", lambda _url: w3)
    deployment = Deployment(
        chain_id=31337,
        rpc_url="http://evm.invalid",
        deployer="0x" + "00" * 20,
        block=1,
        contracts={
            "Staking": DeployedContract("0x" + "11" * 20, STAKING_ABI),
            "QueryEscrow": DeployedContract("0x" + "22" * 20, ESCROW_ABI),
        },
    )
    reader = StakingReader(deployment)
    deposits = EscrowDepositors(deployment, latest_block=reader.latest_block)
    for _ in range(2):
        reader.head.new_pass()  # what the runner does before each pass
        latest = reader.latest_block()
        reader.changed_addresses(1, latest)
        deposits.depositors()
        assert deposits.next_block == latest + 1  # the deposit log read up to the same block
    assert w3.eth.block_reads == 2


def _network(count: int = 3) -> tuple[FakeStaking, FakeCommittee]:
    staking = FakeStaking()
    for address in ADDRESSES[:count]:
        staking.set(address, ETHER)
    return staking, FakeCommittee([_node(k, a) for k, a in zip(KEYS, ADDRESSES, strict=False)])


async def test_an_idle_watcher_reads_every_stake_once_per_resync_interval() -> None:
    """Ten minutes of one-second passes over 3 idle nodes: 3 stake reads at start, 3 at the
    resync (the old 30 s resync read 63)."""
    staking, committee = _network()
    clock = [0.0]
    watcher = StakeWatcher(staking, committee, start_block=0, clock=lambda: clock[0])
    assert len(await watcher.step()) == 3
    for second in range(1, TEN_MINUTES + 1):
        clock[0] = float(second)
        assert await watcher.step() == []
    assert len(staking.reads) == 6


async def test_a_stake_change_is_attested_in_the_next_pass_without_a_resync() -> None:
    staking, committee = _network()
    clock = [0.0]
    watcher = StakeWatcher(staking, committee, start_block=0, clock=lambda: clock[0])
    await watcher.step()
    staking.reads.clear()
    clock[0] = 1.0
    staking.set(ADDRESSES[1], 3 * ETHER)  # its Staked event in the next block
    assert await watcher.step() == [(KEYS[1], 3 * ETHER)]
    assert staking.reads == [ADDRESSES[1]]  # the one address whose stake changed


async def test_a_registration_moved_to_another_address_or_role_is_read_in_the_next_pass() -> None:
    """No stake event for them: the node's registration changed on the committee chain (the
    old code waited for the resync, 30 s)."""
    staking, committee = _network()
    clock = [0.0]
    watcher = StakeWatcher(staking, committee, start_block=0, clock=lambda: clock[0])
    await watcher.step()
    other = "0x" + "b7" * 20
    staking.stakes[other] = StakeInfo(2 * ETHER, 1, ACTIVE)  # staked before the node moved
    committee.nodes_list[0] = _node(KEYS[0], other)
    clock[0] = 1.0
    assert await watcher.step() == [(KEYS[0], 2 * ETHER)]
    committee.nodes_list[2] = _node(KEYS[2], ADDRESSES[2], role="verifier")  # a compute stake
    clock[0] = 2.0
    assert await watcher.step() == [(KEYS[2], 0)]
    clock[0] = 3.0
    staking.reads.clear()
    assert await watcher.step() == [] and staking.reads == []
