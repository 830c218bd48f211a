// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Planet's shared on-chain vocabulary: roles, offences and the typed structs nodes and the
/// committee sign. Encodings and numbering are normative (docs/contracts.md).

/// @notice Staking role of a node. Numbering is part of the interface: 0, 1, 2.
enum Role {
    None,
    Compute,
    Verifier
}

/// @notice Provable misbehaviour. Numbering is part of the interface: 0..5.
enum Offence {
    None,
    CommitRevealMismatch,
    Equivocation,
    FailedVerification,
    Timeout,
    Collusion
}

/// @notice Node-signed commitment to an output: `commitment = keccak256(abi.encode(session, step,
/// shard, outputHash, salt))`.
struct Commitment {
    bytes32 session;
    uint64 step;
    uint32 shard;
    bytes32 commitment;
}

/// @notice Node-signed opening of a commitment.
struct Reveal {
    bytes32 session;
    uint64 step;
    uint32 shard;
    bytes32 outputHash;
    bytes32 salt;
}

/// @notice Committee-signed judgement that `node` committed `offence`; `nonce` is single-use.
struct Verdict {
    address node;
    uint8 offence;
    bytes32 evidenceHash;
    address challenger;
    uint64 nonce;
}

/// @notice A committee-signed payout statement for one epoch, as needed to prove equivocation.
struct PayoutStatement {
    bytes32 root;
    uint256 total;
    bytes32 queriesHash;
}
