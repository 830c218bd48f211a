"""The devnet's QueryEscrow as a web3 contract, for the e2e tests that read it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def escrow_contract(devnet: dict[str, Any]) -> Any:
    """(web3, the escrow contract) from `planet devnet up`'s deployment record."""
    from web3 import Web3

    deployment = json.loads(Path(devnet["deployment"]).read_text())
    escrow = deployment["contracts"]["QueryEscrow"]
    w3 = Web3(Web3.HTTPProvider(devnet["evm_rpc"]))
    return w3, w3.eth.contract(address=escrow["address"], abi=escrow["abi"])
