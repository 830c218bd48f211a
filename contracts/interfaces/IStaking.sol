// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Offence} from "../libraries/PlanetTypes.sol";

/// @title The entry points `FraudProofs` uses.
interface IStaking {
    /// @notice Slashes `bps` basis points of `node`'s current stake for `offence`; half of the
    /// slashed amount (rounded down) is credited to `challenger`, the rest burned. Only callable by
    /// the `FraudProofs` contract. Returns the slashed amount.
    function slash(address node, Offence offence, uint256 bps, address challenger) external returns (uint256 slashed);

    /// @notice Keeps `node`'s stake from being withdrawn before `until` (a fraud window about its
    /// signed work is open until then). Only callable by `FraudProofs`; never shortens a lock.
    /// Returns the lock in force afterwards.
    function lockUntil(address node, uint256 until) external returns (uint256 lockedUntil);
}
