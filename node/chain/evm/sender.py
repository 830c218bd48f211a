"""`Sender`: the one path by which an account calls the Planet contracts and sends transactions.

Built from a deployment file (`Deployment`) and one private key, it signs locally (eth-account
over coincurve), sends, and always waits for the receipt (anvil answers a tx hash before the
receipt exists). Reverts come back as decoded `ContractRevert`s, refused sends as named errors
(`node.chain.evm.errors`). It keeps its own nonce counter (one RPC less per transaction), so use
one sender per account and thread; after a rejected send it re-reads the nonce from the chain.
Another process sending from the same account (two `planet ask --pay` at once, one wallet) takes
a nonce this sender counted on: a send refused as "nonce too low" or as an underpriced
replacement never entered the pool, so it is signed again with the chain's next nonce, up to
`NONCE_TRIES` times.

`Binding` is one contract seen through a sender: the per-contract modules (`staking`,
`escrow`, `fraud_proofs`, `committee`, `registry`) subclass it, and all bindings of one account
share its sender, hence its nonce.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from eth_account import Account
from eth_utils import to_checksum_address
from web3 import Web3
from web3.exceptions import ContractLogicError, Web3RPCError

from node.chain.evm.deployment import Deployment
from node.chain.evm.errors import ContractRevert, RevertDecoder, revert_data, rpc_error
from node.chain.evm.rpc import connect, rpc_guard
from protocol.eip712 import ModelRegistration, PayoutRoot
from protocol.errors import ConfigError
from protocol.eth import NONCE_TAKEN

T = TypeVar("T")
TIP_REFRESH_S = 60.0
NONCE_TRIES = 5  # sends of one transaction whose nonce another sender of the account took


@dataclass(frozen=True)
class TxResult:
    """What a mined transaction left: hash, block, gas, and its decoded events."""

    tx_hash: str
    block: int
    gas_used: int
    fee_wei: int  # gas used × effective gas price: what the sender paid beyond `value`
    events: list[tuple[str, dict[str, Any]]]

    def event(self, name: str) -> dict[str, Any]:
        """Arguments of the first event called `name` (KeyError when absent)."""
        for event_name, args in self.events:
            if event_name == name:
                return args
        raise KeyError(f"no {name} event in {self.tx_hash} (got {[e for e, _ in self.events]})")


class _NonceTaken(Exception):
    """A send refused because its nonce is used (or pending) already: signed again."""

    def __init__(self, error: Web3RPCError) -> None:
        super().__init__(str(error))
        self.error = error


class Sender:
    """Signs and sends transactions to the deployment's contracts as one account."""

    def __init__(
        self,
        deployment: Deployment,
        private_key: str | bytes,
        *,
        rpc_url: str | None = None,
        receipt_timeout_s: float = 30.0,
    ) -> None:
        self.deployment = deployment
        self.rpc_url = rpc_url or deployment.rpc_url
        self.w3 = connect(self.rpc_url)
        self.account = Account.from_key(private_key)
        self.address: str = self.account.address
        self.receipt_timeout_s = receipt_timeout_s
        chain_id = self._rpc(lambda: self.w3.eth.chain_id)
        if chain_id != deployment.chain_id:
            raise ConfigError(
                f"{self.rpc_url} is chain {chain_id}, the deployment is for chain "
                f"{deployment.chain_id}",
                hint="point --rpc at the chain the contracts were deployed to",
            )
        self.chain_id = chain_id
        self.contracts = {
            name: self.w3.eth.contract(address=c.address, abi=c.abi)
            for name, c in deployment.contracts.items()
        }
        self.decoder = RevertDecoder(c.abi for c in deployment.contracts.values())
        self._nonce: int | None = None
        self._tip: tuple[int, float] | None = None  # (wei, monotonic time it was fetched)

    def _rpc(self, call: Callable[[], T]) -> T:
        return rpc_guard(call, self.rpc_url)

    def _contract(self, name: str) -> Any:
        if name not in self.contracts:
            raise ConfigError(f"the deployment has no contract {name!r}")
        return self.contracts[name]

    def balance(self, address: str | None = None) -> int:
        """Native balance in wei."""
        return self._rpc(lambda: self.w3.eth.get_balance(address or self.address))

    def call(self, contract: str, function: str, *args: Any) -> Any:
        """A view call; reverts become ContractRevert."""
        fn = getattr(self._contract(contract).functions, function)(*args)
        try:
            return self._rpc(lambda: fn.call({"from": self.address}))
        except ContractLogicError as error:
            raise self.decoder.exception(
                revert_data(error), contract=contract, function=function
            ) from None

    def transact(
        self, contract: str, function: str, *args: Any, value: int = 0, next_block: bool = False
    ) -> TxResult:
        """Sign, send and wait for one transaction; reverts become ContractRevert.

        `next_block`: estimate gas in the pending block (for calls that must run in a later block
        than the previous transaction, e.g. a proof after its challenge commitment)."""
        tries = 1
        while True:
            try:
                return self._transact_once(contract, function, args, value, next_block)
            except _NonceTaken as taken:
                if tries == NONCE_TRIES:
                    raise rpc_error(taken.error, self.rpc_url, f"{contract}.{function}") from None
            time.sleep(random.uniform(0.02, 0.1) * tries)  # apart from the other sender
            tries += 1

    def _transact_once(
        self, contract: str, function: str, args: tuple[Any, ...], value: int, next_block: bool
    ) -> TxResult:
        instance = self._contract(contract)
        fn = getattr(instance.functions, function)(*args)
        try:
            if self._nonce is None:
                self._nonce = self._rpc(
                    lambda: self.w3.eth.get_transaction_count(self.address, "pending")
                )
            params: dict[str, Any] = {
                "from": self.address,
                "value": value,
                "nonce": self._nonce,
                "chainId": self.chain_id,
                **self._fees(),
            }
            if next_block:
                params["gas"] = self._rpc(
                    lambda: fn.estimate_gas(
                        {"from": self.address, "value": value}, block_identifier="pending"
                    )
                )
            tx = self._rpc(lambda: fn.build_transaction(params))
        except ContractLogicError as error:  # eth_estimateGas reverted
            raise self.decoder.exception(
                revert_data(error), contract=contract, function=function
            ) from None
        except Web3RPCError as error:
            raise rpc_error(error, self.rpc_url, f"{contract}.{function}") from None
        signed = self.account.sign_transaction(tx)
        try:
            tx_hash = self._rpc(lambda: self.w3.eth.send_raw_transaction(signed.raw_transaction))
        except Web3RPCError as error:
            self._nonce = None
            if any(text in str(error).lower() for text in NONCE_TAKEN):
                raise _NonceTaken(error) from None
            raise rpc_error(error, self.rpc_url, f"{contract}.{function}") from None
        self._nonce += 1
        receipt = self._rpc(
            lambda: self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.receipt_timeout_s, poll_latency=0.01
            )
        )
        if receipt["status"] != 1:
            raise self._replay_revert(tx, receipt["blockNumber"], contract, function)
        return TxResult(
            tx_hash=Web3.to_hex(tx_hash),
            block=receipt["blockNumber"],
            gas_used=receipt["gasUsed"],
            fee_wei=receipt["gasUsed"] * receipt["effectiveGasPrice"],
            events=self._decode_events(receipt),
        )

    def _fees(self) -> dict[str, int]:
        """EIP-1559 fees as web3 would pick them (2 × base fee + tip), with the tip fetched at
        most once a minute instead of once per transaction."""
        now = time.monotonic()
        if self._tip is None or now - self._tip[1] > TIP_REFRESH_S:
            self._tip = (self._rpc(lambda: self.w3.eth.max_priority_fee), now)
        base_fee = self._rpc(lambda: self.w3.eth.get_block("latest"))["baseFeePerGas"]
        return {"maxPriorityFeePerGas": self._tip[0], "maxFeePerGas": 2 * base_fee + self._tip[0]}

    def _replay_revert(
        self, tx: Mapping[str, Any], block: int, contract: str, function: str
    ) -> ContractRevert:
        """A mined-but-failed tx: replay it as a call at its block to recover the reason."""
        call = {k: tx[k] for k in ("from", "to", "data", "value") if k in tx}
        try:
            self._rpc(lambda: self.w3.eth.call(call, block - 1))
        except ContractLogicError as error:
            return self.decoder.exception(revert_data(error), contract=contract, function=function)
        return ContractRevert("Reverted", contract=contract, function=function)

    def _decode_events(self, receipt: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        by_address = {c.address: c for c in self.contracts.values()}
        events: list[tuple[str, dict[str, Any]]] = []
        for entry in receipt["logs"]:
            instance = by_address.get(to_checksum_address(entry["address"]))
            if instance is None:
                continue
            for event_abi in instance.events:
                try:
                    decoded = event_abi.process_log(entry)
                except Exception:  # not this event's topic: try the next ABI entry
                    continue
                events.append((decoded["event"], dict(decoded["args"])))
                break
        return events


class Binding:
    """One contract of the deployment (`NAME`), called and sent to through a shared `Sender`."""

    NAME: ClassVar[str]

    def __init__(self, sender: Sender) -> None:
        self.sender = sender

    @property
    def address(self) -> str:
        """The contract's address in the deployment."""
        return self.sender.deployment.address(self.NAME)

    def call(self, function: str, *args: Any) -> Any:
        """A view call of this contract; reverts become ContractRevert."""
        return self.sender.call(self.NAME, function, *args)

    def transact(
        self, function: str, *args: Any, value: int = 0, next_block: bool = False
    ) -> TxResult:
        """One transaction to this contract (see `Sender.transact`)."""
        return self.sender.transact(self.NAME, function, *args, value=value, next_block=next_block)

    def require_consumer(self, struct: PayoutRoot | ModelRegistration) -> None:
        """Refuse a committee-signed statement bound to another contract than this one."""
        if struct.consumer != self.address:
            raise ConfigError(
                f"the {struct.PRIMARY_TYPE} names consumer {struct.consumer}, not this "
                f"deployment's {self.NAME} {self.address}",
                hint=f"build it with consumer=deployment.address({self.NAME!r})",
            )
