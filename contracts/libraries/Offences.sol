// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Offence} from "./PlanetTypes.sol";

/// @title Slashing schedule: the share of a stake each offence costs, in basis points.
library Offences {
    /// @notice Basis points denominator (100 %).
    uint256 internal constant BPS = 10_000;

    /// @notice Thrown for `Offence.None` or a value outside the enum.
    error InvalidOffence(uint8 offence);

    /// @notice Slashed share of the stake for `offence`: mismatch, equivocation and collusion 100 %,
    /// failed verification 50 %, timeout 5 %.
    function slashBps(Offence offence) internal pure returns (uint256) {
        if (offence == Offence.CommitRevealMismatch || offence == Offence.Equivocation || offence == Offence.Collusion) {
            return BPS;
        }
        if (offence == Offence.FailedVerification) return 5_000;
        if (offence == Offence.Timeout) return 500;
        revert InvalidOffence(uint8(offence));
    }

    /// @notice Converts a signed `uint8` into an `Offence`, rejecting `None` and out-of-range values.
    function fromUint8(uint8 value) internal pure returns (Offence) {
        // INVARIANT: only offences 1..5 are slashable.
        if (value == 0 || value > uint8(type(Offence).max)) revert InvalidOffence(value);
        return Offence(value);
    }
}
