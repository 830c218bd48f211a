"""`PlanetChain`: a typed web3 (v8) client for the settlement contracts.

Built from a deployment file (written by `planet contracts deploy`, see `Deployment`) and one
private key, it signs locally (eth-account over coincurve), sends, and always waits for the
receipt (anvil answers a tx hash before the receipt exists).

Errors are translated here, at the edge:

    PlanetError
    ├── ContractRevert            a call reverted; `.error_name`, `.args` (decoded values),
    │   │                         `.named_args`, `.contract`, `.function`
    │   ├── BelowMinimum, NotStaked, QueryExists, QueryNotFunded, ChallengeWindowOpen,
    │   │   AlreadyClaimed, InvalidClaim, AlreadyProven, InsufficientPower, … (by error name)
    │   └── (any other custom error, `Error(string)` or `Panic(uint256)` stays a ContractRevert)
    ├── InsufficientFunds         the sender cannot pay value + gas
    └── UnavailableError          the RPC is unreachable or too slow (with a hint)

Custom errors are decoded from the ABIs' `error` entries (selector = first 4 bytes of
keccak256 of the signature) — the same table for every contract of the deployment, because an
error raised in one contract can bubble up through another (e.g. `Committee.verify`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import requests
from eth_abi import decode as abi_decode
from eth_account import Account
from eth_utils import keccak, to_checksum_address
from web3 import Web3
from web3.exceptions import (
    ContractLogicError,
    TimeExhausted,
    Web3RPCError,
)
from web3.providers.rpc.utils import ExceptionRetryConfiguration
from web3.types import RPCEndpoint

from protocol.eip712 import (
    OFFENCE_COMMIT_REVEAL_MISMATCH,
    OFFENCE_EQUIVOCATION,
    OFFENCE_FAILED_VERIFICATION,
    Commitment,
    CommitteeUpdate,
    Domain,
    ModelRegistration,
    PayoutRoot,
    Reveal,
    TypedStruct,
    Verdict,
    as_address,
    challenge_commitment,
    committee_domain,
    evidence_id,
    fraud_proofs_domain,
)
from protocol.errors import ConfigError, PlanetError, ProtocolError, UnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")
TIP_REFRESH_S = 60.0

ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)
PANIC_CODES = {
    0x01: "assert failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division by zero",
    0x21: "invalid enum value",
    0x31: "pop on empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
    0x51: "call to an uninitialised function",
}


# --- reverts ------------------------------------------------------------------------------------


class ContractRevert(PlanetError):
    """A contract call reverted with a decoded reason."""

    code = "contract_revert"
    http_status = 409
    exit_status = 8
    error_name: str = ""

    def __init__(
        self,
        error_name: str,
        args: Sequence[Any] = (),
        *,
        named_args: Mapping[str, Any] | None = None,
        contract: str | None = None,
        function: str | None = None,
        data: bytes = b"",
        hint: str | None = None,
    ) -> None:
        where = f"{contract}.{function}" if contract and function else (function or "call")
        shown = ", ".join(f"{k}={_show(v)}" for k, v in (named_args or {}).items()) or ", ".join(
            _show(v) for v in args
        )
        super().__init__(f"{where} reverted: {error_name}({shown})", hint=hint)
        self.error_name = error_name
        self.args = tuple(args)
        self.named_args = dict(named_args or {})
        self.contract = contract
        self.function = function
        self.data = data

    def __str__(self) -> str:
        return self.message


def _show(value: Any) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


# Typed subclasses for the reverts callers commonly handle; the class name is the custom error
# name in the contracts. Add more by subclassing ContractRevert (registered automatically).
REVERT_TYPES: dict[str, type[ContractRevert]] = {}


def _typed(name: str, hint: str | None = None) -> type[ContractRevert]:
    cls = type(name, (ContractRevert,), {"error_name": name, "default_hint": hint})
    REVERT_TYPES[name] = cls
    return cls


BelowMinimum = _typed("BelowMinimum", "stake at least the role's minimum (minimumStake(role))")
NotStaked = _typed("NotStaked", "stake first (`stake(role)` with at least the minimum)")
UnbondingNotElapsed = _typed("UnbondingNotElapsed", "wait until the unstake delay has passed")
QueryExists = _typed("QueryExists", "a query id can be funded once; use a fresh id")
QueryNotFunded = _typed("QueryNotFunded", "the query has no open deposit (settled/refunded?)")
RefundNotYetAvailable = _typed("RefundNotYetAvailable", "wait for the refund timeout")
ChallengeWindowOpen = _typed("ChallengeWindowOpen", "wait until the challenge window closes")
AlreadyClaimed = _typed("AlreadyClaimed", "each (epoch, account) is paid once")
InvalidClaim = _typed("InvalidClaim", "the Merkle proof does not lead to the epoch's root")
AlreadyProven = _typed("AlreadyProven", "this offence was already slashed")
InvalidSignature = _typed("InvalidSignature", "signatures are 65-byte r||s||v with low s")
InsufficientPower = _typed("InsufficientPower", "collect signatures for at least 2/3 power")
SignersNotSorted = _typed("SignersNotSorted", "sort signatures by ascending signer address")
UnknownSigner = _typed("UnknownSigner", "a signer is not in the current committee")
FraudWindowOpen = _typed(
    "FraudWindowOpen", "recorded work keeps the stake until its challenge window closes"
)
ChallengeNotCommitted = _typed(
    "ChallengeNotCommitted", "commit the challenge (commitChallenge) in an earlier block first"
)
ChallengeNotMatured = _typed(
    "ChallengeNotMatured", "send the proof in a later block than its commitment"
)
WrongConsumer = _typed("WrongConsumer", "the committee signed this for another deployment")
WorkAlreadyCovered = _typed(
    "WorkAlreadyCovered", "a later piece of the node's work is already recorded"
)
NothingToWithdraw = _typed("NothingToWithdraw", "the prepaid balance is empty")
WithdrawalAlreadyRequested = _typed(
    "WithdrawalAlreadyRequested", "a withdrawal is already pending; wait for it, or cancel it"
)
WithdrawalNotRequested = _typed(
    "WithdrawalNotRequested", "request the withdrawal first (planet balance withdraw --request)"
)
WithdrawalNotYetAvailable = _typed(
    "WithdrawalNotYetAvailable", "wait until the withdrawal delay has passed"
)


class InsufficientFunds(PlanetError):
    """The sending account cannot pay value + gas."""

    code = "insufficient_funds"
    exit_status = 8


class RevertDecoder:
    """Selector → (name, input types, input names) table built from ABIs' error entries."""

    def __init__(self, abis: Iterable[Sequence[Mapping[str, Any]]]) -> None:
        self._errors: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for abi in abis:
            for entry in abi:
                if entry.get("type") != "error":
                    continue
                types = [_abi_type(item) for item in entry.get("inputs", [])]
                names = [item.get("name") or f"arg{i}" for i, item in enumerate(entry["inputs"])]
                signature = f"{entry['name']}({','.join(types)})"
                self._errors[keccak(text=signature)[:4]] = (entry["name"], types, names)

    def __contains__(self, name: str) -> bool:
        return any(entry[0] == name for entry in self._errors.values())

    def decode(self, data: bytes) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """(error name, positional values, named values) for revert data."""
        selector, body = data[:4], data[4:]
        if not data:
            return "EmptyRevert", (), {}
        if selector == ERROR_STRING_SELECTOR:
            (reason,) = _safe_decode(["string"], body) or ("<undecodable>",)
            return "Error", (reason,), {"reason": reason}
        if selector == PANIC_SELECTOR:
            (code,) = _safe_decode(["uint256"], body) or (-1,)
            return "Panic", (code,), {"code": code, "meaning": PANIC_CODES.get(code, "unknown")}
        if selector in self._errors:
            name, types, names = self._errors[selector]
            values = _safe_decode(types, body)
            if values is not None:
                values = tuple(_normalise(v, t) for v, t in zip(values, types, strict=True))
                return name, values, dict(zip(names, values, strict=True))
        return "UnknownError", (data,), {"data": data}

    def exception(
        self, data: bytes, *, contract: str | None = None, function: str | None = None
    ) -> ContractRevert:
        name, values, named = self.decode(data)
        cls = REVERT_TYPES.get(name, ContractRevert)
        return cls(
            name,
            values,
            named_args=named,
            contract=contract,
            function=function,
            data=data,
            hint=getattr(cls, "default_hint", None),
        )


def _abi_type(item: Mapping[str, Any]) -> str:
    kind = item["type"]
    if kind.startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in item.get("components", []))
        return f"({inner}){kind[len('tuple') :]}"
    return kind


def _safe_decode(types: list[str], body: bytes) -> tuple[Any, ...] | None:
    try:
        return tuple(abi_decode(types, body))
    except Exception:  # malformed revert data is reported as undecodable, never raised
        return None


def _normalise(value: Any, solidity_type: str) -> Any:
    if solidity_type == "address" and isinstance(value, str):
        return to_checksum_address(value)
    return value


def revert_data(error: ContractLogicError) -> bytes:
    """The raw revert bytes carried by a web3 ContractLogicError (custom or Error/Panic)."""
    data = error.data
    if isinstance(data, dict):
        data = data.get("data") or next(iter(data.values()), None)
    if isinstance(data, str) and data.startswith("0x"):
        try:
            return bytes.fromhex(data[2:])
        except ValueError:
            return b""
    return b""


# --- deployment file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeployedContract:
    address: str
    abi: list[dict[str, Any]]


@dataclass(frozen=True)
class Deployment:
    """`{chain_id, rpc_url, deployer, block, contracts: {Name: {address, abi}}}` (+ config)."""

    chain_id: int
    rpc_url: str
    deployer: str
    block: int  # first block of the deployment: where event scans start
    contracts: dict[str, DeployedContract]
    config: dict[str, Any] = field(default_factory=dict)  # DeployConfig.to_json() (wei, seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "chain_id": self.chain_id,
            "rpc_url": self.rpc_url,
            "deployer": self.deployer,
            "block": self.block,
            "config": self.config,
            "contracts": {
                name: {"address": c.address, "abi": c.abi} for name, c in self.contracts.items()
            },
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Deployment:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
            contracts = {
                name: DeployedContract(to_checksum_address(c["address"]), c["abi"])
                for name, c in raw["contracts"].items()
            }
            return cls(
                chain_id=int(raw["chain_id"]),
                rpc_url=str(raw["rpc_url"]),
                deployer=to_checksum_address(raw["deployer"]),
                block=int(raw["block"]),
                contracts=contracts,
                config=dict(raw.get("config", {})),
            )
        except FileNotFoundError:
            raise ConfigError(
                f"no deployment file at {path}", hint="run `planet contracts deploy` first"
            ) from None
        except (KeyError, ValueError, TypeError) as error:
            raise ConfigError(f"{path}: not a Planet deployment file ({error})") from None

    def address(self, name: str) -> str:
        if name not in self.contracts:
            raise ConfigError(f"the deployment has no contract {name!r}")
        return self.contracts[name].address


# --- the client ---------------------------------------------------------------------------------


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


def connect(rpc_url: str, timeout_s: float = 10.0) -> Web3:
    """A web3 HTTP connection that is known to answer (UnavailableError otherwise).

    The chain id is cached by the provider (web3 would otherwise ask for it twice per
    transaction while validating and signing); reads are retried 3 times within 0.3 s."""
    provider = Web3.HTTPProvider(
        rpc_url,
        request_kwargs={"timeout": timeout_s},
        # web3's default (5 retries, 0.125 s doubling) spends ~4 s before reporting a dead RPC.
        exception_retry_configuration=ExceptionRetryConfiguration(
            errors=(requests.exceptions.ConnectionError, requests.exceptions.Timeout),
            retries=3,
            backoff_factor=0.1,
        ),
        cache_allowed_requests=True,
        cacheable_requests={RPCEndpoint("eth_chainId")},
    )
    w3 = Web3(provider)
    rpc_guard(lambda: w3.eth.chain_id, rpc_url)
    return w3


def rpc_guard(call: Callable[[], T], rpc_url: str) -> T:
    """Run `call`, turning transport failures into UnavailableError with a hint."""
    try:
        return call()
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as error:
        raise UnavailableError(
            f"EVM RPC {rpc_url} is unreachable ({type(error).__name__})",
            hint="start a chain (`planet contracts deploy` starts an anvil) or pass --rpc URL",
        ) from None
    except TimeExhausted as error:
        raise UnavailableError(f"EVM RPC {rpc_url}: timed out waiting ({error})") from None


class PlanetChain:
    """Signs and sends transactions to the Planet contracts as one account.

    Keeps its own nonce counter (one RPC less per transaction), so use one instance per
    account and thread; after a rejected send it re-reads the nonce from the chain.
    """

    CONTRACT_NAMES: ClassVar[tuple[str, ...]] = (
        "Committee",
        "Staking",
        "FraudProofs",
        "QueryEscrow",
        "ModelRegistry",
    )

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

    @classmethod
    def from_file(
        cls, path: str | Path, private_key: str | bytes, *, rpc_url: str | None = None
    ) -> PlanetChain:
        return cls(Deployment.load(path), private_key, rpc_url=rpc_url)

    # --- plumbing -------------------------------------------------------------------------------

    def _rpc(self, call: Callable[[], T]) -> T:
        return rpc_guard(call, self.rpc_url)

    def _contract(self, name: str) -> Any:
        if name not in self.contracts:
            raise ConfigError(f"the deployment has no contract {name!r}")
        return self.contracts[name]

    def domain_committee(self) -> Domain:
        return committee_domain(self.chain_id, self.deployment.address("Committee"))

    def domain_fraud_proofs(self) -> Domain:
        return fraud_proofs_domain(self.chain_id, self.deployment.address("FraudProofs"))

    def _fees(self) -> dict[str, int]:
        """EIP-1559 fees as web3 would pick them (2 × base fee + tip), with the tip fetched at
        most once a minute instead of once per transaction."""
        now = time.monotonic()
        if self._tip is None or now - self._tip[1] > TIP_REFRESH_S:
            self._tip = (self._rpc(lambda: self.w3.eth.max_priority_fee), now)
        base_fee = self._rpc(lambda: self.w3.eth.get_block("latest"))["baseFeePerGas"]
        return {"maxPriorityFeePerGas": self._tip[0], "maxFeePerGas": 2 * base_fee + self._tip[0]}

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

    def balance(self, address: str | None = None) -> int:
        """Native balance in wei."""
        return self._rpc(lambda: self.w3.eth.get_balance(address or self.address))

    # --- Staking --------------------------------------------------------------------------------

    def stake(self, role: int, amount_wei: int) -> TxResult:
        """Bond `amount_wei` as `role` (ROLE_COMPUTE 1 / ROLE_VERIFIER 2), or top it up."""
        return self.transact("Staking", "stake", role, value=amount_wei)

    def request_unstake(self) -> TxResult:
        return self.transact("Staking", "requestUnstake")

    def withdraw(self) -> TxResult:
        return self.transact("Staking", "withdraw")

    def claim_credit(self) -> TxResult:
        """Pull the challenger rewards credited to this account."""
        return self.transact("Staking", "claimCredit")

    def stake_of(self, node: str | None = None) -> int:
        return self.call("Staking", "stakeOf", node or self.address)

    def role_of(self, node: str | None = None) -> int:
        return self.call("Staking", "roleOf", node or self.address)

    def status_of(self, node: str | None = None) -> int:
        """0 None, 1 Active, 2 Unbonding."""
        return self.call("Staking", "statusOf", node or self.address)

    def unbonding_at(self, node: str | None = None) -> int:
        return self.call("Staking", "unbondingAt", node or self.address)

    def is_eligible(self, node: str | None = None) -> bool:
        return self.call("Staking", "isEligible", node or self.address)

    def credit_of(self, account: str | None = None) -> int:
        return self.call("Staking", "creditOf", account or self.address)

    def locked_until(self, node: str | None = None) -> int:
        """Earliest withdrawal time set by recorded work (0: none)."""
        return self.call("Staking", "lockedUntil", node or self.address)

    def total_burned(self) -> int:
        return self.call("Staking", "totalBurned")

    # --- QueryEscrow ----------------------------------------------------------------------------

    def deposit(self, query_id: bytes, model_id: bytes, amount_wei: int) -> TxResult:
        """Prepay `query_id` (the value is the fee cap)."""
        return self.transact("QueryEscrow", "deposit", query_id, model_id, value=amount_wei)

    def is_funded(self, query_id: bytes) -> bool:
        return self.call("QueryEscrow", "isFunded", query_id)

    def deposit_of(self, query_id: bytes) -> dict[str, Any]:
        """{user, amount, status, deposited_at}; status 0 None, 1 Funded, 2 Settled,
        3 Reclaimed, 4 Refunded."""
        user, amount, status, deposited_at = self.call("QueryEscrow", "depositOf", query_id)
        return {"user": user, "amount": amount, "status": status, "deposited_at": deposited_at}

    def refund(self, query_id: bytes) -> TxResult:
        """Take back what `query_id` still holds (all of it after the timeout if unsettled, or
        the part its fee did not use once settled)."""
        return self.transact("QueryEscrow", "refund", query_id)

    def post_payout_root(
        self,
        statement: PayoutRoot,
        query_ids: Sequence[bytes],
        fees: Sequence[int],
        signatures: Sequence[bytes],
        *,
        payers: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Post a committee-signed epoch statement (its queriesHash must match ids, fees, payers
        and debits, its consumer must be this deployment's QueryEscrow). Payers ascend by
        address (`EpochSettlement.payers` does)."""
        self._check_consumer(statement, "QueryEscrow")
        return self.transact(
            "QueryEscrow",
            "postPayoutRoot",
            statement.epoch,
            statement.root,
            statement.total,
            _charges(query_ids, fees, payers, debits),
            list(signatures),
        )

    def claim(self, epoch: int, amount: int, proof: Sequence[bytes]) -> TxResult:
        """Claim this account's leaf `(epoch, self.address, amount)` of the epoch's payout tree
        (only the payee itself may claim: the escrow pays the caller; an epoch that collected
        less than it signed pays pro rata)."""
        return self.transact("QueryEscrow", "claim", epoch, self.address, amount, list(proof))

    def dispute_root(
        self,
        epoch: int,
        query_ids: Sequence[bytes],
        fees: Sequence[int],
        posted_signatures: Sequence[bytes],
        other: PayoutRoot,
        other_signatures: Sequence[bytes],
        *,
        payers: Sequence[str] = (),
        debits: Sequence[int] = (),
    ) -> TxResult:
        """Freeze `epoch` with a second, different committee-signed statement for it (the
        posted charges are re-supplied: query ids, fees, payers, debits)."""
        self._check_consumer(other, "QueryEscrow")
        return self.transact(
            "QueryEscrow",
            "disputeRoot",
            epoch,
            _charges(query_ids, fees, payers, debits),
            list(posted_signatures),
            (other.root, other.total, other.queries_hash),
            list(other_signatures),
        )

    def deposit_balance(self, amount_wei: int) -> TxResult:
        """Add `amount_wei` to this account's prepaid balance (vouchers spend it)."""
        return self.transact("QueryEscrow", "depositBalance", value=amount_wei)

    def request_withdrawal(self) -> TxResult:
        """Start withdrawing the whole prepaid balance (opens after the refund timeout)."""
        return self.transact("QueryEscrow", "requestWithdrawal")

    def cancel_withdrawal(self) -> TxResult:
        return self.transact("QueryEscrow", "cancelWithdrawal")

    def withdraw_balance(self) -> TxResult:
        """Take the remaining prepaid balance once the requested withdrawal has matured."""
        return self.transact("QueryEscrow", "withdrawBalance")

    def prepaid_of(self, payer: str | None = None) -> dict[str, int]:
        """{balance, withdrawable_at} (0: no withdrawal requested) of `payer` (default: self)."""
        balance, withdrawable_at = self.call("QueryEscrow", "prepaidOf", payer or self.address)
        return {"balance": int(balance), "withdrawable_at": int(withdrawable_at)}

    def shortfall_of(self, epoch: int) -> dict[str, int]:
        """{total, collected}: both 0 unless the epoch collected less than it signed."""
        total, collected = self.call("QueryEscrow", "shortfallOf", epoch)
        return {"total": int(total), "collected": int(collected)}

    def refund_timeout(self) -> int:
        """Seconds before an unsettled deposit refunds, and a requested withdrawal opens."""
        return int(self.call("QueryEscrow", "refundTimeout"))

    def epoch_of(self, epoch: int) -> dict[str, Any]:
        """{root, unclaimed, claimable_at, status (0 None 1 Posted 2 Disputed)}."""
        root, unclaimed, claimable_at, status = self.call("QueryEscrow", "epochOf", epoch)
        return {
            "root": root,
            "unclaimed": unclaimed,
            "claimable_at": claimable_at,
            "status": status,
        }

    def is_claimed(self, epoch: int, account: str) -> bool:
        return self.call("QueryEscrow", "claimed", epoch, account)

    # --- FraudProofs ----------------------------------------------------------------------------
    #
    # Node-signed proofs are two transactions: `commitChallenge(challengeCommitment(self, evidence
    # id, offence, salt))`, mined, then the proof with the salt in a later block, so nobody who
    # copies the proof from the mempool can take the reward. The prove_* methods do both (a random
    # salt unless one is given); `commit_challenge` alone lets a caller commit early.

    def commit_challenge(self, commitment: bytes) -> TxResult:
        """Commit to a challenge (see `protocol.eip712.challenge_commitment`)."""
        return self.transact("FraudProofs", "commitChallenge", commitment)

    def _commit_for(
        self, struct: TypedStruct, signature: bytes, offence: int, salt: bytes | None
    ) -> bytes:
        """Commit this account's challenge of the slot `struct` is about; returns the salt.
        A signature that does not recover is left for the contract to reject (no commitment)."""
        salt = salt if salt is not None else os.urandom(32)
        try:
            node = struct.recover(signature, self.domain_fraud_proofs())
        except ProtocolError:
            return salt
        slot = evidence_id(node, struct.session, struct.step, struct.shard)  # type: ignore[attr-defined]
        self.commit_challenge(challenge_commitment(self.address, slot, offence, salt))
        return salt

    def prove_reveal_mismatch(
        self,
        commitment: Commitment,
        commitment_signature: bytes,
        reveal: Reveal,
        reveal_signature: bytes,
        *,
        salt: bytes | None = None,
    ) -> TxResult:
        """Slash the node whose signed reveal does not open its signed commitment (100 %):
        commits the challenge, then proves it in the next block."""
        salt = self._commit_for(
            commitment, commitment_signature, OFFENCE_COMMIT_REVEAL_MISMATCH, salt
        )
        return self.transact(
            "FraudProofs",
            "proveRevealMismatch",
            _commitment_tuple(commitment),
            commitment_signature,
            _reveal_tuple(reveal),
            reveal_signature,
            salt,
            next_block=True,
        )

    def prove_equivocation(
        self,
        first: Commitment,
        first_signature: bytes,
        second: Commitment,
        second_signature: bytes,
        *,
        salt: bytes | None = None,
    ) -> TxResult:
        """Slash the node that signed two different commitments for one slot (100 %)."""
        salt = self._commit_for(first, first_signature, OFFENCE_EQUIVOCATION, salt)
        return self.transact(
            "FraudProofs",
            "proveEquivocation",
            _commitment_tuple(first),
            first_signature,
            _commitment_tuple(second),
            second_signature,
            salt,
            next_block=True,
        )

    def prove_computation_fault(
        self, reveal: Reveal, reveal_signature: bytes, proof: bytes, *, salt: bytes | None = None
    ) -> TxResult:
        """Slash FailedVerification (50 %) when the deployment's fault verifier (ZK hook) accepts
        `proof` against the node-signed reveal (slot, model, input and output as signed)."""
        salt = self._commit_for(reveal, reveal_signature, OFFENCE_FAILED_VERIFICATION, salt)
        return self.transact(
            "FraudProofs",
            "proveComputationFault",
            _reveal_tuple(reveal),
            reveal_signature,
            proof,
            salt,
            next_block=True,
        )

    def record_commitment(self, commitment: Commitment, signature: bytes) -> TxResult:
        """Keep the signing node's stake until `signed_at + challengeWindow + 1`."""
        return self.transact(
            "FraudProofs", "recordCommitment", _commitment_tuple(commitment), signature
        )

    def record_reveal(self, reveal: Reveal, signature: bytes) -> TxResult:
        """Like `record_commitment`, for a signed reveal."""
        return self.transact("FraudProofs", "recordReveal", _reveal_tuple(reveal), signature)

    def slash_by_verdict(self, verdict: Verdict, signatures: Sequence[bytes]) -> TxResult:
        """Slash on a committee-signed verdict (the verdict's challenger earns the reward; its
        consumer must be this deployment's FraudProofs)."""
        return self.transact(
            "FraudProofs",
            "slashByVerdict",
            (
                verdict.node,
                verdict.offence,
                verdict.evidence_hash,
                verdict.challenger,
                verdict.nonce,
                verdict.consumer,
            ),
            list(signatures),
        )

    def relay_confirmed_verdict(self, record: Mapping[str, Any]) -> TxResult:
        """Relay one confirmed record of the committee's `/verdicts?confirmed=true` (its
        `node`, `offence`, `evidence_hash`, `challenger`, `nonce`, `signatures` sorted by
        signer) to this deployment's FraudProofs.slashByVerdict: what any relayer does."""
        verdict = Verdict(
            node=record["node"],
            offence=record["offence"],
            evidence_hash=bytes.fromhex(record["evidence_hash"][2:]),
            challenger=record["challenger"],
            nonce=record["nonce"],
            consumer=self.deployment.address("FraudProofs"),
        )
        return self.slash_by_verdict(verdict, [bytes.fromhex(s[2:]) for s in record["signatures"]])

    def is_proven(self, evidence_id: bytes) -> bool:
        return self.call("FraudProofs", "proven", evidence_id)

    def penalty_of(self, evidence_id: bytes) -> int:
        """Highest share (basis points) the evidence has cost its node so far."""
        return self.call("FraudProofs", "penaltyOf", evidence_id)

    def _check_consumer(self, struct: PayoutRoot | ModelRegistration, contract: str) -> None:
        expected = self.deployment.address(contract)
        if struct.consumer != expected:
            raise ConfigError(
                f"the {struct.PRIMARY_TYPE} names consumer {struct.consumer}, not this "
                f"deployment's {contract} {expected}",
                hint=f"build it with consumer=deployment.address({contract!r})",
            )

    # --- Committee and ModelRegistry ------------------------------------------------------------

    def committee_members(self) -> list[str]:
        return list(self.call("Committee", "members"))

    def committee_nonce(self) -> int:
        return self.call("Committee", "nonce")

    def update_committee(self, update: CommitteeUpdate, signatures: Sequence[bytes]) -> TxResult:
        return self.transact(
            "Committee",
            "update",
            list(update.signers),
            list(update.powers),
            update.nonce,
            list(signatures),
        )

    def registry_nonce(self) -> int:
        return self.call("ModelRegistry", "nonce")

    def register_model(
        self, registration: ModelRegistration, signatures: Sequence[bytes]
    ) -> TxResult:
        """Register a model on committee signatures (`registration.nonce` = `registry_nonce()`,
        `registration.consumer` = this deployment's ModelRegistry)."""
        self._check_consumer(registration, "ModelRegistry")
        return self.transact(
            "ModelRegistry",
            "register",
            registration.model_id,
            registration.manifest_hash,
            list(registration.shard_hashes),
            registration.nonce,
            list(signatures),
        )

    def dev_register_model(
        self, model_id: bytes, manifest_hash: bytes, shard_hashes: Sequence[bytes]
    ) -> TxResult:
        """Devnet shortcut (only the dev owner, only where one was set at deployment)."""
        return self.transact(
            "ModelRegistry", "devRegister", model_id, manifest_hash, list(shard_hashes)
        )

    def manifest_hash_of(self, model_id: bytes) -> bytes:
        return bytes(self.call("ModelRegistry", "manifestHashOf", model_id))

    def shard_hashes_of(self, model_id: bytes) -> list[bytes]:
        return [bytes(h) for h in self.call("ModelRegistry", "shardHashesOf", model_id)]


def _charges(
    query_ids: Sequence[bytes], fees: Sequence[int], payers: Sequence[str], debits: Sequence[int]
) -> tuple[list[bytes], list[int], list[str], list[int]]:
    """The `Charges` tuple of postPayoutRoot / disputeRoot (payers checksummed for web3)."""
    return (list(query_ids), list(fees), [as_address(p, "payer") for p in payers], list(debits))


def _commitment_tuple(c: Commitment) -> tuple[bytes, int, int, bytes, int]:
    return (c.session, c.step, c.shard, c.commitment, c.signed_at)


def _reveal_tuple(r: Reveal) -> tuple[bytes, int, int, bytes, bytes, bytes, bytes, int]:
    return (
        r.session,
        r.step,
        r.shard,
        r.manifest_hash,
        r.input_hash,
        r.output_hash,
        r.salt,
        r.signed_at,
    )


def rpc_error(error: Web3RPCError, rpc_url: str, what: str) -> PlanetError:
    message = str(error.message if hasattr(error, "message") else error)
    lowered = message.lower()
    if "insufficient funds" in lowered or ("funds" in lowered and "gas" in lowered):
        return InsufficientFunds(
            f"{what}: insufficient funds for value + gas on {rpc_url}",
            hint="fund the account, or use a dev key on a local anvil",
        )
    if "nonce" in lowered:
        return PlanetError(f"{what}: nonce problem ({message})", code="nonce")
    return PlanetError(f"{what}: the RPC rejected the transaction ({message})", code="rpc_error")
