// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Offence} from "../libraries/PlanetTypes.sol";

/// @title The slashing entry point `FraudProofs` uses.
interface IStaking {
    /// @notice Slashes `node` for `offence`; half of the slashed amount is credited to `challenger`,
    /// the rest burned. Only callable by the `FraudProofs` contract. Returns the slashed amount.
    function slash(address node, Offence offence, address challenger) external returns (uint256 slashed);
}
