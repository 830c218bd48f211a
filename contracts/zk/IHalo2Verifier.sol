// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title The entry point of an ezkl-generated `Halo2Verifier` (generated at build time from our
/// circuit's verifying key; never committed). It returns true for a valid proof and reverts (or
/// returns false) otherwise.
interface IHalo2Verifier {
    /// @notice Checks `proof` for the public `instances` (canonical BN254 scalars).
    function verifyProof(bytes calldata proof, uint256[] calldata instances) external view returns (bool);
}
