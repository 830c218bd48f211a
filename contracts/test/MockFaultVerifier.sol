// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IComputationFaultVerifier} from "../interfaces/IComputationFaultVerifier.sol";

/// @title Test-only: a fault verifier that accepts exactly the proof `keccak256(claimedOutputHash)`.
contract MockFaultVerifier is IComputationFaultVerifier {
    function verifyFault(bytes calldata proof, bytes32 claimedOutputHash) external pure returns (bool) {
        return keccak256(proof) == keccak256(abi.encodePacked(keccak256(abi.encodePacked(claimedOutputHash))));
    }
}
