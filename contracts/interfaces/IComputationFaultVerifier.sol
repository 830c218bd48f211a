// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Hook for a succinct (ZK) proof that a node's computation was wrong.
/// @notice A verifier (e.g. an ezkl-generated one) returns true when `proof` shows that the correct
/// output of the proven computation does NOT hash to `claimedOutputHash`. `FraudProofs` calls it
/// for a node-signed `Reveal` and slashes `Offence.FailedVerification` when it returns true.
interface IComputationFaultVerifier {
    /// @notice True iff `proof` demonstrates that `claimedOutputHash` is not the computation's output.
    function verifyFault(bytes calldata proof, bytes32 claimedOutputHash) external view returns (bool);
}
