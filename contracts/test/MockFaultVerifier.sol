// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IComputationFaultVerifier} from "../interfaces/IComputationFaultVerifier.sol";
import {Reveal} from "../libraries/PlanetTypes.sol";

/// @title Test-only: a SOUND fault verifier for a toy model whose correct output hash is
/// `keccak256(abi.encode(manifestHash, shard, inputHash))`. It needs no proof (it recomputes the toy
/// model) but requires `proof == "fault"` so tests can also exercise a rejected proof.
contract MockFaultVerifier is IComputationFaultVerifier {
    function verifyFault(bytes calldata proof, Reveal calldata claim) external pure returns (bool) {
        if (keccak256(proof) != keccak256("fault")) return false;
        return claim.outputHash != correctOutput(claim.manifestHash, claim.shard, claim.inputHash);
    }

    function correctOutput(bytes32 manifestHash, uint32 shard, bytes32 inputHash) public pure returns (bytes32) {
        return keccak256(abi.encode(manifestHash, shard, inputHash));
    }
}
