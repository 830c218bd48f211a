// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ICommittee} from "./interfaces/ICommittee.sol";
import {PlanetHashes} from "./libraries/PlanetHashes.sol";

/// @title Committee: the signer set whose >= 2/3 voting power authorises payouts, verdicts, model
/// registrations and its own replacement.
/// @notice Signatures are EIP-712 over the domain {name: "Planet Committee", version: "1", chainId,
/// verifyingContract: this}. Recovered signers must be strictly ascending (hence unique) members and
/// `3 * signedPower >= 2 * totalPower`. The set changes only through `update`, itself signed by the
/// current committee over a `CommitteeUpdate` carrying the current nonce.
contract Committee is ICommittee, EIP712 {
    /// @notice Upper bound on the number of members (keeps `update` and `verify` bounded).
    uint256 public constant MAX_MEMBERS = 256;
    /// @notice Upper bound on one member's power (CometBFT voting powers are int64).
    uint256 public constant MAX_POWER = type(uint64).max;

    mapping(address member => uint256 power) private _powerOf;
    address[] private _members;
    /// @dev Packed into one slot: sum of all powers (<= 256 * 2^64) and the update nonce.
    uint128 private _totalPower;
    uint64 private _nonce;

    /// @notice The committee was replaced; `nonce` is the nonce the update consumed.
    event CommitteeUpdated(uint64 indexed nonce, address[] signers, uint256[] powers, uint256 totalPower);

    /// @notice A member list is empty or longer than `MAX_MEMBERS`.
    error InvalidMemberCount(uint256 count);
    /// @notice `signers` and `powers` differ in length.
    error LengthMismatch(uint256 signers, uint256 powers);
    /// @notice Member at `index` is zero or not strictly greater than the previous one.
    error MembersNotSorted(uint256 index);
    /// @notice Power at `index` is zero or above `MAX_POWER`.
    error InvalidPower(uint256 index, uint256 power);
    /// @notice The update's nonce is not the current one.
    error InvalidNonce(uint64 expected, uint64 given);

    /// @param signers Initial members, strictly ascending.
    /// @param powers Their voting powers (each 1..MAX_POWER).
    constructor(address[] memory signers, uint256[] memory powers) EIP712("Planet Committee", "1") {
        _setMembers(signers, powers);
    }

    /// @notice Verifies committee signatures over `structHash` (see contract docs); reverts on failure.
    /// @param structHash EIP-712 struct hash of the signed message.
    /// @param sigs 65-byte r||s||v signatures, ordered by ascending signer address.
    function verify(bytes32 structHash, bytes[] calldata sigs) external view {
        _verify(structHash, sigs);
    }

    /// @notice Like `verify`, and returns the signers' summed power (for tooling).
    /// @param structHash EIP-712 struct hash of the signed message.
    /// @param sigs 65-byte r||s||v signatures, ordered by ascending signer address.
    /// @return Sum of the signers' powers.
    function signedPower(bytes32 structHash, bytes[] calldata sigs) external view returns (uint256) {
        return _verify(structHash, sigs);
    }

    /// @notice Replaces the committee. Signed by the current committee over
    /// `CommitteeUpdate(address[] signers,uint256[] powers,uint64 nonce)` with `nonce == nonce()`.
    /// @param signers New members, strictly ascending.
    /// @param powers New powers.
    /// @param nonce_ Must equal the current nonce; it is consumed.
    /// @param sigs Current committee's signatures.
    function update(address[] calldata signers, uint256[] calldata powers, uint64 nonce_, bytes[] calldata sigs)
        external
    {
        uint64 expected = _nonce;
        // INVARIANT: every update consumes exactly the current nonce, so a signed update is single-use.
        if (nonce_ != expected) revert InvalidNonce(expected, nonce_);
        _verify(PlanetHashes.committeeUpdate(signers, powers, nonce_), sigs);
        _nonce = expected + 1;
        address[] memory old = _members;
        // Bounded by MAX_MEMBERS (slither "costly-loop", informational).
        for (uint256 i = 0; i < old.length; ++i) {
            delete _powerOf[old[i]];
        }
        uint256 total = _setMembers(signers, powers);
        emit CommitteeUpdated(nonce_, signers, powers, total);
    }

    /// @notice Current members, ascending.
    function members() external view returns (address[] memory) {
        return _members;
    }

    /// @notice Voting power of `account` (0 for non-members).
    function powerOf(address account) external view returns (uint256) {
        return _powerOf[account];
    }

    /// @notice Sum of all members' powers.
    function totalPower() external view returns (uint256) {
        return _totalPower;
    }

    /// @notice Nonce the next `update` must carry.
    function nonce() external view returns (uint64) {
        return _nonce;
    }

    /// @notice The EIP-712 domain separator signatures are made under.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    function _verify(bytes32 structHash, bytes[] calldata sigs) private view returns (uint256 signed) {
        bytes32 digest = _hashTypedDataV4(structHash);
        address previous = address(0);
        uint256 n = sigs.length;
        for (uint256 i = 0; i < n; ++i) {
            (address signer, ECDSA.RecoverError err, bytes32 errArg) = ECDSA.tryRecoverCalldata(digest, sigs[i]);
            // INVARIANT: only well-formed, non-malleable signatures count (any error detail fails).
            if (err != ECDSA.RecoverError.NoError || errArg != bytes32(0)) revert InvalidSignature(i);
            // INVARIANT: strictly ascending signers, so nobody's power is counted twice.
            if (signer <= previous) revert SignersNotSorted(i);
            uint256 power = _powerOf[signer];
            // INVARIANT: only members carry power.
            if (power == 0) revert UnknownSigner(signer);
            signed += power;
            previous = signer;
        }
        uint256 total = _totalPower;
        // INVARIANT: >= 2/3 of the total power signed (integer form, no rounding).
        if (3 * signed < 2 * total) revert InsufficientPower(signed, total);
    }

    function _setMembers(address[] memory signers, uint256[] memory powers) private returns (uint256 total) {
        uint256 n = signers.length;
        if (n == 0 || n > MAX_MEMBERS) revert InvalidMemberCount(n);
        if (powers.length != n) revert LengthMismatch(n, powers.length);
        address previous = address(0);
        for (uint256 i = 0; i < n; ++i) {
            address member = signers[i];
            // INVARIANT: members are non-zero and unique (strictly ascending).
            if (member <= previous) revert MembersNotSorted(i);
            uint256 power = powers[i];
            if (power == 0 || power > MAX_POWER) revert InvalidPower(i, power);
            _powerOf[member] = power;
            total += power;
            previous = member;
        }
        _members = signers;
        _totalPower = uint128(total); // <= 256 * (2^64 - 1) < 2^128
    }
}
