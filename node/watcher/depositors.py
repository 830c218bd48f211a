"""`EscrowDepositors`: who ever deposited a credit balance, read from the escrow's event log.

A mint is paid from the payer's balance at the escrow's own address, and that balance starts
with `depositBalance(escrow)` only: a payer without a `BalanceDeposited(payer, escrow, …)` event
has a balance of 0 (a dispute returns debits to a balance that was deposited first). So the
mint funder need not read the balance of a payer it has not seen deposit: a flood of mints from
fresh addresses costs it no EVM read, while each address that deposits paid gas for it (issue 42).

The log is read with `eth_getLogs` on the escrow's address, the `BalanceDeposited` topic and the
escrow's own address as the indexed gateway (topic 2), from the deployment's first block on,
incrementally (5,000 blocks a call), up to the pass's latest block (`latest_block`: the watcher
shares the one it read this pass, `PassHead`; without it, `eth_blockNumber` is read). A reorg
can only leave an address in the set whose balance is 0: the funder then reads it, and reads
decide, never this set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eth_utils import to_checksum_address
from eth_utils.abi import event_abi_to_log_topic
from web3 import Web3

from node.chain.evm.deployment import Deployment
from node.chain.evm.rpc import connect, rpc_guard
from protocol.errors import ConfigError

EVENT = "BalanceDeposited"
MAX_LOG_RANGE = 5_000  # blocks per eth_getLogs call


class EscrowDepositors:
    def __init__(
        self,
        deployment: Deployment,
        rpc_url: str | None = None,
        latest_block: Callable[[], int] | None = None,
    ) -> None:
        self.rpc_url = rpc_url or deployment.rpc_url
        self.w3 = connect(self.rpc_url)
        self.latest_block = latest_block or (
            lambda: int(self._rpc(lambda: self.w3.eth.block_number))
        )
        escrow = deployment.contracts.get("QueryEscrow")
        if escrow is None:
            raise ConfigError("the deployment has no QueryEscrow contract")
        self.address = escrow.address
        events = [e for e in escrow.abi if e.get("type") == "event" and e.get("name") == EVENT]
        if not events:
            raise ConfigError(f"the QueryEscrow ABI lacks the {EVENT} event")
        self.topic = Web3.to_hex(event_abi_to_log_topic(events[0]))
        self.gateway_topic = "0x" + "00" * 12 + self.address[2:].lower()
        self.next_block = deployment.block
        self.seen: set[str] = set()  # lowercase payer addresses

    def _rpc(self, call: Any) -> Any:
        return rpc_guard(call, self.rpc_url)

    def depositors(self) -> set[str]:
        """Every payer that deposited at the escrow's own address up to the latest block
        (lowercase); reads only the blocks not read before."""
        latest = self.latest_block()
        while self.next_block <= latest:
            end = min(latest, self.next_block + MAX_LOG_RANGE - 1)
            logs = self._rpc(
                lambda s=self.next_block, e=end: self.w3.eth.get_logs(
                    {
                        "address": self.address,
                        "fromBlock": s,
                        "toBlock": e,
                        "topics": [self.topic, None, self.gateway_topic],
                    }
                )
            )
            for entry in logs:
                topics = entry["topics"]
                if len(topics) >= 2:
                    self.seen.add(to_checksum_address(bytes(topics[1])[-20:]).lower())
            self.next_block = end + 1
        return self.seen
