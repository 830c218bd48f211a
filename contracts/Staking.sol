// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ICommittee} from "./interfaces/ICommittee.sol";
import {IComputationFaultVerifier} from "./interfaces/IComputationFaultVerifier.sol";
import {IStaking} from "./interfaces/IStaking.sol";
import {Offences} from "./libraries/Offences.sol";
import {Offence, Role} from "./libraries/PlanetTypes.sol";
import {FraudProofs} from "./FraudProofs.sol";

/// @title Staking: operators bond native currency to serve (compute), check (verifier) work, or
/// forward users' cloves (relay, a smaller bond: docs/overlay.md).
/// @notice A node can never withdraw while fraud about its work is still provable: unbonding takes
/// `unstakeDelay`, strictly longer than the challenge window (an unbonding node is not eligible
/// for new work), and any node-signed work recorded through `FraudProofs.recordCommitment` /
/// `recordReveal` keeps the stake until `signedAt + challengeWindow + 1` (`lockedUntil`), so work
/// a node signs while unbonding stays slashable for a full window too. Slashing is reserved to the
/// `FraudProofs` contract this contract deploys in its constructor (no admin can rewire it): half of
/// a slash is credited to the challenger (pull via `claimCredit`), the rest is sent to
/// `BURN_ADDRESS` and counted in `totalBurned`.
///
/// Payments are pull-only, to the caller, after all state changes, under nonReentrant, with a plain
/// call forwarding all gas (slither "low-level-calls" is informational).
///
/// Accepted slither "timestamp" findings (low): the unbonding delay is longer than the challenge
/// window (minutes to a day); a block producer's few seconds of timestamp drift do not matter. The
/// detector also flags comparisons on fields packed next to `withdrawableAt` (amount, role).
contract Staking is IStaking, ReentrancyGuardTransient {
    /// @notice Unspendable address receiving burned stake.
    address public constant BURN_ADDRESS = 0x000000000000000000000000000000000000dEaD;

    /// @notice Lifecycle of a stake.
    enum Status {
        None,
        Active,
        Unbonding
    }

    /// @dev One slot: amount (wei), the time withdrawal opens (0 while active) and the role.
    struct StakeInfo {
        uint128 amount;
        uint64 withdrawableAt;
        Role role;
    }

    /// @notice Minimum stake of a compute node (wei).
    uint256 public immutable minComputeStake;
    /// @notice Minimum stake of a verifier (wei).
    uint256 public immutable minVerifierStake;
    /// @notice Minimum stake of a relay (wei).
    uint256 public immutable minRelayStake;
    /// @notice Seconds during which fraud about a node's work can still be proven.
    uint256 public immutable challengeWindow;
    /// @notice Seconds between `requestUnstake` and `withdraw`; strictly greater than `challengeWindow`.
    uint256 public immutable unstakeDelay;
    /// @notice The only address allowed to call `slash`.
    address public immutable fraudProofs;

    mapping(address node => StakeInfo) private _stakes;
    /// @dev Earliest withdrawal time set by recorded work (0: none).
    mapping(address node => uint256) private _lockedUntil;
    /// @notice Challenger rewards waiting to be pulled with `claimCredit`.
    mapping(address account => uint256) public creditOf;

    /// @notice Sum of all stakes (wei).
    uint128 public totalStaked;
    /// @notice Sum of all unclaimed challenger credits (wei).
    uint128 public totalCredits;
    /// @notice Everything ever credited to challengers (wei).
    uint128 public totalRewarded;
    /// @notice Everything ever sent to `BURN_ADDRESS` (wei).
    uint128 public totalBurned;

    event Staked(address indexed node, Role role, uint256 amount, uint256 total);
    event UnstakeRequested(address indexed node, uint256 amount, uint256 withdrawableAt);
    event Withdrawn(address indexed node, uint256 amount);
    event Slashed(
        address indexed node, Offence offence, uint256 amount, address indexed challenger, uint256 reward, uint256 burned
    );
    event CreditClaimed(address indexed account, uint256 amount);
    event WithdrawLocked(address indexed node, uint256 lockedUntil);

    error InvalidRole(Role role);
    error ZeroAmount();
    error RoleMismatch(Role current, Role requested);
    error BelowMinimum(Role role, uint256 amount, uint256 minimum);
    error AlreadyUnbonding(address node, uint256 withdrawableAt);
    error NotStaked(address node);
    error NotUnbonding(address node);
    error UnbondingNotElapsed(address node, uint256 withdrawableAt);
    error NothingToClaim(address account);
    error NothingToSlash(address node);
    error NotFraudProofs(address caller);
    error ZeroChallenger();
    error TransferFailed(address to, uint256 amount);
    error UnstakeDelayTooShort(uint256 unstakeDelay, uint256 challengeWindow);
    error InvalidBps(uint256 bps);
    error FraudWindowOpen(address node, uint256 lockedUntil);
    error WorkAlreadyCovered(address node, uint256 lockedUntil);

    /// @param committee Committee whose verdicts `FraudProofs` accepts.
    /// @param faultVerifier ZK fault verifier hook for `FraudProofs` (zero disables that proof kind).
    /// @param minCompute Minimum compute stake (wei), e.g. 1 ether.
    /// @param minVerifier Minimum verifier stake (wei), e.g. 0.5 ether.
    /// @param minRelay Minimum relay stake (wei), e.g. 0.1 ether.
    /// @param challengeWindow_ Challenge window (s).
    /// @param unstakeDelay_ Unbonding delay (s), strictly greater than `challengeWindow_`.
    constructor(
        ICommittee committee,
        IComputationFaultVerifier faultVerifier,
        uint256 minCompute,
        uint256 minVerifier,
        uint256 minRelay,
        uint256 challengeWindow_,
        uint256 unstakeDelay_
    ) {
        // INVARIANT: a node can never withdraw while fraud about its work is still provable.
        if (unstakeDelay_ <= challengeWindow_) revert UnstakeDelayTooShort(unstakeDelay_, challengeWindow_);
        if (minCompute == 0 || minVerifier == 0 || minRelay == 0) revert ZeroAmount();
        minComputeStake = minCompute;
        minVerifierStake = minVerifier;
        minRelayStake = minRelay;
        challengeWindow = challengeWindow_;
        unstakeDelay = unstakeDelay_;
        fraudProofs = address(new FraudProofs(IStaking(address(this)), committee, faultVerifier, challengeWindow_));
    }

    /// @notice Stakes `msg.value` for `role`, or tops up an active stake of the same role.
    /// @param role Compute (1), Verifier (2) or Relay (3).
    function stake(Role role) external payable {
        if (role == Role.None) revert InvalidRole(role);
        if (msg.value == 0) revert ZeroAmount();
        StakeInfo memory s = _stakes[msg.sender];
        // INVARIANT: a node has exactly one role; change it by unstaking first.
        if (s.role != Role.None && s.role != role) revert RoleMismatch(s.role, role);
        // INVARIANT: an unbonding stake is frozen until withdrawn (no top-up resets the delay).
        if (s.withdrawableAt != 0) revert AlreadyUnbonding(msg.sender, s.withdrawableAt);
        uint256 total = uint256(s.amount) + msg.value;
        uint256 minimum = minimumStake(role);
        if (total < minimum) revert BelowMinimum(role, total, minimum);
        _stakes[msg.sender] = StakeInfo({amount: SafeCast.toUint128(total), withdrawableAt: 0, role: role});
        totalStaked += uint128(msg.value);
        emit Staked(msg.sender, role, msg.value, total);
    }

    /// @notice Starts unbonding the caller's whole stake; `withdraw` opens after `unstakeDelay`.
    function requestUnstake() external {
        StakeInfo storage s = _stakes[msg.sender];
        uint256 amount = s.amount;
        if (amount == 0) revert NotStaked(msg.sender);
        if (s.withdrawableAt != 0) revert AlreadyUnbonding(msg.sender, s.withdrawableAt);
        uint64 at = SafeCast.toUint64(block.timestamp + unstakeDelay);
        s.withdrawableAt = at;
        emit UnstakeRequested(msg.sender, amount, at);
    }

    /// @notice Pays out the caller's unbonded stake once `unstakeDelay` has passed and no recorded
    /// work's fraud window is open.
    function withdraw() external nonReentrant {
        StakeInfo memory s = _stakes[msg.sender];
        if (s.withdrawableAt == 0) revert NotUnbonding(msg.sender);
        // INVARIANT: the delay (> challenge window) has fully elapsed.
        if (block.timestamp < s.withdrawableAt) revert UnbondingNotElapsed(msg.sender, s.withdrawableAt);
        uint256 locked = _lockedUntil[msg.sender];
        // INVARIANT: fraud about recorded work stays provable for its whole window.
        if (block.timestamp < locked) revert FraudWindowOpen(msg.sender, locked);
        delete _stakes[msg.sender];
        if (locked != 0) delete _lockedUntil[msg.sender];
        totalStaked -= s.amount;
        emit Withdrawn(msg.sender, s.amount);
        (bool ok,) = payable(msg.sender).call{value: s.amount}("");
        if (!ok) revert TransferFailed(msg.sender, s.amount);
    }

    /// @notice Pays out the caller's challenger credits.
    function claimCredit() external nonReentrant {
        uint256 amount = creditOf[msg.sender];
        if (amount == 0) revert NothingToClaim(msg.sender);
        creditOf[msg.sender] = 0;
        totalCredits -= uint128(amount);
        emit CreditClaimed(msg.sender, amount);
        (bool ok,) = payable(msg.sender).call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @inheritdoc IStaking
    function slash(address node, Offence offence, uint256 bps, address challenger)
        external
        nonReentrant
        returns (uint256 slashed)
    {
        // INVARIANT: only on-chain proofs or committee verdicts (checked by FraudProofs) can slash.
        if (msg.sender != fraudProofs) revert NotFraudProofs(msg.sender);
        if (challenger == address(0)) revert ZeroChallenger();
        if (bps == 0 || bps > Offences.BPS) revert InvalidBps(bps);
        StakeInfo storage s = _stakes[node];
        uint256 amount = s.amount;
        if (amount == 0) revert NothingToSlash(node);
        // INVARIANT: a slash never exceeds the stake (bps <= 10000).
        slashed = (amount * bps) / Offences.BPS;
        uint256 reward = slashed / 2;
        uint256 burned = slashed - reward;
        if (slashed == amount) {
            delete _stakes[node];
        } else {
            s.amount = uint128(amount - slashed);
        }
        // Casts are exact: slashed <= amount < 2^128.
        totalStaked -= uint128(slashed);
        totalRewarded += uint128(reward);
        totalBurned += uint128(burned);
        creditOf[challenger] += reward;
        totalCredits += uint128(reward);
        emit Slashed(node, offence, slashed, challenger, reward, burned);
        if (burned != 0) {
            (bool ok,) = payable(BURN_ADDRESS).call{value: burned}("");
            if (!ok) revert TransferFailed(BURN_ADDRESS, burned);
        }
    }

    /// @inheritdoc IStaking
    function lockUntil(address node, uint256 until) external returns (uint256) {
        if (msg.sender != fraudProofs) revert NotFraudProofs(msg.sender);
        // A lock only matters while there is a stake to withdraw.
        if (statusOf(node) == Status.None) revert NotStaked(node);
        uint256 current = _lockedUntil[node];
        // INVARIANT: a lock only ever grows (an old record cannot shorten a newer window).
        if (until <= current) revert WorkAlreadyCovered(node, current);
        _lockedUntil[node] = until;
        emit WithdrawLocked(node, until);
        return until;
    }

    /// @notice Earliest time recorded work lets `node` withdraw (0: no recorded work).
    function lockedUntil(address node) external view returns (uint256) {
        return _lockedUntil[node];
    }

    /// @notice Everything ever slashed (wei): rewarded plus burned.
    function totalSlashed() external view returns (uint256) {
        return uint256(totalRewarded) + totalBurned;
    }

    /// @notice Current stake of `node` (wei).
    function stakeOf(address node) external view returns (uint256) {
        return _stakes[node].amount;
    }

    /// @notice Role of `node` (None when not staked).
    function roleOf(address node) external view returns (Role) {
        return _stakes[node].role;
    }

    /// @notice None, Active or Unbonding.
    function statusOf(address node) public view returns (Status) {
        StakeInfo memory s = _stakes[node];
        if (s.amount != 0) return s.withdrawableAt != 0 ? Status.Unbonding : Status.Active;
        return Status.None;
    }

    /// @notice Time `withdraw` opens for `node` (0 unless unbonding).
    function unbondingAt(address node) external view returns (uint256) {
        return _stakes[node].withdrawableAt;
    }

    /// @notice True when `node` is active with at least its role's minimum (may serve or verify).
    function isEligible(address node) external view returns (bool) {
        StakeInfo memory s = _stakes[node];
        if (s.withdrawableAt != 0) return false; // unbonding
        return s.amount != 0 && s.amount >= minimumStake(s.role); // amount != 0 implies a role
    }

    /// @notice Minimum stake for `role` (0 for None).
    function minimumStake(Role role) public view returns (uint256) {
        // Indexed by the enum (None, Compute, Verifier, Relay), which is always in range.
        return [0, minComputeStake, minVerifierStake, minRelayStake][uint8(role)];
    }
}
