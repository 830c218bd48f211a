"""`StakingReader`: the watcher's read-only view of the Staking contract over web3.

Events are read with `eth_getLogs` filtered on the Staking address and the four stake-changing
event topics; every one of them has the staker as its first indexed argument (topic 1), so no
log data needs decoding. Views: `stakeOf`, `roleOf`, `statusOf`. The latest block is read once
per pass (`head`, a `PassHead` the runner starts anew each pass and shares with the other steps).
"""

from __future__ import annotations

from typing import Any

from eth_utils import to_checksum_address
from eth_utils.abi import event_abi_to_log_topic
from web3 import Web3

from node.chain.evm.deployment import Deployment
from node.chain.evm.rpc import connect, rpc_guard
from node.watcher.head import PassHead
from node.watcher.watcher import StakeInfo
from protocol.errors import ConfigError

STAKE_EVENTS = ("Staked", "UnstakeRequested", "Withdrawn", "Slashed")
MAX_LOG_RANGE = 5_000  # blocks per eth_getLogs call


class StakingReader:
    def __init__(self, deployment: Deployment, rpc_url: str | None = None) -> None:
        self.rpc_url = rpc_url or deployment.rpc_url
        self.w3 = connect(self.rpc_url)
        staking = deployment.contracts.get("Staking")
        if staking is None:
            raise ConfigError("the deployment has no Staking contract")
        self.address = staking.address
        self.contract = self.w3.eth.contract(address=staking.address, abi=staking.abi)
        topics = {
            entry["name"]: Web3.to_hex(event_abi_to_log_topic(entry))
            for entry in staking.abi
            if entry.get("type") == "event" and entry.get("name") in STAKE_EVENTS
        }
        missing = sorted(set(STAKE_EVENTS) - set(topics))
        if missing:
            raise ConfigError(f"the Staking ABI lacks events {', '.join(missing)}")
        self.topics = sorted(topics.values())
        self.head = PassHead(lambda: int(self._rpc(lambda: self.w3.eth.block_number)))

    def _rpc(self, call: Any) -> Any:
        return rpc_guard(call, self.rpc_url)

    def latest_block(self) -> int:
        """This pass's latest block (read once a pass: `head`)."""
        return self.head.latest()

    def changed_addresses(self, from_block: int, to_block: int) -> set[str]:
        found: set[str] = set()
        start = from_block
        while start <= to_block:
            end = min(to_block, start + MAX_LOG_RANGE - 1)
            logs = self._rpc(
                lambda s=start, e=end: self.w3.eth.get_logs(
                    {
                        "address": self.address,
                        "fromBlock": s,
                        "toBlock": e,
                        "topics": [self.topics],
                    }
                )
            )
            for entry in logs:
                topics = entry["topics"]
                if len(topics) >= 2:
                    found.add(to_checksum_address(bytes(topics[1])[-20:]))
            start = end + 1
        return found

    def stake_info(self, address: str) -> StakeInfo:
        node = to_checksum_address(address)
        functions = self.contract.functions
        return StakeInfo(
            amount=int(self._rpc(lambda: functions.stakeOf(node).call())),
            role=int(self._rpc(lambda: functions.roleOf(node).call())),
            status=int(self._rpc(lambda: functions.statusOf(node).call())),
        )
