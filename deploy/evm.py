"""Deploy the settlement contracts to any EVM RPC and write the deployment file.

    config = DeployConfig.devnet(committee=((addr, 1), ...))
    deployment = deploy_all(rpc_url, deployer_key, config, progress=print)
    deployment.save("deployment.json")   # {chain_id, rpc_url, deployer, block, config, contracts}

Contracts come from Hardhat's artifacts (`artifacts/contracts/**/<Name>.json`); when they are
missing or older than a source file, `npx hardhat compile` runs first (a second or two when up
to date). Deployment order follows the dependencies: Committee → Staking (whose constructor creates
FraudProofs, its only slasher) → QueryEscrow → ModelRegistry. Every transaction waits
for its receipt; a failed deployment raises instead of leaving a half-written file.

Defaults follow docs/contracts.md: stakes 1 / 0.5 ether, a 60 s challenge window on the devnet
(24 h elsewhere), unstake delay = window + 1, refund timeout 600 s; `ModelRegistry` gets a dev
owner (the deployer) on chain id 31337 only.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_utils import to_checksum_address
from web3 import Web3
from web3.exceptions import ContractLogicError, Web3RPCError

from deploy.anvil import DEVNET_CHAIN_ID, REPO_ROOT
from node.chain.evm.deployment import DeployedContract, Deployment
from node.chain.evm.errors import RevertDecoder, revert_data, rpc_error
from node.chain.evm.rpc import connect, rpc_guard
from protocol.eip712 import as_address
from protocol.errors import ConfigError, PlanetError, ProtocolError, UsageError

log = logging.getLogger(__name__)

ETHER = 10**18
DEPLOY_ORDER = ("Committee", "Staking", "FraudProofs", "QueryEscrow", "ModelRegistry")
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class DeployConfig:
    """Constructor arguments of the whole deployment (amounts in wei, durations in seconds)."""

    committee: tuple[tuple[str, int], ...]  # (member address, voting power), any order
    compute_min_stake_wei: int = 1 * ETHER
    verifier_min_stake_wei: int = ETHER // 2
    relay_min_stake_wei: int = ETHER // 10
    challenge_window_s: int = 60
    unstake_delay_s: int | None = None  # None: challenge window + 1 (must be strictly greater)
    refund_timeout_s: int = 600
    dev_owner: str | None = None  # ModelRegistry dev owner; only honoured on chain 31337
    fault_verifier: str | None = None  # IComputationFaultVerifier (ZK hook); None disables it

    def __post_init__(self) -> None:
        if not self.committee:
            raise UsageError("the committee needs at least one member")
        try:
            members = [as_address(a, "committee member") for a, _ in self.committee]
        except ProtocolError as error:
            raise UsageError(error.message) from None
        if len(set(members)) != len(members):
            raise UsageError("a committee member is listed twice")
        if any(p <= 0 or p >= 2**64 for _, p in self.committee):
            raise UsageError("committee powers are 1 .. 2^64-1")
        if self.challenge_window_s <= 0 or self.refund_timeout_s <= 0:
            raise UsageError("the challenge window and refund timeout must be positive")
        if self.unstake_delay_s is not None and self.unstake_delay_s <= self.challenge_window_s:
            raise UsageError("the unstake delay must be longer than the challenge window")

    @property
    def unstake_delay(self) -> int:
        return (
            self.unstake_delay_s
            if self.unstake_delay_s is not None
            else self.challenge_window_s + 1
        )

    @classmethod
    def devnet(cls, committee: Sequence[tuple[str, int]], **overrides: Any) -> DeployConfig:
        return cls(committee=tuple(committee), **overrides)

    @classmethod
    def production(cls, committee: Sequence[tuple[str, int]], **overrides: Any) -> DeployConfig:
        return cls(committee=tuple(committee), challenge_window_s=24 * 3600, **overrides)

    def sorted_committee(self) -> tuple[list[str], list[int]]:
        """Members ascending by address (the contract requires it) and their powers."""
        pairs = sorted(
            ((to_checksum_address(a), p) for a, p in self.committee), key=lambda x: int(x[0], 16)
        )
        return [a for a, _ in pairs], [p for _, p in pairs]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["committee"] = [[a, p] for a, p in self.committee]
        out["unstake_delay_s"] = self.unstake_delay
        return out


def parse_committee(values: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """`ADDR:POWER` strings (POWER defaults to 1) → ((address, power), ...)."""
    members: list[tuple[str, int]] = []
    for value in values:
        address, _, power = value.partition(":")
        try:
            checked = as_address(address, "member")
        except ProtocolError as error:
            raise UsageError(f"--committee {value!r}: {error.message}", hint="ADDR:POWER") from None
        try:
            members.append((checked, int(power or "1")))
        except ValueError:
            raise UsageError(f"--committee {value!r}: POWER must be an integer") from None
    return tuple(members)


# --- artifacts ----------------------------------------------------------------------------------


def artifacts_dir(root: Path = REPO_ROOT) -> Path:
    return root / "artifacts" / "contracts"


COMPILE_STAMP = ".planet-compiled"  # in artifacts/: when `hardhat compile` last succeeded


def _artifacts_stale(root: Path) -> bool:
    """True when some contracts/**/X.sol changed after both its artifacts and the last
    successful compile (hardhat skips content-identical files, so a touched file keeps its
    old artifact: the stamp keeps that from forcing a compile on every deploy)."""
    sources = list((root / "contracts").rglob("*.sol"))
    if not sources:
        raise ConfigError(f"no Solidity sources under {root / 'contracts'}")
    stamp = root / "artifacts" / COMPILE_STAMP
    stamp_time = stamp.stat().st_mtime if stamp.is_file() else 0.0
    for source in sources:
        built = artifacts_dir(root) / source.relative_to(root / "contracts")
        # A file with only structs/enums (no contract) has no artifact: the stamp decides.
        times = [p.stat().st_mtime for p in built.glob("*.json")] if built.is_dir() else []
        if max([*times, stamp_time]) < source.stat().st_mtime:
            return True
    return False


def compile_contracts(root: Path = REPO_ROOT, *, force: bool = False) -> None:
    """`npx hardhat compile` when artifacts are missing or stale (or `force`)."""
    if not force and not _artifacts_stale(root):
        return
    if not (root / "node_modules" / "hardhat").is_dir():
        raise ConfigError(
            "Hardhat is not installed (node_modules/hardhat missing)",
            hint="run `bash deploy/setup.sh` (npm ci) first",
        )
    npx = shutil.which("npx")
    if npx is None:
        raise ConfigError("npx not found", hint="install Node.js 18+ (deploy/setup.sh needs it)")
    log.info("compiling contracts with hardhat")
    started = time.monotonic()
    result = subprocess.run(
        [npx, "hardhat", "compile", "--quiet"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise ConfigError(
            f"`npx hardhat compile` failed:\n{(result.stderr or result.stdout).strip()[-3000:]}"
        )
    (root / "artifacts" / COMPILE_STAMP).touch()
    log.info("contracts compiled in %.1f s", time.monotonic() - started)


def load_artifact(name: str, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The Hardhat artifact (abi, bytecode) of contract `name`."""
    import json

    matches = [
        p for p in artifacts_dir(root).rglob(f"{name}.json") if p.parent.name == f"{name}.sol"
    ]
    if not matches:
        raise ConfigError(
            f"no compiled artifact for {name}",
            hint="run `npx hardhat compile` (deploy/test.sh does it before the tests)",
        )
    artifact = json.loads(matches[0].read_text())
    if not artifact.get("bytecode") or artifact["bytecode"] == "0x":
        raise ConfigError(f"{name} has no bytecode (an interface or abstract contract?)")
    return artifact


# --- deployment ---------------------------------------------------------------------------------


@dataclass
class _Deployer:
    w3: Web3
    rpc_url: str
    key: Any
    chain_id: int
    progress: Progress
    decoder: RevertDecoder = field(default_factory=lambda: RevertDecoder([]))
    nonce: int = 0

    def deploy(self, name: str, artifact: dict[str, Any], args: Sequence[Any]) -> str:
        factory = self.w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        self.decoder = RevertDecoder([artifact["abi"]])
        try:
            tx = factory.constructor(*args).build_transaction(
                {"from": self.key.address, "nonce": self.nonce, "chainId": self.chain_id}
            )
        except ContractLogicError as error:
            raise self.decoder.exception(
                revert_data(error), contract=name, function="constructor"
            ) from None
        except Web3RPCError as error:
            raise rpc_error(error, self.rpc_url, f"deploying {name}") from None
        receipt = self._send(tx, f"deploying {name}")
        address = to_checksum_address(receipt["contractAddress"])
        self.progress(f"  {name:<14} {address}  (gas {receipt['gasUsed']})")
        return address

    def transact(self, name: str, contract: Any, function: str, *args: Any) -> None:
        fn = getattr(contract.functions, function)(*args)
        try:
            tx = fn.build_transaction(
                {"from": self.key.address, "nonce": self.nonce, "chainId": self.chain_id}
            )
        except ContractLogicError as error:
            raise self.decoder.exception(
                revert_data(error), contract=name, function=function
            ) from None
        self._send(tx, f"{name}.{function}")

    def _send(self, tx: dict[str, Any], what: str) -> Any:
        signed = self.key.sign_transaction(tx)
        try:
            tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        except Web3RPCError as error:
            raise rpc_error(error, self.rpc_url, what) from None
        self.nonce += 1
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.02)
        if receipt["status"] != 1:
            raise PlanetError(f"{what}: transaction {Web3.to_hex(tx_hash)} failed")
        return receipt


# Constructor parameters are matched by name (lower-cased, underscores dropped), so the plan
# survives a reordering of parameters; an unknown name is a clear error, never a guess.
def _parameter_values(
    config: DeployConfig, addresses: dict[str, str], chain_id: int, deployer: str
) -> dict[str, Any]:
    signers, powers = config.sorted_committee()
    dev_owner = ZERO_ADDRESS
    if chain_id == DEVNET_CHAIN_ID:
        dev_owner = to_checksum_address(config.dev_owner or deployer)
    values: dict[str, Any] = {
        "signers": signers,
        "powers": powers,
        "faultverifier": to_checksum_address(config.fault_verifier or ZERO_ADDRESS),
        "mincompute": config.compute_min_stake_wei,
        "mincomputestake": config.compute_min_stake_wei,
        "minverifier": config.verifier_min_stake_wei,
        "minverifierstake": config.verifier_min_stake_wei,
        "minrelay": config.relay_min_stake_wei,
        "minrelaystake": config.relay_min_stake_wei,
        "challengewindow": config.challenge_window_s,
        "unstakedelay": config.unstake_delay,
        "refundtimeout": config.refund_timeout_s,
        "devowner": dev_owner,
    }
    for name, address in addresses.items():
        values[name.lower()] = address
    return values


def constructor_args(
    name: str,
    abi: Sequence[dict[str, Any]],
    config: DeployConfig,
    addresses: dict[str, str],
    chain_id: int,
    deployer: str,
) -> list[Any]:
    """Constructor arguments of `name` from its ABI's parameter names."""
    values = _parameter_values(config, addresses, chain_id, deployer)
    inputs = next((e["inputs"] for e in abi if e.get("type") == "constructor"), [])
    args: list[Any] = []
    for item in inputs:
        key = item["name"].replace("_", "").lower()
        if key not in values:
            raise ConfigError(
                f"deploy/evm.py has no value for {name}'s constructor parameter {item['name']!r}",
                hint="the contracts changed: extend _parameter_values in deploy/evm.py",
            )
        args.append(values[key])
    return args


def deploy_all(
    rpc_url: str,
    deployer_key: str | bytes,
    config: DeployConfig,
    *,
    expected_chain_id: int | None = None,
    progress: Progress = lambda line: log.info("%s", line),
    root: Path = REPO_ROOT,
) -> Deployment:
    """Check the chain and the deployer's funds, compile if needed, deploy every contract in
    order, and return the deployment (not saved)."""
    w3 = connect(rpc_url)
    key = Account.from_key(deployer_key)
    chain_id, balance, block = rpc_guard(
        lambda: (w3.eth.chain_id, w3.eth.get_balance(key.address), w3.eth.block_number), rpc_url
    )
    if expected_chain_id is not None and chain_id != expected_chain_id:
        raise ConfigError(
            f"{rpc_url} is chain {chain_id}, expected {expected_chain_id}",
            hint="check --rpc / --chain-id",
        )
    if balance == 0:
        raise PlanetError(
            f"deployer {key.address} has no funds on chain {chain_id}",
            hint="fund it, or pass --key for a funded account",
            code="insufficient_funds",
        )
    compile_contracts(root)  # after the cheap checks: a wrong RPC fails before any compile
    artifacts = {name: load_artifact(name, root) for name in DEPLOY_ORDER}
    progress(f"deploying to {rpc_url} (chain {chain_id}) from {key.address}")
    deployer = _Deployer(w3, rpc_url, key, chain_id, progress)
    deployer.nonce = rpc_guard(
        lambda: w3.eth.get_transaction_count(key.address, "pending"), rpc_url
    )
    started = time.monotonic()
    addresses = rpc_guard(
        lambda: _deploy_in_order(deployer, artifacts, config, chain_id, key.address), rpc_url
    )
    progress(f"deployed {len(addresses)} contracts in {time.monotonic() - started:.2f} s")
    return Deployment(
        chain_id=chain_id,
        rpc_url=rpc_url,
        deployer=key.address,
        block=block + 1,
        contracts={
            name: DeployedContract(addresses[name], artifacts[name]["abi"]) for name in DEPLOY_ORDER
        },
        config=config.to_json(),
    )


def _deploy_in_order(
    deployer: _Deployer,
    artifacts: dict[str, dict[str, Any]],
    config: DeployConfig,
    chain_id: int,
    deployer_address: str,
) -> dict[str, str]:
    """Committee, Staking (its constructor creates FraudProofs, the only slasher), QueryEscrow,
    ModelRegistry — each constructor gets the addresses deployed before it."""
    addresses: dict[str, str] = {}
    for name in DEPLOY_ORDER:
        if name == "FraudProofs":
            staking = deployer.w3.eth.contract(
                address=addresses["Staking"], abi=artifacts["Staking"]["abi"]
            )
            addresses[name] = to_checksum_address(staking.functions.fraudProofs().call())
            deployer.progress(f"  {name:<14} {addresses[name]}  (created by Staking)")
            continue
        abi = artifacts[name]["abi"]
        args = constructor_args(name, abi, config, addresses, chain_id, deployer_address)
        addresses[name] = deployer.deploy(name, artifacts[name], args)
    return addresses


def with_overrides(config: DeployConfig, **changes: Any) -> DeployConfig:
    return replace(config, **changes)
