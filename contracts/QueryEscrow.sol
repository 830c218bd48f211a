// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ICommittee} from "./interfaces/ICommittee.sol";
import {PlanetHashes} from "./libraries/PlanetHashes.sol";
import {PayoutStatement} from "./libraries/PlanetTypes.sol";

/// @title QueryEscrow: users prepay queries, the committee settles them per epoch, operators claim.
/// @notice Lifecycle of a query id:
/// - `deposit` (payable, value = fee cap) → Funded; a gateway serves only funded queries;
/// - `postPayoutRoot` (committee-signed `PayoutRoot`) charges each listed query its fee (<= its
///   deposit) → Settled; the remainder stays on the query as the user's balance, pulled with `refund`;
/// - or, if never settled, `refund` after `refundTimeout` returns the whole deposit → Refunded.
/// An epoch's fees are claimable with a Merkle proof once `challengeWindow` has passed since the
/// root was posted. Within the window, a second, different committee-signed `PayoutRoot` for the
/// same epoch proves equivocation: the epoch is frozen and every fee goes back to its query's user.
///
/// Storage is packed for gas (one slot per query, two per epoch): a deposit is at most
/// 2^64 - 1 wei (~18.4 ether) and the model id is recorded in the `Deposited` event only.
///
/// Payments are pull-only, to the caller, after all state changes, under nonReentrant, with a plain
/// call forwarding all gas (slither "low-level-calls" is informational).
///
/// Accepted slither "timestamp" findings (low): the refund timeout and the challenge window are
/// minutes (devnet) to hours (production); the few seconds a block producer can shift
/// `block.timestamp` cannot open a window early in any meaningful way. The detector also flags
/// ordinary comparisons on fields packed next to timestamps (status, tags).
contract QueryEscrow is ReentrancyGuardTransient {
    /// @notice Where a query id stands.
    enum QueryStatus {
        None,
        Funded,
        Settled,
        Reclaimed,
        Refunded
    }

    /// @notice Where an epoch stands.
    enum EpochStatus {
        None,
        Posted,
        Disputed
    }

    /// @dev One slot. `tag` is the deposit time while Funded, else one of the TAG_* markers.
    struct Deposit {
        address user;
        uint64 amount;
        uint32 tag;
    }

    /// @dev One slot (plus the root): fees not yet claimed, when claims open, status.
    struct EpochInfo {
        uint128 unclaimed;
        uint64 claimableAt;
        EpochStatus status;
    }

    uint32 private constant TAG_REFUNDED = 0;
    uint32 private constant TAG_SETTLED = 1;
    uint32 private constant TAG_RECLAIMED = 2;
    uint32 private constant TAG_FIRST_TIME = 3;

    /// @notice Committee whose signatures settle epochs.
    ICommittee public immutable committee;
    /// @notice Seconds after posting before an epoch's fees can be claimed (disputes only before).
    uint256 public immutable challengeWindow;
    /// @notice Seconds after a deposit before an unsettled query can be refunded.
    uint256 public immutable refundTimeout;

    mapping(bytes32 queryId => Deposit) private _deposits;
    mapping(uint64 epoch => EpochInfo) private _epochs;
    /// @notice Payout Merkle root of each posted epoch.
    mapping(uint64 epoch => bytes32) public rootOf;
    /// @notice Whether `account` has claimed its payout of `epoch`.
    mapping(uint64 epoch => mapping(address account => bool)) public claimed;

    event Deposited(bytes32 indexed queryId, address indexed user, bytes32 indexed modelId, uint256 amount);
    event Refunded(bytes32 indexed queryId, address indexed user, uint256 amount);
    event PayoutRootPosted(
        uint64 indexed epoch, bytes32 root, uint256 total, bytes32 queriesHash, uint256 claimableAt
    );
    event Claimed(uint64 indexed epoch, address indexed account, uint256 amount);
    event RootDisputed(uint64 indexed epoch, bytes32 otherRoot, uint256 otherTotal, bytes32 otherQueriesHash);

    error InvalidDepositAmount(uint256 amount, uint256 max);
    error QueryExists(bytes32 queryId);
    error NotDepositor(bytes32 queryId, address caller);
    error RefundNotYetAvailable(bytes32 queryId, uint256 availableAt);
    error NothingToRefund(bytes32 queryId);
    error EpochAlreadyPosted(uint64 epoch);
    error ZeroRoot();
    error LengthMismatch(uint256 queryIds, uint256 fees);
    error QueryNotFunded(bytes32 queryId);
    error FeeExceedsDeposit(bytes32 queryId, uint256 fee, uint256 deposit);
    error TotalMismatch(uint256 total, uint256 sumOfFees);
    error EpochNotPosted(uint64 epoch);
    error ChallengeWindowOpen(uint64 epoch, uint256 claimableAt);
    error ChallengeWindowClosed(uint64 epoch, uint256 claimableAt);
    error AlreadyClaimed(uint64 epoch, address account);
    error InvalidClaim(uint64 epoch, address account, uint256 amount);
    error NotPayee(address account, address caller);
    error ExceedsUnclaimed(uint64 epoch, uint256 amount, uint256 unclaimed);
    error SameStatement(uint64 epoch);
    error QueryNotSettled(bytes32 queryId);
    error TransferFailed(address to, uint256 amount);
    error InvalidWindows(uint256 challengeWindow, uint256 refundTimeout);

    /// @param committee_ Committee that signs payout roots.
    /// @param challengeWindow_ Seconds between posting a root and claims opening (60 on the devnet).
    /// @param refundTimeout_ Seconds after a deposit before an unsettled refund (600 on the devnet).
    constructor(ICommittee committee_, uint256 challengeWindow_, uint256 refundTimeout_) {
        if (challengeWindow_ == 0 || refundTimeout_ == 0 || challengeWindow_ > type(uint32).max
                || refundTimeout_ > type(uint32).max) {
            revert InvalidWindows(challengeWindow_, refundTimeout_);
        }
        committee = committee_;
        challengeWindow = challengeWindow_;
        refundTimeout = refundTimeout_;
    }

    /// @notice Prepays query `queryId` for model `modelId`; `msg.value` is the fee cap.
    /// @param queryId Unique query id (one deposit per id, ever).
    /// @param modelId Model the query is for (emitted in `Deposited`).
    function deposit(bytes32 queryId, bytes32 modelId) external payable {
        if (msg.value == 0 || msg.value > type(uint64).max) {
            revert InvalidDepositAmount(msg.value, type(uint64).max);
        }
        // INVARIANT: a query id is funded at most once, so a settled or refunded id never revives.
        if (_deposits[queryId].user != address(0)) revert QueryExists(queryId);
        _deposits[queryId] =
            Deposit({user: msg.sender, amount: uint64(msg.value), tag: SafeCast.toUint32(block.timestamp)});
        emit Deposited(queryId, msg.sender, modelId, msg.value);
    }

    /// @notice Pays the depositor what the query still holds: the whole deposit if it was never
    /// settled and `refundTimeout` has passed, otherwise (settled) the part its fee did not use.
    /// @param queryId The query.
    function refund(bytes32 queryId) external nonReentrant {
        Deposit memory d = _deposits[queryId];
        if (d.user != msg.sender) revert NotDepositor(queryId, msg.sender);
        uint32 tag = d.tag;
        if (tag >= TAG_FIRST_TIME) {
            uint256 availableAt = uint256(tag) + refundTimeout;
            // INVARIANT: an unsettled deposit stays available to the committee until the timeout.
            if (block.timestamp < availableAt) revert RefundNotYetAvailable(queryId, availableAt);
            tag = TAG_REFUNDED;
        }
        if (d.amount == 0) revert NothingToRefund(queryId);
        _deposits[queryId] = Deposit({user: d.user, amount: 0, tag: tag});
        emit Refunded(queryId, d.user, d.amount);
        (bool ok,) = payable(msg.sender).call{value: d.amount}(""); // the caller is d.user
        if (!ok) revert TransferFailed(msg.sender, d.amount);
    }

    /// @notice Posts epoch `epoch`'s payout root, signed by the committee over
    /// `PayoutRoot(uint64 epoch,bytes32 root,uint256 total,bytes32 queriesHash,address consumer)`
    /// with `queriesHash = keccak256(abi.encode(queryIds, fees))` and `consumer` this escrow, and
    /// charges every listed query its fee.
    /// @param epoch Epoch number (one root per epoch).
    /// @param root Merkle root of (uint64 epoch, address account, uint256 amount) leaves.
    /// @param total Sum of `fees`; the most the epoch can ever pay out.
    /// @param queryIds Funded, unsettled queries served in the epoch.
    /// @param fees Fee charged to each query (<= its deposit).
    /// @param sigs Committee signatures.
    function postPayoutRoot(
        uint64 epoch,
        bytes32 root,
        uint256 total,
        bytes32[] calldata queryIds,
        uint256[] calldata fees,
        bytes[] calldata sigs
    ) external {
        if (_epochs[epoch].status != EpochStatus.None) revert EpochAlreadyPosted(epoch);
        if (root == bytes32(0)) revert ZeroRoot();
        if (queryIds.length != fees.length) revert LengthMismatch(queryIds.length, fees.length);
        bytes32 queriesHash = PlanetHashes.queriesHash(queryIds, fees);
        // INVARIANT: the statement names this escrow as its consumer (no replay on another deployment).
        committee.verify(PlanetHashes.payoutRoot(epoch, root, total, queriesHash, address(this)), sigs);
        uint256 sum = 0;
        for (uint256 i = 0; i < queryIds.length; ++i) {
            Deposit storage d = _deposits[queryIds[i]];
            // INVARIANT: only funded, unsettled queries pay, and never more than they deposited.
            if (d.tag < TAG_FIRST_TIME) revert QueryNotFunded(queryIds[i]);
            uint256 available = d.amount;
            uint256 fee = fees[i];
            if (fee > available) revert FeeExceedsDeposit(queryIds[i], fee, available);
            d.amount = uint64(available - fee);
            d.tag = TAG_SETTLED;
            sum += fee;
        }
        // INVARIANT: the epoch holds exactly the fees it charged.
        if (sum != total) revert TotalMismatch(total, sum);
        uint256 claimableAt = block.timestamp + challengeWindow;
        _epochs[epoch] =
            EpochInfo({unclaimed: uint128(sum), claimableAt: uint64(claimableAt), status: EpochStatus.Posted});
        rootOf[epoch] = root;
        emit PayoutRootPosted(epoch, root, total, queriesHash, claimableAt);
    }

    /// @notice Pays `account` its payout for `epoch` once the challenge window has passed; only
    /// `account` itself may claim (pull payment to the caller).
    /// @param epoch The epoch.
    /// @param account Payee: the leaf's account, must be the caller.
    /// @param amount The leaf's amount (wei).
    /// @param proof OpenZeppelin Merkle proof of the leaf.
    function claim(uint64 epoch, address account, uint256 amount, bytes32[] calldata proof) external nonReentrant {
        if (msg.sender != account) revert NotPayee(account, msg.sender);
        EpochInfo memory e = _epochs[epoch];
        if (e.status != EpochStatus.Posted) revert EpochNotPosted(epoch);
        // INVARIANT: fees are released only after the challenge window.
        if (block.timestamp < e.claimableAt) revert ChallengeWindowOpen(epoch, e.claimableAt);
        if (claimed[epoch][account]) revert AlreadyClaimed(epoch, account);
        bytes32 leaf = PlanetHashes.payoutLeaf(epoch, account, amount);
        if (amount == 0 || !MerkleProof.verifyCalldata(proof, rootOf[epoch], leaf)) {
            revert InvalidClaim(epoch, account, amount);
        }
        // INVARIANT: an epoch never pays more than the fees it charged.
        if (amount > e.unclaimed) revert ExceedsUnclaimed(epoch, amount, e.unclaimed);
        claimed[epoch][account] = true;
        _epochs[epoch].unclaimed = uint128(e.unclaimed - amount);
        emit Claimed(epoch, account, amount);
        (bool ok,) = payable(msg.sender).call{value: amount}(""); // the caller is account
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice Proves committee equivocation on `epoch` within its challenge window: the posted
    /// statement (re-supplied as its query list and signatures) and `other` are two different
    /// committee-signed `PayoutRoot`s for the same epoch. The epoch is frozen and each listed query
    /// gets its fee back (pull with `refund`).
    /// @param epoch The posted epoch.
    /// @param queryIds The posted query list (from the `postPayoutRoot` call).
    /// @param fees The posted fees.
    /// @param postedSigs Committee signatures over the posted statement.
    /// @param other The conflicting statement.
    /// @param otherSigs Committee signatures over `other`.
    function disputeRoot(
        uint64 epoch,
        bytes32[] calldata queryIds,
        uint256[] calldata fees,
        bytes[] calldata postedSigs,
        PayoutStatement calldata other,
        bytes[] calldata otherSigs
    ) external {
        EpochInfo memory e = _epochs[epoch];
        if (e.status != EpochStatus.Posted) revert EpochNotPosted(epoch);
        // INVARIANT: disputes only before claims open, so the epoch still holds its whole total.
        if (block.timestamp >= e.claimableAt) revert ChallengeWindowClosed(epoch, e.claimableAt);
        if (queryIds.length != fees.length) revert LengthMismatch(queryIds.length, fees.length);
        _verifyEquivocation(epoch, e.unclaimed, PlanetHashes.queriesHash(queryIds, fees), postedSigs, other, otherSigs);
        uint256 sum = _returnFees(queryIds, fees);
        // INVARIANT: exactly the epoch's fees go back to users.
        if (sum != e.unclaimed) revert TotalMismatch(e.unclaimed, sum);
        _epochs[epoch] = EpochInfo({unclaimed: 0, claimableAt: e.claimableAt, status: EpochStatus.Disputed});
        emit RootDisputed(epoch, other.root, other.total, other.queriesHash);
    }

    /// @notice True iff `queryId` is funded and not yet settled or refunded (what a gateway checks).
    function isFunded(bytes32 queryId) external view returns (bool) {
        return _deposits[queryId].tag >= TAG_FIRST_TIME;
    }

    /// @notice The depositor, the wei the query still holds, its status, and its deposit time
    /// (0 once settled or refunded).
    function depositOf(bytes32 queryId)
        external
        view
        returns (address user, uint256 amount, QueryStatus status, uint256 depositedAt)
    {
        Deposit memory d = _deposits[queryId];
        user = d.user;
        amount = d.amount;
        // Tags are ordered: Refunded 0 < Settled 1 < Reclaimed 2 < deposit times (Funded).
        if (d.user == address(0)) {
            status = QueryStatus.None;
        } else if (d.tag >= TAG_FIRST_TIME) {
            status = QueryStatus.Funded;
            depositedAt = d.tag;
        } else if (d.tag > TAG_SETTLED) {
            status = QueryStatus.Reclaimed;
        } else if (d.tag > TAG_REFUNDED) {
            status = QueryStatus.Settled;
        } else {
            status = QueryStatus.Refunded;
        }
    }

    /// @notice Epoch `epoch`'s root, unclaimed fees, claim opening time and status.
    function epochOf(uint64 epoch)
        external
        view
        returns (bytes32 root, uint256 unclaimed, uint256 claimableAt, EpochStatus status)
    {
        EpochInfo memory e = _epochs[epoch];
        return (rootOf[epoch], e.unclaimed, e.claimableAt, e.status);
    }

    /// @dev Reverts unless the posted statement (stored root and total, given query list) and
    /// `other` differ and both carry committee signatures.
    function _verifyEquivocation(
        uint64 epoch,
        uint256 postedTotal,
        bytes32 postedQueriesHash,
        bytes[] calldata postedSigs,
        PayoutStatement calldata other,
        bytes[] calldata otherSigs
    ) private view {
        bytes32 posted = PlanetHashes.payoutRoot(epoch, rootOf[epoch], postedTotal, postedQueriesHash, address(this));
        bytes32 conflicting =
            PlanetHashes.payoutRoot(epoch, other.root, other.total, other.queriesHash, address(this));
        // INVARIANT: equivocation needs two different signed statements.
        if (posted != conflicting) {
            committee.verify(posted, postedSigs);
            committee.verify(conflicting, otherSigs);
            return;
        }
        revert SameStatement(epoch);
    }

    /// @dev Gives every listed settled query its fee back; returns the sum of fees.
    function _returnFees(bytes32[] calldata queryIds, uint256[] calldata fees) private returns (uint256 sum) {
        for (uint256 i = 0; i < queryIds.length; ++i) {
            Deposit storage d = _deposits[queryIds[i]];
            // INVARIANT: each settled query gets its fee back once.
            if (d.user == address(0) || d.tag != TAG_SETTLED) revert QueryNotSettled(queryIds[i]);
            d.amount = SafeCast.toUint64(uint256(d.amount) + fees[i]);
            d.tag = TAG_RECLAIMED;
            sum += fees[i];
        }
    }
}
