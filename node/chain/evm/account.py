"""`PlanetChain`: one account on a Planet deployment, with a binding per contract.

    chain = PlanetChain(Deployment.load(path), private_key)
    chain.staking.stake(ROLE_COMPUTE, amount_wei)
    chain.escrow.deposit(query_id, model_id, fee_cap_wei)
    chain.fraud_proofs.prove_reveal_mismatch(commitment, sig, reveal, sig)
    chain.committee.domain(), chain.registry.shard_hashes_of(model_id)

It is the account's `Sender` (balance, nonce, fees, receipts, decoded reverts), and the five
bindings all send through it, so one nonce counter covers every contract: use one instance per
account and thread.
"""

from __future__ import annotations

from node.chain.evm.committee import Committee
from node.chain.evm.deployment import Deployment
from node.chain.evm.escrow import QueryEscrow
from node.chain.evm.fraud_proofs import FraudProofs
from node.chain.evm.registry import ModelRegistry
from node.chain.evm.sender import Sender
from node.chain.evm.staking import Staking


class PlanetChain(Sender):
    """One account's sender and its bindings to the Planet contracts."""

    def __init__(
        self,
        deployment: Deployment,
        private_key: str | bytes,
        *,
        rpc_url: str | None = None,
        receipt_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(
            deployment, private_key, rpc_url=rpc_url, receipt_timeout_s=receipt_timeout_s
        )
        self.staking = Staking(self)
        self.escrow = QueryEscrow(self)
        self.fraud_proofs = FraudProofs(self)
        self.committee = Committee(self)
        self.registry = ModelRegistry(self)
