// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {PlanetHashes} from "../libraries/PlanetHashes.sol";
import {Charges, Commitment, Reveal, Verdict} from "../libraries/PlanetTypes.sol";

/// @title Test-only: exposes the production hashing code (PlanetHashes, OZ ECDSA/MerkleProof) so the
/// golden vectors in tests/vectors/ can be checked against it, for any domain.
contract EIP712Harness {
    bytes32 private constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");

    function domainSeparator(string calldata name, string calldata version, uint256 chainId, address verifyingContract)
        external
        pure
        returns (bytes32)
    {
        return keccak256(
            abi.encode(DOMAIN_TYPEHASH, keccak256(bytes(name)), keccak256(bytes(version)), chainId, verifyingContract)
        );
    }

    function typeHashes() external pure returns (bytes32[6] memory) {
        return [
            PlanetHashes.COMMITTEE_UPDATE_TYPEHASH,
            PlanetHashes.VERDICT_TYPEHASH,
            PlanetHashes.PAYOUT_ROOT_TYPEHASH,
            PlanetHashes.MODEL_REGISTRATION_TYPEHASH,
            PlanetHashes.COMMITMENT_TYPEHASH,
            PlanetHashes.REVEAL_TYPEHASH
        ];
    }

    function committeeUpdateHash(address[] calldata signers, uint256[] calldata powers, uint64 nonce)
        external
        pure
        returns (bytes32)
    {
        return PlanetHashes.committeeUpdate(signers, powers, nonce);
    }

    function verdictHash(Verdict calldata v) external pure returns (bytes32) {
        return PlanetHashes.verdict(v);
    }

    function payoutRootHash(uint64 epoch, bytes32 root, uint256 total, bytes32 queriesHash_, address consumer)
        external
        pure
        returns (bytes32)
    {
        return PlanetHashes.payoutRoot(epoch, root, total, queriesHash_, consumer);
    }

    function modelRegistrationHash(
        bytes32 modelId,
        bytes32 manifestHash,
        bytes32[] calldata shardHashes,
        uint64 nonce,
        address consumer
    ) external pure returns (bytes32) {
        return PlanetHashes.modelRegistration(modelId, manifestHash, shardHashes, nonce, consumer);
    }

    function commitmentHash(Commitment calldata c) external pure returns (bytes32) {
        return PlanetHashes.commitment(c);
    }

    function revealHash(Reveal calldata r) external pure returns (bytes32) {
        return PlanetHashes.reveal(r);
    }

    function commitmentValue(Reveal calldata r) external pure returns (bytes32) {
        return PlanetHashes.commitmentValue(r);
    }

    function queriesHash(Charges calldata c) external pure returns (bytes32) {
        return PlanetHashes.queriesHash(c.queryIds, c.fees, c.payers, c.gateways, c.debits);
    }

    function digest(bytes32 domainSeparator_, bytes32 structHash) external pure returns (bytes32) {
        return MessageHashUtils.toTypedDataHash(domainSeparator_, structHash);
    }

    function recover(bytes32 digest_, bytes calldata signature) external pure returns (address) {
        return ECDSA.recoverCalldata(digest_, signature);
    }

    function payoutLeaf(uint64 epoch, address account, uint256 amount) external pure returns (bytes32) {
        return PlanetHashes.payoutLeaf(epoch, account, amount);
    }

    function verifyProof(bytes32[] calldata proof, bytes32 root, bytes32 leaf) external pure returns (bool) {
        return MerkleProof.verifyCalldata(proof, root, leaf);
    }
}
