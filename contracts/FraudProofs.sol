// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Math} from "@openzeppelin/contracts/utils/math/Math.sol";
import {ICommittee} from "./interfaces/ICommittee.sol";
import {IComputationFaultVerifier} from "./interfaces/IComputationFaultVerifier.sol";
import {IStaking} from "./interfaces/IStaking.sol";
import {Offences} from "./libraries/Offences.sol";
import {PlanetHashes} from "./libraries/PlanetHashes.sol";
import {Commitment, Offence, Reveal, Verdict} from "./libraries/PlanetTypes.sol";

/// @title FraudProofs: turns evidence into slashes.
/// @notice Three kinds of evidence:
/// - provable by anyone from node-signed EIP-712 structs (domain {name: "Planet Fraud Proofs",
///   version: "1", chainId, verifyingContract: this}): a `Reveal` that does not open its signed
///   `Commitment`, or two different signed `Commitment`s for one (session, step, shard) → 100 %;
/// - a committee-signed `Verdict` naming this contract as its `consumer` → its offence's share;
/// - a ZK proof accepted by `faultVerifier` against the node-signed `Reveal` (slot, model, input and
///   output as the node signed them) → failed verification (50 %).
///
/// Challengers commit before they reveal: `commitChallenge(challengeCommitment(challenger,
/// evidenceId, offence, salt))` in one block, the proof (with `salt`, sent by `challenger`) in a
/// later block. The evidence is public once a proof is in the mempool, so any field naming the
/// challenger could be copied with another name; a commitment mined before the proof was broadcast
/// cannot be. The challenger earns half of the slash.
///
/// Each piece of evidence — (node, session, step, shard) for node-signed proofs, (node,
/// evidenceHash) for verdicts — costs its node its highest offence's share once: a larger offence
/// proven after a smaller one tops the slash up to the larger share, a smaller or equal one reverts
/// `AlreadyProven`.
///
/// Anyone holding node-signed work can `recordCommitment` / `recordReveal` it: the node's stake
/// then cannot be withdrawn until `challengeWindow` seconds after the work's `signedAt`.
/// Deployed by `Staking`'s constructor.
contract FraudProofs is EIP712 {
    /// @notice Where slashes are executed.
    IStaking public immutable staking;
    /// @notice Whose signatures verdicts need.
    ICommittee public immutable committee;
    /// @notice ZK fault verifier (zero: `proveComputationFault` disabled).
    IComputationFaultVerifier public immutable faultVerifier;
    /// @notice Seconds after a node signed work during which fraud about it must stay provable.
    uint256 public immutable challengeWindow;

    /// @notice Highest penalty (basis points) each piece of evidence has cost its node so far.
    mapping(bytes32 evidenceId => uint256 bps) public penaltyOf;
    /// @notice Verdict nonces already used.
    mapping(uint64 nonce => bool) public verdictNonceUsed;
    /// @notice Block in which each challenge commitment was made (0: none).
    mapping(bytes32 commitment => uint256 blockNumber) public challengeCommittedAt;

    /// @notice Evidence `evidenceId` slashed `node` for `offence`; `slashed` wei left its stake.
    event FaultProven(
        bytes32 indexed evidenceId, address indexed node, Offence offence, address challenger, uint256 slashed
    );
    /// @notice `committer` committed to a challenge (`commitment` hides challenger, evidence, salt).
    event ChallengeCommitted(bytes32 indexed commitment, address indexed committer, uint256 blockNumber);
    /// @notice Work `node` signed at `signedAt` keeps its stake until `lockedUntil`.
    event WorkRecorded(address indexed node, bytes32 structHash, uint256 signedAt, uint256 lockedUntil);

    error InvalidNodeSignature(uint256 index);
    error SignerMismatch(address first, address second);
    error DifferentSlot();
    error NotAFault();
    error AlreadyProven(bytes32 evidenceId);
    error VerdictNonceUsed(uint64 nonce);
    error FaultVerifierDisabled();
    error WrongConsumer(address consumer);
    error ZeroCommitment();
    error ChallengeNotCommitted(bytes32 commitment);
    error ChallengeNotMatured(bytes32 commitment, uint256 committedAt);

    /// @param staking_ Staking contract (the deployer).
    /// @param committee_ Committee for verdicts.
    /// @param faultVerifier_ ZK fault verifier or zero.
    /// @param challengeWindow_ Seconds fraud about signed work must stay provable.
    constructor(
        IStaking staking_,
        ICommittee committee_,
        IComputationFaultVerifier faultVerifier_,
        uint256 challengeWindow_
    ) EIP712("Planet Fraud Proofs", "1") {
        staking = staking_;
        committee = committee_;
        faultVerifier = faultVerifier_;
        challengeWindow = challengeWindow_;
    }

    // --- challenger commitments -----------------------------------------------------------------

    /// @notice Commits to a challenge; reveal it by sending the proof from the committed challenger
    /// with the committed salt in a later block. Committing an existing commitment changes nothing
    /// (its earliest block is kept), so copying a commitment from the mempool gains nothing.
    /// @param commitment `challengeCommitment(challenger, evidenceId, offence, salt)`.
    /// @return committedAt The block the commitment counts from.
    function commitChallenge(bytes32 commitment) external returns (uint256 committedAt) {
        if (commitment == bytes32(0)) revert ZeroCommitment();
        committedAt = challengeCommittedAt[commitment];
        if (committedAt != 0) return committedAt;
        committedAt = block.number;
        challengeCommittedAt[commitment] = committedAt;
        emit ChallengeCommitted(commitment, msg.sender, committedAt);
    }

    /// @notice The value a challenger commits: keccak256(abi.encode(challenger, evidenceId,
    /// uint8 offence, salt)).
    function challengeCommitment(address challenger, bytes32 evidence, Offence offence, bytes32 salt)
        public
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(challenger, evidence, uint8(offence), salt));
    }

    // --- node-signed evidence -------------------------------------------------------------------

    /// @notice Proves that a node revealed something that does not open its signed commitment and
    /// slashes it 100 % (`Offence.CommitRevealMismatch`); the caller is the committed challenger.
    /// @param c Node-signed commitment.
    /// @param commitmentSig Node's signature over `c`.
    /// @param r Node-signed reveal for the same (session, step, shard).
    /// @param revealSig Node's signature over `r`.
    /// @param salt The caller's challenge salt (see `commitChallenge`).
    /// @return slashed Amount removed from the node's stake.
    function proveRevealMismatch(
        Commitment calldata c,
        bytes calldata commitmentSig,
        Reveal calldata r,
        bytes calldata revealSig,
        bytes32 salt
    ) external returns (uint256 slashed) {
        address node = _recover(PlanetHashes.commitment(c), commitmentSig, 0);
        address revealer = _recover(PlanetHashes.reveal(r), revealSig, 1);
        // INVARIANT: both statements come from the same node, about the same slot.
        if (node != revealer) revert SignerMismatch(node, revealer);
        if (c.session != r.session || c.step != r.step || c.shard != r.shard) revert DifferentSlot();
        // INVARIANT: only a reveal that does not hash to the commitment is a fault.
        if (PlanetHashes.commitmentValue(r) == c.commitment) revert NotAFault();
        bytes32 id = evidenceId(node, c.session, c.step, c.shard);
        _useChallenge(id, Offence.CommitRevealMismatch, salt);
        return _penalize(id, node, Offence.CommitRevealMismatch, msg.sender);
    }

    /// @notice Proves that a node signed two different commitments for one (session, step, shard)
    /// and slashes it 100 % (`Offence.Equivocation`); the caller is the committed challenger.
    /// @param a First node-signed commitment.
    /// @param sigA Signature over `a`.
    /// @param b Second node-signed commitment.
    /// @param sigB Signature over `b`.
    /// @param salt The caller's challenge salt.
    /// @return slashed Amount removed from the node's stake.
    function proveEquivocation(
        Commitment calldata a,
        bytes calldata sigA,
        Commitment calldata b,
        bytes calldata sigB,
        bytes32 salt
    ) external returns (uint256 slashed) {
        address node = _recover(PlanetHashes.commitment(a), sigA, 0);
        address other = _recover(PlanetHashes.commitment(b), sigB, 1);
        if (node != other) revert SignerMismatch(node, other);
        if (a.session != b.session || a.step != b.step || a.shard != b.shard) revert DifferentSlot();
        // INVARIANT: equivocation means two different values for one slot (re-signing the same
        // value at another time is not a fault).
        if (a.commitment == b.commitment) revert NotAFault();
        bytes32 id = evidenceId(node, a.session, a.step, a.shard);
        _useChallenge(id, Offence.Equivocation, salt);
        return _penalize(id, node, Offence.Equivocation, msg.sender);
    }

    /// @notice Slashes `Offence.FailedVerification` (50 %) when `faultVerifier` accepts `proof`
    /// against the node-signed reveal: the claim that shard `r.shard` of the model `r.manifestHash`
    /// turned input `r.inputHash` into output `r.outputHash`. The caller is the committed challenger.
    /// @param r Node-signed reveal (the claim judged).
    /// @param revealSig Node's signature over `r`.
    /// @param proof Proof for `faultVerifier.verifyFault(proof, r)`.
    /// @param salt The caller's challenge salt.
    /// @return slashed Amount removed from the node's stake.
    function proveComputationFault(Reveal calldata r, bytes calldata revealSig, bytes calldata proof, bytes32 salt)
        external
        returns (uint256 slashed)
    {
        IComputationFaultVerifier verifier = faultVerifier;
        if (address(verifier) == address(0)) revert FaultVerifierDisabled();
        address node = _recover(PlanetHashes.reveal(r), revealSig, 0);
        // INVARIANT: only a verified proof against exactly what the node signed is a fault.
        if (!verifier.verifyFault(proof, r)) revert NotAFault();
        bytes32 id = evidenceId(node, r.session, r.step, r.shard);
        _useChallenge(id, Offence.FailedVerification, salt);
        return _penalize(id, node, Offence.FailedVerification, msg.sender);
    }

    /// @notice Records node-signed work so that the node cannot withdraw its stake until
    /// `c.signedAt + challengeWindow + 1`.
    /// @param c Node-signed commitment.
    /// @param sig Node's signature over `c`.
    /// @return lockedUntil Earliest time the node can withdraw.
    function recordCommitment(Commitment calldata c, bytes calldata sig) external returns (uint256 lockedUntil) {
        bytes32 structHash = PlanetHashes.commitment(c);
        return _record(structHash, _recover(structHash, sig, 0), c.signedAt);
    }

    /// @notice Records a node-signed reveal, like `recordCommitment`.
    /// @param r Node-signed reveal.
    /// @param sig Node's signature over `r`.
    /// @return lockedUntil Earliest time the node can withdraw.
    function recordReveal(Reveal calldata r, bytes calldata sig) external returns (uint256 lockedUntil) {
        bytes32 structHash = PlanetHashes.reveal(r);
        return _record(structHash, _recover(structHash, sig, 0), r.signedAt);
    }

    // --- committee verdicts ---------------------------------------------------------------------

    /// @notice Slashes on a committee-signed `Verdict(address node,uint8 offence,bytes32
    /// evidenceHash,address challenger,uint64 nonce,address consumer)` with `consumer == this`; the
    /// verdict's challenger earns the reward.
    /// @param v The verdict (offence 1..5, single-use nonce).
    /// @param sigs Committee signatures (ascending signers, >= 2/3 power).
    /// @return slashed Amount removed from the node's stake.
    function slashByVerdict(Verdict calldata v, bytes[] calldata sigs) external returns (uint256 slashed) {
        // INVARIANT: a verdict binds the deployment it is for.
        if (v.consumer != address(this)) revert WrongConsumer(v.consumer);
        Offence offence = Offences.fromUint8(v.offence);
        // INVARIANT: a signed verdict is single-use.
        if (verdictNonceUsed[v.nonce]) revert VerdictNonceUsed(v.nonce);
        committee.verify(PlanetHashes.verdict(v), sigs);
        verdictNonceUsed[v.nonce] = true;
        return _penalize(verdictEvidenceId(v.node, v.evidenceHash), v.node, offence, v.challenger);
    }

    // --- views ----------------------------------------------------------------------------------

    /// @notice Whether evidence `id` has slashed its node at all.
    function proven(bytes32 id) external view returns (bool) {
        return penaltyOf[id] != 0;
    }

    /// @notice Evidence id of a node-signed fault: keccak256(abi.encode(node, session, step, shard)).
    function evidenceId(address node, bytes32 session, uint64 step, uint32 shard) public pure returns (bytes32) {
        return keccak256(abi.encode(node, session, step, shard));
    }

    /// @notice Evidence id of a verdict: keccak256(abi.encode(node, evidenceHash)).
    function verdictEvidenceId(address node, bytes32 evidenceHash) public pure returns (bytes32) {
        return keccak256(abi.encode(node, evidenceHash));
    }

    /// @notice The EIP-712 domain separator nodes sign commitments and reveals under.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // --- internals ------------------------------------------------------------------------------

    /// @dev Consumes the caller's matured commitment to (evidence `id`, `offence`, `salt`).
    function _useChallenge(bytes32 id, Offence offence, bytes32 salt) private {
        bytes32 commitment = challengeCommitment(msg.sender, id, offence, salt);
        uint256 committedAt = challengeCommittedAt[commitment];
        if (committedAt == 0) revert ChallengeNotCommitted(commitment);
        // INVARIANT: the commitment was mined before the block of its proof, so nobody who first saw
        // the proof in the mempool can hold a commitment that counts.
        if (committedAt >= block.number) revert ChallengeNotMatured(commitment, committedAt);
        delete challengeCommittedAt[commitment];
    }

    /// @dev Charges evidence `id` up to `offence`'s share: the first proof slashes the share, a
    /// larger offence later slashes ceil((new - old) / (100 % - old)) of what is left, so the node
    /// loses the larger share of the stake it had at the first slash.
    function _penalize(bytes32 id, address node, Offence offence, address challenger)
        private
        returns (uint256 slashed)
    {
        uint256 target = Offences.slashBps(offence);
        uint256 applied = penaltyOf[id];
        // INVARIANT: a smaller or equal penalty never pre-empts nor repeats a larger one.
        if (target <= applied) revert AlreadyProven(id);
        penaltyOf[id] = target;
        // applied < target <= BPS, so the divisor is positive and the share is at most BPS.
        uint256 bps = Math.ceilDiv((target - applied) * Offences.BPS, Offences.BPS - applied);
        slashed = staking.slash(node, offence, bps, challenger);
        // Accepted slither "reentrancy-events" (low): the event needs the slashed amount returned by
        // Staking, a fixed trusted contract (this contract's deployer) that re-enters nothing.
        emit FaultProven(id, node, offence, challenger, slashed);
    }

    function _record(bytes32 structHash, address node, uint64 signedAt) private returns (uint256 lockedUntil) {
        lockedUntil = staking.lockUntil(node, uint256(signedAt) + challengeWindow + 1);
        // Accepted slither "reentrancy-events" (low): same trusted Staking as above.
        emit WorkRecorded(node, structHash, signedAt, lockedUntil);
    }

    function _recover(bytes32 structHash, bytes calldata sig, uint256 index) private view returns (address signer) {
        ECDSA.RecoverError err;
        bytes32 errArg;
        (signer, err, errArg) = ECDSA.tryRecoverCalldata(_hashTypedDataV4(structHash), sig);
        // INVARIANT: only well-formed, non-malleable signatures identify a node (any error detail fails).
        if (err != ECDSA.RecoverError.NoError || errArg != bytes32(0)) revert InvalidNodeSignature(index);
    }
}
