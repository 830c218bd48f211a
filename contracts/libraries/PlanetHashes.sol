// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Commitment, Reveal, Verdict} from "./PlanetTypes.sol";

/// @title EIP-712 type hashes and struct hashes of every struct Planet signs, plus the payout Merkle
/// leaf. The type strings are normative (docs/contracts.md) and pinned by tests/vectors/*.json.
library PlanetHashes {
    bytes32 internal constant COMMITTEE_UPDATE_TYPEHASH =
        keccak256("CommitteeUpdate(address[] signers,uint256[] powers,uint64 nonce)");
    bytes32 internal constant VERDICT_TYPEHASH = keccak256(
        "Verdict(address node,uint8 offence,bytes32 evidenceHash,address challenger,uint64 nonce,address consumer)"
    );
    bytes32 internal constant PAYOUT_ROOT_TYPEHASH =
        keccak256("PayoutRoot(uint64 epoch,bytes32 root,uint256 total,bytes32 queriesHash,address consumer)");
    bytes32 internal constant MODEL_REGISTRATION_TYPEHASH = keccak256(
        "ModelRegistration(bytes32 modelId,bytes32 manifestHash,bytes32[] shardHashes,uint64 nonce,address consumer)"
    );
    bytes32 internal constant COMMITMENT_TYPEHASH =
        keccak256("Commitment(bytes32 session,uint64 step,uint32 shard,bytes32 commitment,uint64 signedAt)");
    bytes32 internal constant REVEAL_TYPEHASH = keccak256(
        "Reveal(bytes32 session,uint64 step,uint32 shard,bytes32 manifestHash,bytes32 inputHash,bytes32 outputHash,bytes32 salt,uint64 signedAt)"
    );

    function committeeUpdate(address[] memory signers, uint256[] memory powers, uint64 nonce)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(
            abi.encode(
                COMMITTEE_UPDATE_TYPEHASH,
                keccak256(abi.encodePacked(signers)),
                keccak256(abi.encodePacked(powers)),
                nonce
            )
        );
    }

    function verdict(Verdict memory v) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(VERDICT_TYPEHASH, v.node, v.offence, v.evidenceHash, v.challenger, v.nonce, v.consumer)
        );
    }

    /// @param consumer The `QueryEscrow` the statement is for.
    function payoutRoot(uint64 epoch, bytes32 root, uint256 total, bytes32 queriesHash_, address consumer)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(PAYOUT_ROOT_TYPEHASH, epoch, root, total, queriesHash_, consumer));
    }

    /// @param consumer The `ModelRegistry` the registration is for.
    function modelRegistration(
        bytes32 modelId,
        bytes32 manifestHash,
        bytes32[] memory shardHashes,
        uint64 nonce,
        address consumer
    ) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                MODEL_REGISTRATION_TYPEHASH,
                modelId,
                manifestHash,
                keccak256(abi.encodePacked(shardHashes)),
                nonce,
                consumer
            )
        );
    }

    function commitment(Commitment memory c) internal pure returns (bytes32) {
        return keccak256(abi.encode(COMMITMENT_TYPEHASH, c.session, c.step, c.shard, c.commitment, c.signedAt));
    }

    function reveal(Reveal memory r) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                REVEAL_TYPEHASH,
                r.session,
                r.step,
                r.shard,
                r.manifestHash,
                r.inputHash,
                r.outputHash,
                r.salt,
                r.signedAt
            )
        );
    }

    /// @notice The value a node commits to: keccak256(abi.encode(session, step, shard, outputHash, salt)).
    function commitmentValue(Reveal memory r) internal pure returns (bytes32) {
        return keccak256(abi.encode(r.session, r.step, r.shard, r.outputHash, r.salt));
    }

    /// @notice `keccak256(abi.encode(queryIds, fees, payers, gateways, debits))`, bound into every
    /// `PayoutRoot`: the per-query fees and the per-(payer, gateway) prepaid debits an epoch charges.
    function queriesHash(
        bytes32[] calldata queryIds,
        uint256[] calldata fees,
        address[] calldata payers,
        address[] calldata gateways,
        uint256[] calldata debits
    ) internal pure returns (bytes32) {
        return keccak256(abi.encode(queryIds, fees, payers, gateways, debits));
    }

    /// @notice OpenZeppelin StandardMerkleTree leaf of (uint64 epoch, address account, uint256 amount).
    function payoutLeaf(uint64 epoch, address account, uint256 amount) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(epoch, account, amount))));
    }
}
