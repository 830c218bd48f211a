"""The deployment file: where each Planet contract lives on which chain, with its ABI.

Written by `planet contracts deploy` (`deploy.evm.deploy_all`), read by every process that
talks to the contracts:

    {"chain_id", "rpc_url", "deployer", "block", "config", "contracts": {Name: {address, abi}}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_utils import to_checksum_address

from protocol.errors import ConfigError


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
                f"no deployment file at {path}",
                hint="start a devnet (`planet devnet up`: every command finds it), or pass "
                "--deployment FILE (`planet contracts deploy` writes one)",
            ) from None
        except (KeyError, ValueError, TypeError) as error:
            raise ConfigError(f"{path}: not a Planet deployment file ({error})") from None

    def address(self, name: str) -> str:
        if name not in self.contracts:
            raise ConfigError(f"the deployment has no contract {name!r}")
        return self.contracts[name].address
