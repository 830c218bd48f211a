"""`ModelRegistry`: which models (manifest hash, shard hashes) the network serves."""

from __future__ import annotations

from collections.abc import Sequence

from node.chain.evm.sender import Binding, TxResult
from protocol.eip712 import ModelRegistration


class ModelRegistry(Binding):
    NAME = "ModelRegistry"

    def nonce(self) -> int:
        return self.call("nonce")

    def register(self, registration: ModelRegistration, signatures: Sequence[bytes]) -> TxResult:
        """Register a model on committee signatures (`registration.nonce` = `nonce()`,
        `registration.consumer` = this deployment's ModelRegistry)."""
        self.require_consumer(registration)
        return self.transact(
            "register",
            registration.model_id,
            registration.manifest_hash,
            list(registration.shard_hashes),
            registration.nonce,
            list(signatures),
        )

    def dev_register(
        self, model_id: bytes, manifest_hash: bytes, shard_hashes: Sequence[bytes]
    ) -> TxResult:
        """Devnet shortcut (only the dev owner, only where one was set at deployment)."""
        return self.transact("devRegister", model_id, manifest_hash, list(shard_hashes))

    def manifest_hash_of(self, model_id: bytes) -> bytes:
        return bytes(self.call("manifestHashOf", model_id))

    def shard_hashes_of(self, model_id: bytes) -> list[bytes]:
        return [bytes(h) for h in self.call("shardHashesOf", model_id)]
