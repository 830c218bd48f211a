// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IComputationFaultVerifier} from "../interfaces/IComputationFaultVerifier.sol";
import {Reveal} from "../libraries/PlanetTypes.sol";
import {IHalo2Verifier} from "./IHalo2Verifier.sol";

/// @title EzklFaultVerifier: the FraudProofs fault-verifier hook for one ezkl circuit.
/// @notice The circuit computes one fixed-point operation of shard `shard` of the model whose
/// manifest hashes to `manifestHash` (protocol/zkticket.py, node/verifier/zk/). For such a slot a
/// node signs `inputHash = keccak256(word(in[0]) ‖ … ‖ word(in[n-1]))` and `outputHash` likewise
/// over its output, with `word(v)` the 32-byte big-endian BN254 scalar of the fixed-point integer.
/// A fault proof is `word(in[0..n)) ‖ word(out[0..m)) ‖ halo2Proof`: the circuit's public
/// instances, then the proof. It proves the claim wrong when the instances' input hashes to the
/// signed `inputHash`, their output does NOT hash to the signed `outputHash`, every instance is a
/// canonical scalar, and the generated verifier accepts the proof for those instances.
/// A proof about another input, model or shard is refused (returns false), so it cannot be
/// replayed against a different claim; the node's signature on the reveal binds the slot.
contract EzklFaultVerifier is IComputationFaultVerifier {
    /// @notice BN254 scalar field modulus (instances must be below it).
    uint256 public constant FIELD_MODULUS =
        21888242871839275222246405745257275088548364400416034343698204186575808495617;

    /// @notice The ezkl-generated verifier of this circuit's verifying key.
    IHalo2Verifier public immutable halo2Verifier;
    /// @notice The model whose operation the circuit computes (its manifest hash).
    bytes32 public immutable manifestHash;
    /// @notice The shard whose operation the circuit computes.
    uint32 public immutable shard;
    /// @notice Public input values of the circuit (the operation's input length).
    uint256 public immutable inputCount;
    /// @notice Public output values of the circuit (the operation's output length).
    uint256 public immutable outputCount;

    error ZeroVerifier();
    error EmptyCircuit(uint256 inputCount, uint256 outputCount);

    /// @param halo2Verifier_ Generated verifier of the circuit.
    /// @param manifestHash_ Model the circuit belongs to.
    /// @param shard_ Shard whose operation the circuit computes.
    /// @param inputCount_ Number of public input values.
    /// @param outputCount_ Number of public output values.
    constructor(
        IHalo2Verifier halo2Verifier_,
        bytes32 manifestHash_,
        uint32 shard_,
        uint256 inputCount_,
        uint256 outputCount_
    ) {
        if (address(halo2Verifier_) == address(0)) revert ZeroVerifier();
        if (inputCount_ == 0 || outputCount_ == 0) revert EmptyCircuit(inputCount_, outputCount_);
        halo2Verifier = halo2Verifier_;
        manifestHash = manifestHash_;
        shard = shard_;
        inputCount = inputCount_;
        outputCount = outputCount_;
    }

    /// @notice True iff `proof` shows that the circuit, on the input `claim` signed, does not give
    /// the output `claim` signed (see the contract notice for the layout of `proof`).
    /// @param proof Instances (32-byte words, inputs then outputs) followed by the halo2 proof.
    /// @param claim The node-signed reveal judged (its signature is checked by FraudProofs).
    /// @return fault Whether the claim is proven wrong.
    function verifyFault(bytes calldata proof, Reveal calldata claim) external view returns (bool fault) {
        if (claim.manifestHash != manifestHash || claim.shard != shard) return false;
        uint256 inputBytes = inputCount * 32;
        uint256 headBytes = inputBytes + outputCount * 32;
        if (proof.length <= headBytes) return false;
        // The proof must be about the input the node signed ...
        if (keccak256(proof[:inputBytes]) != claim.inputHash) return false;
        // ... and give an output other than the one it signed.
        if (keccak256(proof[inputBytes:headBytes]) == claim.outputHash) return false;
        uint256 count = inputCount + outputCount;
        uint256[] memory instances = new uint256[](count);
        uint256 start;
        assembly ("memory-safe") {
            start := proof.offset
        }
        for (uint256 i = 0; i < count; ) {
            uint256 word;
            // In bounds: i * 32 + 32 <= headBytes < proof.length (checked above).
            assembly ("memory-safe") {
                word := calldataload(add(start, shl(5, i)))
            }
            // INVARIANT: a non-canonical word would hash differently from the scalar the verifier
            // reduces it to, faking an output difference.
            if (word >= FIELD_MODULUS) return false;
            instances[i] = word;
            unchecked {
                ++i;
            }
        }
        // The generated verifier reverts on an invalid proof: that is "no fault", not an error.
        try halo2Verifier.verifyProof(proof[headBytes:], instances) returns (bool ok) {
            return ok;
        } catch {
            return false;
        }
    }
}
