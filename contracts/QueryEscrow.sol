// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";
import {ICommittee} from "./interfaces/ICommittee.sol";
import {PlanetHashes} from "./libraries/PlanetHashes.sol";
import {Charges, PayoutStatement} from "./libraries/PlanetTypes.sol";

/// @title QueryEscrow: users prepay queries, the committee settles them per epoch, operators claim.
/// @notice Two ways to pay, one pot, and every payment bound to one gateway:
/// - per query: `deposit(queryId, modelId, gateway)` (payable, value = fee cap) → Funded; only that
///   gateway serves it (`depositOf` answers everything it checks in one call), and only that
///   gateway is paid its fee: a page listing it must pay that gateway alone (one leaf);
///   `postPayoutRoot` charges each listed query its fee (<= its deposit) → Settled, the remainder
///   stays on the query, pulled with `refund`; if never settled, `refund` after `refundTimeout`
///   returns the whole deposit → Refunded;
/// - prepaid: `depositBalance(gateway)` once, then per question an off-chain EIP-712 authorization
///   to that gateway; a balance is spendable at its gateway only, so one balance can never be spent
///   at two gateways. `postPayoutRoot` debits each listed (payer, gateway) once per epoch (one slot
///   per pair, not per question); `requestWithdrawal(gateway)`, then `withdrawBalance(gateway)`
///   after `refundTimeout`.
/// - credits: a balance deposited for this escrow itself (`depositBalance(escrow)`) buys the
///   committee's bearer credits. A statement's (payer, escrow) debit is a purchase: it moves into
///   the credit pool (the escrow's own (escrow, escrow) balance), not into that statement's total;
///   the pool pays nodes as the credits are redeemed, through an (escrow, escrow) debit of the
///   statement of the epoch they were redeemed in, charged after the statement's purchases.
/// Posting never reverts because of what a user did: a query refunded after its timeout or a
/// balance withdrawn (or short) is simply not charged, and the epoch pays its claims pro rata to
/// what it collected (the shortfall rule, docs/contracts.md). So a committee-signed root can always
/// be posted, and the committee never has to sign a second statement for an epoch.
/// An epoch's fees are claimable with a Merkle proof once `challengeWindow` has passed since the
/// root was posted. Within the window, a second, different committee-signed `PayoutRoot` for the
/// same epoch proves equivocation: the epoch is frozen and every charge goes back to its payer.
///
/// Storage is packed for gas (two slots per query, one per (payer, gateway), two per epoch): a
/// deposit is at most 2^64 - 1 wei (~18.4 ether), a balance at most 2^128 - 1 wei. A query's second
/// slot holds its gateway and the model as a small index: each model id is stored once, at its
/// first deposit, so a deposit writes two slots, not three.
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

    /// @dev One slot, written once by `deposit`: the gateway the query is paid to, and the model
    /// (1 + its position in `_modelIds`).
    struct Terms {
        address gateway;
        uint96 model;
    }

    /// @dev One slot (plus the root): wei not yet claimed, when claims open, status, and whether
    /// the epoch collected less than its signed total (then `_shortfalls` holds both figures).
    struct EpochInfo {
        uint128 unclaimed;
        uint64 claimableAt;
        EpochStatus status;
        bool short;
    }

    /// @dev One slot per (payer, gateway): prepaid wei, and when a requested withdrawal opens (0 = none).
    struct Account {
        uint128 balance;
        uint64 withdrawableAt;
    }

    /// @dev Written only for an epoch that collected less than it signed: the signed total and
    /// what was collected; each claim pays `amount * collected / total` (rounded down).
    struct Shortfall {
        uint128 total;
        uint128 collected;
    }

    uint32 private constant TAG_REFUNDED = 0;
    uint32 private constant TAG_SETTLED = 1;
    uint32 private constant TAG_RECLAIMED = 2;
    uint32 private constant TAG_FIRST_TIME = 3;

    /// @notice Committee whose signatures settle epochs.
    ICommittee public immutable committee;
    /// @notice Seconds after posting before an epoch's fees can be claimed (disputes only before).
    uint256 public immutable challengeWindow;
    /// @notice Seconds after a deposit before an unsettled query can be refunded, and after a
    /// withdrawal request before a prepaid balance can be withdrawn.
    uint256 public immutable refundTimeout;

    mapping(bytes32 queryId => Deposit) private _deposits;
    mapping(bytes32 queryId => Terms) private _terms;
    /// @dev Every model id a deposit named, in order of first use; `_modelIndex` is 1 + position.
    bytes32[] private _modelIds;
    mapping(bytes32 modelId => uint96) private _modelIndex;
    mapping(uint64 epoch => EpochInfo) private _epochs;
    /// @notice Payout Merkle root of each posted epoch.
    mapping(uint64 epoch => bytes32) public rootOf;
    /// @notice Whether `account` has claimed its payout of `epoch`.
    mapping(uint64 epoch => mapping(address account => bool)) public claimed;
    mapping(address payer => mapping(address gateway => Account)) private _accounts;
    mapping(uint64 epoch => Shortfall) private _shortfalls;
    /// @notice Wei the committee counts in the credit pool that purchases never paid (a payer's
    /// balance short at its purchase's debit): the only part of a draw the pool may pay short.
    uint256 public creditPoolDeficit;
    /// @dev The part of a (payer, gateway)'s signed debit an epoch could not charge (written only
    /// when short).
    mapping(uint64 epoch => mapping(address payer => mapping(address gateway => uint256))) private _uncharged;

    event Deposited(
        bytes32 indexed queryId, address indexed user, bytes32 indexed modelId, address gateway, uint256 amount
    );
    event Refunded(bytes32 indexed queryId, address indexed user, uint256 amount);
    event PayoutRootPosted(
        uint64 indexed epoch, bytes32 root, uint256 total, bytes32 queriesHash, uint256 claimableAt
    );
    event Claimed(uint64 indexed epoch, address indexed account, uint256 amount);
    event RootDisputed(uint64 indexed epoch, bytes32 otherRoot, uint256 otherTotal, bytes32 otherQueriesHash);
    event BalanceDeposited(address indexed payer, address indexed gateway, uint256 amount, uint256 balance);
    event WithdrawalRequested(
        address indexed payer, address indexed gateway, uint256 balance, uint256 withdrawableAt
    );
    event WithdrawalCancelled(address indexed payer, address indexed gateway);
    event BalanceWithdrawn(address indexed payer, address indexed gateway, uint256 amount);
    event Debited(
        uint64 indexed epoch, address indexed payer, address indexed gateway, uint256 charged, uint256 balance
    );
    event DebitShortfall(
        uint64 indexed epoch, address indexed payer, address indexed gateway, uint256 debit, uint256 charged
    );
    event QueryUncharged(uint64 indexed epoch, bytes32 indexed queryId, uint256 fee);
    event SettlementShortfall(uint64 indexed epoch, uint256 total, uint256 collected);
    event DebitReturned(uint64 indexed epoch, address indexed payer, address indexed gateway, uint256 amount);
    event CreditsBought(uint64 indexed epoch, address indexed payer, uint256 amount, uint256 charged, uint256 pool);

    error InvalidDepositAmount(uint256 amount, uint256 max);
    error QueryExists(bytes32 queryId);
    error NotDepositor(bytes32 queryId, address caller);
    error RefundNotYetAvailable(bytes32 queryId, uint256 availableAt);
    error NothingToRefund(bytes32 queryId);
    error EpochAlreadyPosted(uint64 epoch);
    error ZeroRoot();
    error LengthMismatch(uint256 expected, uint256 actual);
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
    error InvalidGateway(address gateway);
    error BalanceOverflow(address payer, address gateway, uint256 balance, uint256 amount);
    error NothingToWithdraw(address payer, address gateway);
    error WithdrawalAlreadyRequested(address payer, address gateway, uint256 withdrawableAt);
    error WithdrawalNotRequested(address payer, address gateway);
    error WithdrawalNotYetAvailable(address payer, address gateway, uint256 withdrawableAt);
    error PayersNotSorted(uint256 index);
    error CreditPoolShort(uint64 epoch, uint256 draw, uint256 pool);
    error WrongGatewayQuery(bytes32 queryId, address gateway, address payee);
    error WrongGatewayDebit(address payer, address gateway, address payee);
    error RootNotPayee(uint64 epoch, address payee, uint256 total);

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

    /// @notice Prepays query `queryId` for model `modelId` at `gateway`; `msg.value` is the fee cap.
    /// Only `gateway` serves it: a gateway refuses a deposit made for another one, before serving.
    /// @param queryId Unique query id (one deposit per id, ever).
    /// @param modelId Model the query is for.
    /// @param gateway The gateway (its signing address, as in `/v1/pools`) that may serve it.
    function deposit(bytes32 queryId, bytes32 modelId, address gateway) external payable {
        if (msg.value == 0 || msg.value > type(uint64).max) {
            revert InvalidDepositAmount(msg.value, type(uint64).max);
        }
        if (gateway == address(0)) revert InvalidGateway(gateway);
        // INVARIANT: a query id is funded at most once, so a settled or refunded id never revives.
        if (_deposits[queryId].user != address(0)) revert QueryExists(queryId);
        _deposits[queryId] =
            Deposit({user: msg.sender, amount: uint64(msg.value), tag: SafeCast.toUint32(block.timestamp)});
        _terms[queryId] = Terms({gateway: gateway, model: _modelIndexOf(modelId)});
        emit Deposited(queryId, msg.sender, modelId, gateway, msg.value);
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

    /// @notice Adds `msg.value` to the caller's prepaid balance at `gateway` (one deposit, many
    /// questions); only `gateway` can have it debited.
    /// @param gateway The gateway (its signing address, as in `/v1/pools`) the balance pays.
    function depositBalance(address gateway) external payable {
        if (msg.value == 0) revert InvalidDepositAmount(0, type(uint128).max);
        if (gateway == address(0)) revert InvalidGateway(gateway);
        Account storage a = _accounts[msg.sender][gateway];
        uint256 balance = uint256(a.balance) + msg.value;
        if (balance > type(uint128).max) revert BalanceOverflow(msg.sender, gateway, a.balance, msg.value);
        a.balance = uint128(balance);
        emit BalanceDeposited(msg.sender, gateway, msg.value, balance);
    }

    /// @notice Starts the withdrawal of the caller's whole balance at `gateway`: `withdrawBalance`
    /// opens `refundTimeout` later (the gateway stops accepting the caller's authorizations now;
    /// epochs that already served them settle before then).
    /// @param gateway The gateway whose balance is withdrawn.
    function requestWithdrawal(address gateway) external {
        Account storage a = _accounts[msg.sender][gateway];
        if (a.balance == 0) revert NothingToWithdraw(msg.sender, gateway);
        if (a.withdrawableAt != 0) revert WithdrawalAlreadyRequested(msg.sender, gateway, a.withdrawableAt);
        uint256 withdrawableAt = block.timestamp + refundTimeout;
        a.withdrawableAt = uint64(withdrawableAt);
        emit WithdrawalRequested(msg.sender, gateway, a.balance, withdrawableAt);
    }

    /// @notice Cancels the caller's pending withdrawal at `gateway` (the balance pays again).
    /// @param gateway The gateway whose balance is kept.
    function cancelWithdrawal(address gateway) external {
        Account storage a = _accounts[msg.sender][gateway];
        if (a.withdrawableAt == 0) revert WithdrawalNotRequested(msg.sender, gateway);
        a.withdrawableAt = 0;
        emit WithdrawalCancelled(msg.sender, gateway);
    }

    /// @notice Pays the caller its whole remaining balance at `gateway` once its request has matured.
    /// @param gateway The gateway whose balance is withdrawn.
    function withdrawBalance(address gateway) external nonReentrant {
        Account memory a = _accounts[msg.sender][gateway];
        if (a.withdrawableAt == 0) revert WithdrawalNotRequested(msg.sender, gateway);
        // INVARIANT: a balance leaves only `refundTimeout` after the request, so epochs that
        // served its authorizations before the request can still debit it.
        if (block.timestamp < a.withdrawableAt) {
            revert WithdrawalNotYetAvailable(msg.sender, gateway, a.withdrawableAt);
        }
        delete _accounts[msg.sender][gateway];
        emit BalanceWithdrawn(msg.sender, gateway, a.balance);
        if (a.balance != 0) {
            (bool ok,) = payable(msg.sender).call{value: a.balance}("");
            if (!ok) revert TransferFailed(msg.sender, a.balance);
        }
    }

    /// @notice Posts epoch `epoch`'s payout root, signed by the committee over
    /// `PayoutRoot(uint64 epoch,bytes32 root,uint256 total,bytes32 queriesHash,address consumer)`
    /// with `queriesHash = keccak256(abi.encode(queryIds, fees, payers, gateways, debits))` and
    /// `consumer` this escrow; charges every listed query its fee and debits every listed
    /// (payer, gateway) balance.
    /// A page that lists per-query deposits pays exactly one gateway, the one its first query's
    /// deposit names (`payee`): every listed deposit must name it (`WrongGatewayQuery`), every
    /// listed debit must be a balance held for it (`WrongGatewayDebit`), and `root` must be the
    /// one leaf `(epoch, payee, total)` (`RootNotPayee`). So a gateway is paid only its own
    /// deposits' fees, and no other account can claim them.
    /// Never reverts because of a user: a query refunded after its timeout is not charged
    /// (`QueryUncharged`), a (payer, gateway) whose balance is short is charged what it has
    /// (`DebitShortfall`); claims then pay pro rata to what was collected.
    /// @param epoch Epoch number (one root per epoch).
    /// @param root Merkle root of (uint64 epoch, address account, uint256 amount) leaves.
    /// A draw from the credit pool beyond the pool reverts `CreditPoolShort` unless a purchase
    /// was never collected (the deficit): the statements holding its purchases are posted first.
    /// @param total Sum of fees and debits as signed, credit purchases excluded; the most the
    /// epoch can ever pay out.
    /// @param charges Per-query fees (queries funded or refunded, each <= its deposit) and
    /// per-(payer, gateway) debits (pairs strictly ascending, payer first).
    /// @param sigs Committee signatures.
    function postPayoutRoot(uint64 epoch, bytes32 root, uint256 total, Charges calldata charges, bytes[] calldata sigs)
        external
    {
        if (_epochs[epoch].status != EpochStatus.None) revert EpochAlreadyPosted(epoch);
        if (root == bytes32(0)) revert ZeroRoot();
        bytes32 queriesHash = _queriesHash(charges);
        // INVARIANT: the statement names this escrow as its consumer (no replay on another deployment).
        committee.verify(PlanetHashes.payoutRoot(epoch, root, total, queriesHash, address(this)), sigs);
        // A page that charges per-query deposits pays one gateway: the one its first query's
        // deposit names (address(0) for a page without queries: pool pages, prepaid-only pages).
        address payee = charges.queryIds.length == 0 ? address(0) : _terms[charges.queryIds[0]].gateway;
        (uint256 signed, uint256 uncharged) = _chargeQueries(epoch, charges.queryIds, charges.fees, payee);
        if (charges.payers.length != 0) {
            if (payee != address(0)) _checkDebitsPay(payee, charges.payers, charges.gateways);
            (uint256 signedDebits, uint256 unchargedDebits) =
                _chargePayers(epoch, charges.payers, charges.gateways, charges.debits);
            signed += signedDebits;
            uncharged += unchargedDebits;
        }
        // INVARIANT: the signed total is exactly the fees and debits the statement lists.
        if (signed != total) revert TotalMismatch(total, signed);
        // INVARIANT: a per-query fee is paid only to the gateway its deposit names: a page with
        // queries has exactly one leaf, (epoch, payee, total), so nobody else can claim from it.
        if (payee != address(0) && root != PlanetHashes.payoutLeaf(epoch, payee, total)) {
            revert RootNotPayee(epoch, payee, total);
        }
        uint256 collected = signed - uncharged;
        bool short = uncharged != 0;
        if (short) {
            _shortfalls[epoch] = Shortfall({total: SafeCast.toUint128(signed), collected: uint128(collected)});
            emit SettlementShortfall(epoch, signed, collected);
        }
        uint256 claimableAt = block.timestamp + challengeWindow;
        // INVARIANT: the epoch holds exactly what it collected.
        // `collected` wei sit in this contract, so it fits 128 bits (2^128 wei exceed all ether).
        _epochs[epoch] = EpochInfo({
            unclaimed: uint128(collected),
            claimableAt: uint64(claimableAt),
            status: EpochStatus.Posted,
            short: short
        });
        rootOf[epoch] = root;
        emit PayoutRootPosted(epoch, root, total, queriesHash, claimableAt);
    }

    /// @notice Pays `account` its payout for `epoch` once the challenge window has passed; only
    /// `account` itself may claim (pull payment to the caller). An epoch that collected less than
    /// its signed total pays `amount * collected / total` (rounded down).
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
        uint256 paid = amount;
        if (e.short) {
            Shortfall memory s = _shortfalls[epoch];
            paid = Math.mulDiv(amount, s.collected, s.total);
        }
        // INVARIANT: an epoch never pays more than it collected.
        if (paid > e.unclaimed) revert ExceedsUnclaimed(epoch, paid, e.unclaimed);
        claimed[epoch][account] = true;
        _epochs[epoch].unclaimed = uint128(e.unclaimed - paid);
        emit Claimed(epoch, account, paid);
        if (paid != 0) {
            (bool ok,) = payable(msg.sender).call{value: paid}(""); // the caller is account
            if (!ok) revert TransferFailed(msg.sender, paid);
        }
    }

    /// @notice Proves committee equivocation on `epoch` within its challenge window: the posted
    /// statement (re-supplied as its charges and signatures) and `other` are two different
    /// committee-signed `PayoutRoot`s for the same epoch (the same statement signed twice is not
    /// equivocation: `SameStatement`). The epoch is frozen and every charge goes back: each
    /// charged query gets its fee back (pull with `refund`), each (payer, gateway) debit returns to
    /// that balance.
    /// @param epoch The posted epoch.
    /// @param charges The posted charges (from the `postPayoutRoot` call).
    /// @param postedSigs Committee signatures over the posted statement.
    /// @param other The conflicting statement.
    /// @param otherSigs Committee signatures over `other`.
    function disputeRoot(
        uint64 epoch,
        Charges calldata charges,
        bytes[] calldata postedSigs,
        PayoutStatement calldata other,
        bytes[] calldata otherSigs
    ) external {
        EpochInfo memory e = _epochs[epoch];
        if (e.status != EpochStatus.Posted) revert EpochNotPosted(epoch);
        // INVARIANT: disputes only before claims open, so the epoch still holds all it collected.
        if (block.timestamp >= e.claimableAt) revert ChallengeWindowClosed(epoch, e.claimableAt);
        uint256 postedTotal = e.short ? _shortfalls[epoch].total : e.unclaimed;
        _verifyEquivocation(epoch, postedTotal, _queriesHash(charges), postedSigs, other, otherSigs);
        uint256 sum = _returnFees(charges.queryIds, charges.fees)
            + _returnDebits(epoch, charges.payers, charges.gateways, charges.debits);
        // INVARIANT: exactly what the epoch collected goes back to users.
        if (sum != e.unclaimed) revert TotalMismatch(e.unclaimed, sum);
        _epochs[epoch] =
            EpochInfo({unclaimed: 0, claimableAt: e.claimableAt, status: EpochStatus.Disputed, short: e.short});
        emit RootDisputed(epoch, other.root, other.total, other.queriesHash);
    }

    /// @notice True iff `queryId` is funded and not yet settled or refunded (what a gateway checks).
    function isFunded(bytes32 queryId) external view returns (bool) {
        return _deposits[queryId].tag >= TAG_FIRST_TIME;
    }

    /// @notice Everything a gateway checks before serving, in one call: the depositor, the wei the
    /// query still holds, its status, its deposit time (0 once settled or refunded), the model it
    /// is for and the gateway it is paid to (both 0 for an unknown query).
    function depositOf(bytes32 queryId)
        external
        view
        returns (
            address user,
            uint256 amount,
            QueryStatus status,
            uint256 depositedAt,
            bytes32 modelId,
            address gateway
        )
    {
        Terms memory t = _terms[queryId];
        gateway = t.gateway;
        if (t.model != 0) modelId = _modelIds[t.model - 1];
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

    /// @notice `payer`'s prepaid balance at `gateway` and when its requested withdrawal opens
    /// (0: none).
    function prepaidOf(address payer, address gateway) external view returns (uint256 balance, uint256 withdrawableAt) {
        Account memory a = _accounts[payer][gateway];
        return (a.balance, a.withdrawableAt);
    }

    /// @notice For an epoch that collected less than it signed: the signed total and what was
    /// collected (both 0 when nothing was short).
    function shortfallOf(uint64 epoch) external view returns (uint256 total, uint256 collected) {
        Shortfall memory s = _shortfalls[epoch];
        return (s.total, s.collected);
    }

    /// @notice The part of `payer`'s signed debit at `gateway` in `epoch` that its balance there
    /// could not cover.
    function unchargedOf(uint64 epoch, address payer, address gateway) external view returns (uint256) {
        return _uncharged[epoch][payer][gateway];
    }

    /// @dev The index `_terms` stores for `modelId`, adding the model at its first deposit.
    function _modelIndexOf(bytes32 modelId) private returns (uint96 index) {
        index = _modelIndex[modelId];
        if (index == 0) {
            _modelIds.push(modelId);
            // At most one model per deposit: the count never nears 2^96.
            index = uint96(_modelIds.length);
            _modelIndex[modelId] = index;
        }
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

    /// @dev Checks the arrays pair up and returns `keccak256(abi.encode(queryIds, fees, payers,
    /// gateways, debits))` (`PlanetHashes.queriesHash`), hashed straight from calldata: a
    /// canonically encoded `Charges` tuple is byte for byte that encoding (five head offsets, then
    /// each array's length and words), so no copy through the ABI encoder (~1k gas on every posting).
    /// A non-canonical encoding hashes to something the committee never signed and reverts in
    /// `committee.verify`; if the bytes do match, the decoder reads the same values from them.
    function _queriesHash(Charges calldata c) private pure returns (bytes32 hash) {
        uint256 n = c.queryIds.length;
        uint256 m = c.payers.length;
        if (n != c.fees.length) revert LengthMismatch(n, c.fees.length);
        if (m != c.gateways.length) revert LengthMismatch(m, c.gateways.length);
        if (m != c.debits.length) revert LengthMismatch(m, c.debits.length);
        uint256 size = 320 + 64 * n + 96 * m;
        assembly ("memory-safe") {
            let ptr := mload(0x40)
            calldatacopy(ptr, c, size)
            hash := keccak256(ptr, size)
        }
    }

    /// @dev Charges each funded query its fee (each must be bound to `payee`); a query its user
    /// refunded after the timeout is skipped. Returns the signed sum of fees and the part of it not collected.
    function _chargeQueries(uint64 epoch, bytes32[] calldata queryIds, uint256[] calldata fees, address payee)
        private
        returns (uint256 signed, uint256 uncharged)
    {
        for (uint256 i = 0; i < queryIds.length; ++i) {
            Deposit storage d = _deposits[queryIds[i]];
            uint32 tag = d.tag;
            uint256 fee = fees[i];
            if (d.user != address(0)) {
                address gateway = _terms[queryIds[i]].gateway;
                // INVARIANT: a page charges only deposits bound to the gateway it pays.
                if (gateway != payee) revert WrongGatewayQuery(queryIds[i], gateway, payee);
            }
            signed += fee;
            if (tag >= TAG_FIRST_TIME) {
                uint256 available = d.amount;
                // INVARIANT: a query never pays more than it deposited.
                if (fee > available) revert FeeExceedsDeposit(queryIds[i], fee, available);
                d.amount = uint64(available - fee);
                d.tag = TAG_SETTLED;
            } else if (tag == TAG_REFUNDED && d.user != address(0)) {
                // The user took the deposit back after refundTimeout: nothing to charge.
                uncharged += fee;
                emit QueryUncharged(epoch, queryIds[i], fee);
            } else {
                // INVARIANT: a query is charged at most once, and only if it was ever funded.
                revert QueryNotFunded(queryIds[i]);
            }
        }
    }

    /// @dev Reverts unless every listed debit is a balance held for `payee` (a page paying one
    /// gateway never takes another gateway's balances, nor buys or draws credits).
    function _checkDebitsPay(address payee, address[] calldata payers, address[] calldata gateways) private pure {
        for (uint256 i = 0; i < gateways.length; ++i) {
            // INVARIANT: a page that pays one gateway debits only balances held for it.
            if (gateways[i] != payee) revert WrongGatewayDebit(payers[i], gateways[i], payee);
        }
    }

    /// @dev Debits each (payer, gateway) (pairs strictly ascending, payer first) up to its
    /// balance; a (payer, escrow) pair is a credit purchase into the pool (outside the signed
    /// total), the (escrow, escrow) pair a draw from it, charged last. Returns the signed sum of
    /// debits and the part of it not collected.
    function _chargePayers(
        uint64 epoch,
        address[] calldata payers,
        address[] calldata gateways,
        uint256[] calldata debits
    ) private returns (uint256 signed, uint256 uncharged) {
        // Starting above (0, every gateway): the zero payer is never listed.
        address previousPayer = address(0);
        address previousGateway = address(type(uint160).max);
        uint256 poolAt = payers.length; // the (escrow, escrow) draw: charged after the purchases
        for (uint256 i = 0; i < payers.length; ++i) {
            address payer = payers[i];
            address gateway = gateways[i];
            // INVARIANT: one debit per (payer, gateway) per epoch.
            if (payer < previousPayer || (payer == previousPayer && gateway <= previousGateway)) {
                revert PayersNotSorted(i);
            }
            previousPayer = payer;
            previousGateway = gateway;
            if (gateway != address(this)) {
                signed += debits[i];
                uncharged += debits[i] - _debit(epoch, payer, gateway, debits[i]);
            } else if (payer == address(this)) {
                poolAt = i;
            } else {
                _buyCredits(epoch, payer, debits[i]);
            }
        }
        if (poolAt < payers.length) {
            signed += debits[poolAt];
            uncharged += debits[poolAt] - _drawPool(epoch, debits[poolAt]);
        }
    }

    /// @dev A credit purchase: `payer`'s balance at this escrow pays `amount` into the credit
    /// pool (not into this statement: the pool pays the nodes that redeem the credits, in the
    /// statements of the epochs they redeem them). What the balance could not pay is the pool's
    /// deficit.
    function _buyCredits(uint64 epoch, address payer, uint256 amount) private {
        uint256 charged = _debit(epoch, payer, address(this), amount);
        Account storage pool = _accounts[address(this)][address(this)];
        uint256 balance = uint256(pool.balance) + charged;
        pool.balance = SafeCast.toUint128(balance);
        if (charged < amount) creditPoolDeficit += amount - charged;
        emit CreditsBought(epoch, payer, amount, charged, balance);
    }

    /// @dev Pays `draw` from the credit pool into this statement. Short only by the deficit of
    /// purchases never collected (claims then pay pro rata); a draw beyond the pool and that
    /// deficit means the statements holding its purchases are not posted yet: it reverts, and
    /// the statement is posted after them.
    function _drawPool(uint64 epoch, uint256 draw) private returns (uint256 charged) {
        Account storage pool = _accounts[address(this)][address(this)];
        uint256 balance = pool.balance;
        charged = draw;
        if (draw > balance) {
            uint256 missing = draw - balance;
            // INVARIANT: the pool never pays out a purchase that is still to be posted.
            if (missing > creditPoolDeficit) revert CreditPoolShort(epoch, draw, balance);
            creditPoolDeficit -= missing;
            charged = balance;
            _uncharged[epoch][address(this)][address(this)] = missing;
            emit DebitShortfall(epoch, address(this), address(this), draw, charged);
        }
        pool.balance = uint128(balance - charged);
        emit Debited(epoch, address(this), address(this), charged, balance - charged);
    }

    /// @dev Debits `payer`'s balance at `gateway` up to what it holds; returns the wei charged.
    function _debit(uint64 epoch, address payer, address gateway, uint256 debit) private returns (uint256 charged) {
        Account storage a = _accounts[payer][gateway];
        uint256 balance = a.balance;
        // INVARIANT: a gateway's debit takes only from the balance deposited for that gateway.
        charged = debit <= balance ? debit : balance;
        a.balance = uint128(balance - charged);
        if (charged < debit) {
            _uncharged[epoch][payer][gateway] = debit - charged;
            emit DebitShortfall(epoch, payer, gateway, debit, charged);
        }
        emit Debited(epoch, payer, gateway, charged, balance - charged);
    }

    /// @dev Gives every listed query its fee back if it was charged; returns the sum returned.
    function _returnFees(bytes32[] calldata queryIds, uint256[] calldata fees) private returns (uint256 sum) {
        for (uint256 i = 0; i < queryIds.length; ++i) {
            Deposit storage d = _deposits[queryIds[i]];
            uint32 tag = d.tag;
            if (tag == TAG_REFUNDED && d.user != address(0)) continue; // never charged (refunded)
            // INVARIANT: each settled query gets its fee back once.
            if (d.user == address(0) || tag != TAG_SETTLED) revert QueryNotSettled(queryIds[i]);
            d.amount = SafeCast.toUint64(uint256(d.amount) + fees[i]);
            d.tag = TAG_RECLAIMED;
            sum += fees[i];
        }
    }

    /// @dev Returns each (payer, gateway) balance what the epoch actually debited it; returns
    /// the sum returned.
    function _returnDebits(
        uint64 epoch,
        address[] calldata payers,
        address[] calldata gateways,
        uint256[] calldata debits
    ) private returns (uint256 sum) {
        for (uint256 i = 0; i < payers.length; ++i) {
            address payer = payers[i];
            address gateway = gateways[i];
            // a credit purchase stays in the pool: its credits were issued and are spendable
            if (gateway == address(this) && payer != address(this)) continue;
            uint256 charged = debits[i] - _uncharged[epoch][payer][gateway];
            Account storage a = _accounts[payer][gateway];
            uint256 balance = uint256(a.balance) + charged;
            a.balance = SafeCast.toUint128(balance);
            sum += charged;
            emit DebitReturned(epoch, payer, gateway, charged);
        }
    }
}
