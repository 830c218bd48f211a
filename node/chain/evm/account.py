"""`PlanetChain`: one account on a Planet deployment, with a binding per contract.

    chain = PlanetChain(Deployment.load(path), private_key)
    chain.staking.stake(ROLE_COMPUTE, amount_wei)
    chain.escrow.deposit(query_id, model_id, gateway, fee_cap_wei)
    chain.fraud_proofs.prove_reveal_mismatch(commitment, sig, reveal, sig)
    chain.committee.domain(), chain.registry.shard_hashes_of(model_id)

It is the account's `Sender` (balance, nonce, fees, receipts, decoded reverts), and the five
bindings all send through it, so one nonce counter covers every contract: use one instance per
account and thread.
"""

from __future__ import annotations

from functools import cached_property

from node.chain.evm.committee import Committee
from node.chain.evm.escrow import QueryEscrow
from node.chain.evm.fraud_proofs import FraudProofs
from node.chain.evm.registry import ModelRegistry
from node.chain.evm.sender import Sender
from node.chain.evm.staking import Staking


class PlanetChain(Sender):
    """One account's sender and its bindings to the Planet contracts."""

    @cached_property
    def staking(self) -> Staking:
        return Staking(self)

    @cached_property
    def escrow(self) -> QueryEscrow:
        return QueryEscrow(self)

    @cached_property
    def fraud_proofs(self) -> FraudProofs:
        return FraudProofs(self)

    @cached_property
    def committee(self) -> Committee:
        return Committee(self)

    @cached_property
    def registry(self) -> ModelRegistry:
        return ModelRegistry(self)
