// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ICommittee} from "./interfaces/ICommittee.sol";
import {PlanetHashes} from "./libraries/PlanetHashes.sol";

/// @title ModelRegistry: model id → manifest hash and shard hashes.
/// @notice Registration needs committee signatures over `ModelRegistration(bytes32 modelId,
/// bytes32 manifestHash,bytes32[] shardHashes,uint64 nonce,address consumer)` with
/// `nonce == nonce()` and `consumer` this registry. A devnet may
/// construct it with a non-zero `devOwner`, who can then register without signatures
/// (`devRegister`); with a zero `devOwner` (the default elsewhere) that shortcut is disabled for
/// good. Hashes are raw 32-byte sha256 digests of Planet manifests and shards. Entries are immutable.
contract ModelRegistry {
    /// @notice Most shards one model may list.
    uint256 public constant MAX_SHARDS = 1024;

    struct Model {
        bytes32 manifestHash;
        bytes32[] shardHashes;
    }

    /// @notice Committee that signs registrations.
    ICommittee public immutable committee;
    /// @notice Devnet owner allowed to `devRegister` (zero: disabled).
    address public immutable devOwner;
    /// @notice Nonce the next committee-signed registration must carry.
    uint64 public nonce;

    mapping(bytes32 modelId => Model) private _models;

    event ModelRegistered(bytes32 indexed modelId, bytes32 manifestHash, bytes32[] shardHashes, bool devShortcut);

    error InvalidNonce(uint64 expected, uint64 given);
    error ZeroHash();
    error InvalidShardCount(uint256 count);
    error ModelAlreadyRegistered(bytes32 modelId);
    error DevRegistrationDisabled();
    error NotDevOwner(address caller);

    /// @param committee_ Committee that signs registrations.
    /// @param devOwner_ Devnet owner (zero disables `devRegister`).
    constructor(ICommittee committee_, address devOwner_) {
        committee = committee_;
        // Accepted slither "missing-zero-check" (low): zero is meaningful, it disables devRegister.
        devOwner = devOwner_;
    }

    /// @notice Registers a model on the committee's signatures.
    /// @param modelId Model id (non-zero, new).
    /// @param manifestHash sha256 digest of the manifest (non-zero).
    /// @param shardHashes sha256 digests of the shards (1..MAX_SHARDS).
    /// @param nonce_ Must equal `nonce()`; consumed.
    /// @param sigs Committee signatures.
    function register(
        bytes32 modelId,
        bytes32 manifestHash,
        bytes32[] calldata shardHashes,
        uint64 nonce_,
        bytes[] calldata sigs
    ) external {
        uint64 expected = nonce;
        // INVARIANT: each signed registration is single-use.
        if (nonce_ != expected) revert InvalidNonce(expected, nonce_);
        // INVARIANT: the registration names this registry as its consumer (no replay elsewhere).
        committee.verify(
            PlanetHashes.modelRegistration(modelId, manifestHash, shardHashes, nonce_, address(this)), sigs
        );
        nonce = expected + 1;
        _register(modelId, manifestHash, shardHashes, false);
    }

    /// @notice Devnet shortcut: the dev owner registers without signatures.
    /// @param modelId Model id (non-zero, new).
    /// @param manifestHash sha256 digest of the manifest.
    /// @param shardHashes sha256 digests of the shards.
    function devRegister(bytes32 modelId, bytes32 manifestHash, bytes32[] calldata shardHashes) external {
        address owner = devOwner;
        // INVARIANT: without a dev owner only the committee can register.
        if (owner == address(0)) revert DevRegistrationDisabled();
        if (msg.sender != owner) revert NotDevOwner(msg.sender);
        _register(modelId, manifestHash, shardHashes, true);
    }

    /// @notice Manifest hash of `modelId` (zero if unknown).
    function manifestHashOf(bytes32 modelId) external view returns (bytes32) {
        return _models[modelId].manifestHash;
    }

    /// @notice Shard hashes of `modelId` (empty if unknown).
    function shardHashesOf(bytes32 modelId) external view returns (bytes32[] memory) {
        return _models[modelId].shardHashes;
    }

    /// @notice Whether `modelId` is registered.
    function isRegistered(bytes32 modelId) external view returns (bool) {
        return _models[modelId].manifestHash != bytes32(0);
    }

    function _register(bytes32 modelId, bytes32 manifestHash, bytes32[] calldata shardHashes, bool dev) private {
        if (modelId == bytes32(0) || manifestHash == bytes32(0)) revert ZeroHash();
        uint256 n = shardHashes.length;
        if (n == 0 || n > MAX_SHARDS) revert InvalidShardCount(n);
        for (uint256 i = 0; i < n; ++i) {
            if (shardHashes[i] == bytes32(0)) revert ZeroHash();
        }
        // INVARIANT: a model id is bound to one manifest forever.
        if (_models[modelId].manifestHash != bytes32(0)) revert ModelAlreadyRegistered(modelId);
        Model storage m = _models[modelId];
        m.manifestHash = manifestHash;
        m.shardHashes = shardHashes;
        emit ModelRegistered(modelId, manifestHash, shardHashes, dev);
    }
}
