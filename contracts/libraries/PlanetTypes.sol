// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Planet's shared on-chain vocabulary: roles, offences and the typed structs nodes and the
/// committee sign. Encodings and numbering are normative (docs/contracts.md).

/// @notice Staking role of an operator. Numbering is part of the interface: 0, 1, 2, 3 (Relay
/// forwards users' cloves in the overlay, docs/overlay.md).
enum Role {
    None,
    Compute,
    Verifier,
    Relay
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
/// shard, outputHash, salt))`. `signedAt` (unix seconds, the node's clock) starts the window in
/// which fraud about this work must stay provable (see `FraudProofs.recordWork`).
struct Commitment {
    bytes32 session;
    uint64 step;
    uint32 shard;
    bytes32 commitment;
    uint64 signedAt;
}

/// @notice Node-signed opening of a commitment, and the node's claim about the computation: on the
/// model whose manifest hashes to `manifestHash`, shard `shard` turned the input hashing to
/// `inputHash` into the output hashing to `outputHash`. The computation-fault hook judges exactly
/// this claim.
struct Reveal {
    bytes32 session;
    uint64 step;
    uint32 shard;
    bytes32 manifestHash;
    bytes32 inputHash;
    bytes32 outputHash;
    bytes32 salt;
    uint64 signedAt;
}

/// @notice Committee-signed judgement that `node` committed `offence`; `nonce` is single-use;
/// `consumer` is the `FraudProofs` contract the verdict is for (no other deployment accepts it).
struct Verdict {
    address node;
    uint8 offence;
    bytes32 evidenceHash;
    address challenger;
    uint64 nonce;
    address consumer;
}

/// @notice A committee-signed payout statement for one epoch, as needed to prove equivocation.
struct PayoutStatement {
    bytes32 root;
    uint256 total;
    bytes32 queriesHash;
}

/// @notice What one epoch charges: per-query deposits (`queryIds`, `fees`, aligned) and prepaid
/// balances per (payer, gateway) (`payers`, `gateways`, `debits` aligned; the pairs (payer,
/// gateway) strictly ascending, payer first). Hashed into every `PayoutRoot` as
/// `queriesHash = keccak256(abi.encode(queryIds, fees, payers, gateways, debits))`.
struct Charges {
    bytes32[] queryIds;
    uint256[] fees;
    address[] payers;
    address[] gateways;
    uint256[] debits;
}
