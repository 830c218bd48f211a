"""Deploys the ZK fault verifier of a built circuit: the ezkl-generated `Halo2Verifier` (compiled
at build time, never committed) and the `EzklFaultVerifier` adapter in front of it, whose
address is what `DeployConfig(fault_verifier=...)` wires into Staking/FraudProofs.

    zk = deploy_fault_verifier(rpc_url, key, circuit)
    config = DeployConfig.devnet(committee, fault_verifier=zk.adapter)

Used by bench/zk.py and the ZK tests only: no deployment of the product wires it in (the
default `fault_verifier` is none). The ticket's soundness against a modified prover is not
established (docs/verification.md §8), so it is not offered as a fraud proof.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account

from deploy.anvil import REPO_ROOT
from deploy.evm import Progress, _Deployer, compile_contracts, load_artifact
from node.chain.evm.rpc import connect, rpc_guard
from node.verifier.zk.build import BuiltCircuit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZkVerifierDeployment:
    halo2: str  # Halo2Verifier address
    adapter: str  # EzklFaultVerifier address (the FraudProofs fault verifier)


def deploy_fault_verifier(
    rpc_url: str,
    deployer_key: str | bytes,
    circuit: BuiltCircuit,
    *,
    progress: Progress = lambda line: log.info("%s", line),
    root: Path = REPO_ROOT,
) -> ZkVerifierDeployment:
    w3 = connect(rpc_url)
    key = Account.from_key(deployer_key)
    chain_id = rpc_guard(lambda: w3.eth.chain_id, rpc_url)
    compile_contracts(root)
    deployer = _Deployer(w3, rpc_url, key, chain_id, progress)
    deployer.nonce = rpc_guard(
        lambda: w3.eth.get_transaction_count(key.address, "pending"), rpc_url
    )
    halo2 = deployer.deploy("Halo2Verifier", circuit.verifier, [])
    adapter = deployer.deploy(
        "EzklFaultVerifier",
        load_artifact("EzklFaultVerifier", root),
        [halo2, circuit.manifest_hash, circuit.shard, circuit.n_inputs, circuit.n_outputs],
    )
    return ZkVerifierDeployment(halo2=halo2, adapter=adapter)
