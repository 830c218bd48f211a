// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title The committee's signature check, used by every contract that moves money on its word.
interface ICommittee {
    /// @notice A signature at `index` is malformed or does not recover (wrong length, high s, bad v).
    error InvalidSignature(uint256 index);
    /// @notice The signer recovered at `index` is not strictly greater than the previous one.
    error SignersNotSorted(uint256 index);
    /// @notice A recovered signer is not a committee member.
    error UnknownSigner(address signer);
    /// @notice The signers hold less than two thirds of the total voting power.
    error InsufficientPower(uint256 signed, uint256 total);

    /// @notice Reverts unless `sigs` carry >= 2/3 of the committee's power over the EIP-712 digest of
    /// `structHash` in the committee's domain.
    function verify(bytes32 structHash, bytes[] calldata sigs) external view;
}
