// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
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
/// - a committee-signed `Verdict` → the verdict's offence percentage;
/// - a ZK proof accepted by `faultVerifier` against a node-signed `Reveal` → failed verification.
/// The caller of a node-signed proof is the challenger and earns half of the slash. Each
/// (node, session, step, shard) and each (node, verdict evidence) is slashed at most once.
/// Deployed by `Staking`'s constructor.
contract FraudProofs is EIP712 {
    /// @notice Where slashes are executed.
    IStaking public immutable staking;
    /// @notice Whose signatures verdicts need.
    ICommittee public immutable committee;
    /// @notice ZK fault verifier (zero: `proveComputationFault` disabled).
    IComputationFaultVerifier public immutable faultVerifier;

    /// @notice Evidence ids already slashed.
    mapping(bytes32 evidenceId => bool) public proven;
    /// @notice Verdict nonces already used.
    mapping(uint64 nonce => bool) public verdictNonceUsed;

    /// @notice Evidence `evidenceId` slashed `node` for `offence`; `slashed` wei left its stake.
    event FaultProven(
        bytes32 indexed evidenceId, address indexed node, Offence offence, address challenger, uint256 slashed
    );

    error InvalidNodeSignature(uint256 index);
    error SignerMismatch(address first, address second);
    error DifferentSlot();
    error NotAFault();
    error AlreadyProven(bytes32 evidenceId);
    error VerdictNonceUsed(uint64 nonce);
    error FaultVerifierDisabled();

    /// @param staking_ Staking contract (the deployer).
    /// @param committee_ Committee for verdicts.
    /// @param faultVerifier_ ZK fault verifier or zero.
    constructor(IStaking staking_, ICommittee committee_, IComputationFaultVerifier faultVerifier_)
        EIP712("Planet Fraud Proofs", "1")
    {
        staking = staking_;
        committee = committee_;
        faultVerifier = faultVerifier_;
    }

    /// @notice Proves that a node revealed something that does not open its signed commitment and
    /// slashes it 100 % (`Offence.CommitRevealMismatch`); the caller is the challenger.
    /// @param c Node-signed commitment.
    /// @param commitmentSig Node's signature over `c`.
    /// @param r Node-signed reveal for the same (session, step, shard).
    /// @param revealSig Node's signature over `r`.
    /// @return slashed Amount removed from the node's stake.
    function proveRevealMismatch(
        Commitment calldata c,
        bytes calldata commitmentSig,
        Reveal calldata r,
        bytes calldata revealSig
    ) external returns (uint256 slashed) {
        address node = _recover(PlanetHashes.commitment(c), commitmentSig, 0);
        address revealer = _recover(PlanetHashes.reveal(r), revealSig, 1);
        // INVARIANT: both statements come from the same node, about the same slot.
        if (node != revealer) revert SignerMismatch(node, revealer);
        if (c.session != r.session || c.step != r.step || c.shard != r.shard) revert DifferentSlot();
        // INVARIANT: only a reveal that does not hash to the commitment is a fault.
        if (PlanetHashes.commitmentValue(r) == c.commitment) revert NotAFault();
        return _slash(evidenceId(node, c.session, c.step, c.shard), node, Offence.CommitRevealMismatch, msg.sender);
    }

    /// @notice Proves that a node signed two different commitments for one (session, step, shard)
    /// and slashes it 100 % (`Offence.Equivocation`); the caller is the challenger.
    /// @param a First node-signed commitment.
    /// @param sigA Signature over `a`.
    /// @param b Second node-signed commitment.
    /// @param sigB Signature over `b`.
    /// @return slashed Amount removed from the node's stake.
    function proveEquivocation(Commitment calldata a, bytes calldata sigA, Commitment calldata b, bytes calldata sigB)
        external
        returns (uint256 slashed)
    {
        address node = _recover(PlanetHashes.commitment(a), sigA, 0);
        address other = _recover(PlanetHashes.commitment(b), sigB, 1);
        if (node != other) revert SignerMismatch(node, other);
        if (a.session != b.session || a.step != b.step || a.shard != b.shard) revert DifferentSlot();
        // INVARIANT: equivocation means two different values for one slot.
        if (a.commitment == b.commitment) revert NotAFault();
        return _slash(evidenceId(node, a.session, a.step, a.shard), node, Offence.Equivocation, msg.sender);
    }

    /// @notice Slashes on a committee-signed `Verdict(address node,uint8 offence,bytes32 evidenceHash,
    /// address challenger,uint64 nonce)`; the verdict's challenger earns the reward.
    /// @param v The verdict (offence 1..5, single-use nonce).
    /// @param sigs Committee signatures (ascending signers, >= 2/3 power).
    /// @return slashed Amount removed from the node's stake.
    function slashByVerdict(Verdict calldata v, bytes[] calldata sigs) external returns (uint256 slashed) {
        Offence offence = Offences.fromUint8(v.offence);
        // INVARIANT: a signed verdict is single-use.
        if (verdictNonceUsed[v.nonce]) revert VerdictNonceUsed(v.nonce);
        committee.verify(PlanetHashes.verdict(v), sigs);
        verdictNonceUsed[v.nonce] = true;
        return _slash(verdictEvidenceId(v.node, v.evidenceHash), v.node, offence, v.challenger);
    }

    /// @notice Slashes `Offence.FailedVerification` when `faultVerifier` accepts `proof` as showing
    /// that the node-signed reveal's output hash is wrong; the caller is the challenger.
    /// @param r Node-signed reveal.
    /// @param revealSig Node's signature over `r`.
    /// @param proof Proof for `faultVerifier.verifyFault(proof, r.outputHash)`.
    /// @return slashed Amount removed from the node's stake.
    function proveComputationFault(Reveal calldata r, bytes calldata revealSig, bytes calldata proof)
        external
        returns (uint256 slashed)
    {
        IComputationFaultVerifier verifier = faultVerifier;
        if (address(verifier) == address(0)) revert FaultVerifierDisabled();
        address node = _recover(PlanetHashes.reveal(r), revealSig, 0);
        // INVARIANT: only a verified proof of a wrong output is a fault.
        if (!verifier.verifyFault(proof, r.outputHash)) revert NotAFault();
        return _slash(evidenceId(node, r.session, r.step, r.shard), node, Offence.FailedVerification, msg.sender);
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

    function _slash(bytes32 id, address node, Offence offence, address challenger) private returns (uint256 slashed) {
        // INVARIANT: each piece of evidence slashes once.
        if (proven[id]) revert AlreadyProven(id);
        proven[id] = true;
        slashed = staking.slash(node, offence, challenger);
        // Accepted slither "reentrancy-events" (low): the event needs the slashed amount returned by
        // Staking, a fixed trusted contract (this contract's deployer) that re-enters nothing.
        emit FaultProven(id, node, offence, challenger, slashed);
    }

    function _recover(bytes32 structHash, bytes calldata sig, uint256 index) private view returns (address signer) {
        ECDSA.RecoverError err;
        bytes32 errArg;
        (signer, err, errArg) = ECDSA.tryRecoverCalldata(_hashTypedDataV4(structHash), sig);
        // INVARIANT: only well-formed, non-malleable signatures identify a node (any error detail fails).
        if (err != ECDSA.RecoverError.NoError || errArg != bytes32(0)) revert InvalidNodeSignature(index);
    }
}
