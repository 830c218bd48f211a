// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IHalo2Verifier} from "../zk/IHalo2Verifier.sol";

/// @title Test-only stand-in for an ezkl-generated verifier: accepts exactly the proof bytes
/// "valid", reverts on "revert", returns false otherwise; records nothing.
contract MockHalo2Verifier is IHalo2Verifier {
    function verifyProof(bytes calldata proof, uint256[] calldata instances) external pure returns (bool) {
        if (keccak256(proof) == keccak256("revert")) revert("invalid proof");
        return instances.length > 0 && keccak256(proof) == keccak256("valid");
    }
}
