// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Reveal} from "../libraries/PlanetTypes.sol";

/// @title Hook for a succinct (ZK) proof that a node's computation was wrong.
/// @notice A verifier (e.g. an ezkl-generated one behind an adapter) receives the whole claim the
/// node signed: the slot (session, step, shard), the model (`manifestHash`), the input
/// (`inputHash`) and the output (`outputHash`), plus salt and signing time. It returns true only
/// when `proof` shows that running shard `claim.shard` of that model on that input does NOT give an
/// output hashing to `claim.outputHash`. `FraudProofs` calls it only with a `Reveal` whose node
/// signature it has checked, so a sound verifier can never be used to slash an honest node.
interface IComputationFaultVerifier {
    /// @notice True iff `proof` demonstrates that the node's signed `claim` is wrong.
    function verifyFault(bytes calldata proof, Reveal calldata claim) external view returns (bool);
}
