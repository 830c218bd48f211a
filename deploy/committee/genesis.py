"""What every validator's `genesis.json` holds: chain id, vote extensions, the Planet app's state.

`app_state` maps each CometBFT validator to its operator's EVM address (the operator keys sign
the committee's EIP-712 statements); `committee_members` reads the powers back to deploy the
`Committee` contract with exactly those, and `set_genesis_evm` writes the deployed contracts'
addresses (and the served models) into every genesis before the first start.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from deploy.committee.network import Network
from protocol.errors import UsageError
from protocol.numerics import NUMERICS

DEFAULT_EPOCH_LENGTH = 100
DEFAULT_EVM_CHAIN_ID = 31337
# Where the devnet's settlement contract will live is not known at init time: zero until deployed.
DEFAULT_COMMITTEE_ADDRESS = "0x" + "00" * 20
VOTE_EXTENSIONS_ENABLE_HEIGHT = 1


def app_state(
    operators: dict[str, str],
    *,
    epoch_length: int,
    evm_chain_id: int = DEFAULT_EVM_CHAIN_ID,
    committee_address: str = DEFAULT_COMMITTEE_ADDRESS,
) -> dict[str, Any]:
    """The genesis `app_state` of the Planet ABCI app (`abci_app.genesis.Genesis.parse` reads it).

    `operators` maps each CometBFT validator address (uppercase hex) to its operator's EVM
    address; the EVM part is the EIP-712 domain of the committee's verdict signatures. The
    chain accepts registrations announcing this release's numerics only (`numerics`): the
    devnet's verifiers all run this release, so they check every version it accepts.
    """
    return {
        "epoch_length": epoch_length,
        "numerics": [NUMERICS],
        "evm": {"chain_id": evm_chain_id, "committee_address": committee_address},
        "validators": dict(sorted(operators.items())),
    }


def configure_genesis(
    genesis: dict[str, Any], *, chain_id: str, state: dict[str, Any] | None
) -> dict[str, Any]:
    """Genesis with our chain id, vote extensions from height 1 and the app's state."""
    updated = json.loads(json.dumps(genesis))
    updated["chain_id"] = chain_id
    params = updated.setdefault("consensus_params", {})
    params.setdefault("abci", {})["vote_extensions_enable_height"] = str(
        VOTE_EXTENSIONS_ENABLE_HEIGHT
    )
    if state is not None:
        updated["app_state"] = state
    return updated


def committee_members(network: Network) -> list[tuple[str, int]]:
    """(operator address, voting power) per validator, as genesis has them: deploy the
    `Committee` contract with exactly these, so the chain's 2/3 is the contract's 2/3."""
    genesis = json.loads((Path(network.validators[0].home) / "config" / "genesis.json").read_text())
    powers = {v["address"].upper(): int(v["power"]) for v in genesis["validators"]}
    return [(v.operator_address, powers[v.validator_address.upper()]) for v in network.validators]


def set_genesis_evm(
    network: Network,
    *,
    committee_address: str,
    evm_chain_id: int = DEFAULT_EVM_CHAIN_ID,
    fraud_proofs_address: str | None = None,
    models: dict[str, int] | None = None,
    escrow_address: str | None = None,
    retention_epochs: int | None = None,
    credits: dict[str, Any] | None = None,
) -> None:
    """Write the deployed Committee address (and FraudProofs, the verdicts' consumer), the EVM
    chain id and the served models ({model: shard count}) into every validator's genesis; with
    `escrow_address` (the QueryEscrow that consumes payout roots) epoch settlement is on; no
    genesis list names gateways: each binds its committee key to its own payee address on chain
    (`gateway` tx) when it first starts;
    `retention_epochs` (genesis default 10)
    is how many settled epochs keep their records, payout statements and claim proofs
    included; `credits` ({price_wei, layer_tokens}, with an escrow) sells bearer credits.
    Only before the first start."""
    for address in (
        committee_address,
        fraud_proofs_address or committee_address,
        escrow_address or committee_address,
    ):
        if not re.fullmatch(r"0x[0-9a-fA-F]{40}", address):
            raise UsageError(f"not an EVM address: {address!r}")
    for validator in network.validators:
        if (Path(validator.home) / "app.sqlite").exists():
            raise UsageError(
                f"validator{validator.index} has already started: its genesis is fixed",
                hint="re-create the network (`planet committee init --force`)",
            )
    for validator in network.validators:
        path = Path(validator.home) / "config" / "genesis.json"
        genesis = json.loads(path.read_text())
        state = genesis.setdefault("app_state", {})
        state["evm"] = {"chain_id": evm_chain_id, "committee_address": committee_address}
        if fraud_proofs_address is not None:
            state["evm"]["fraud_proofs_address"] = fraud_proofs_address
        if escrow_address is not None:
            state["evm"]["escrow_address"] = escrow_address
        if retention_epochs is not None:
            state["retention_epochs"] = retention_epochs
        if models:
            state["models"] = {name: {"shards": n} for name, n in sorted(models.items())}
        if credits:
            state["credits"] = dict(sorted(credits.items()))
        path.write_text(json.dumps(genesis, indent=2) + "\n")
