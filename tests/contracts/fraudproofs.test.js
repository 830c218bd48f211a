// FraudProofs: node-signed evidence (reveal mismatch, equivocation), committee verdicts, the ZK
// hook, one slash per evidence, and the 50 % challenger / 50 % burn split.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

describe("FraudProofs", function () {
  async function fixture() {
    const verifier = await (await ethers.getContractFactory("MockFaultVerifier")).deploy();
    const env = await h.deployAll({ faultVerifier: await verifier.getAddress() });
    const [deployer, node, other, challenger, node2] = await ethers.getSigners();
    await env.staking.connect(node).stake(h.Role.Compute, { value: h.ONE * 2n });
    return { ...env, deployer, node, other, challenger, node2, verifier };
  }
  async function noVerifierFixture() {
    const env = await h.deployAll();
    const [, node] = await ethers.getSigners();
    await env.staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
    return { ...env, node };
  }

  const session = ethers.id("session-1");
  const outputHash = ethers.id("output");
  const salt = ethers.id("salt");
  const honestCommitment = { session, step: 3n, shard: 1, commitment: h.commitmentValue(session, 3n, 1, outputHash, salt) };
  const honestReveal = { session, step: 3n, shard: 1, outputHash, salt };
  const lyingReveal = { ...honestReveal, outputHash: ethers.id("another output") };
  const sign1 = async (signer, dom, type, value) => (await h.signAll([signer], dom, type, value))[0];

  describe("proveRevealMismatch", function () {
    it("proveRevealMismatch_mismatch_slashesAllHalfToChallengerHalfBurned", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const id = await fraudProofs.evidenceId(node.address, session, 3n, 1);
      expect(id).to.equal(
        ethers.keccak256(ethers.AbiCoder.defaultAbiCoder().encode(["address", "bytes32", "uint64", "uint32"], [node.address, session, 3n, 1])),
      );
      const burnBefore = await ethers.provider.getBalance(h.BURN_ADDRESS);
      const tx = fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs);
      await expect(tx)
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.CommitRevealMismatch, h.ONE * 2n, challenger.address, h.ONE, h.ONE);
      await expect(tx)
        .to.emit(fraudProofs, "FaultProven")
        .withArgs(id, node.address, h.Offence.CommitRevealMismatch, challenger.address, h.ONE * 2n);
      expect(await ethers.provider.getBalance(h.BURN_ADDRESS)).to.equal(burnBefore + h.ONE);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      expect(await staking.statusOf(node.address)).to.equal(0n);
      expect(await staking.creditOf(challenger.address)).to.equal(h.ONE);
      expect(await staking.totalBurned()).to.equal(h.ONE);
      expect(await staking.totalRewarded()).to.equal(h.ONE);
      expect(await staking.totalSlashed()).to.equal(h.ONE * 2n);
      expect(await fraudProofs.proven(id)).to.equal(true);
    });
    it("proveRevealMismatch_matchingReveal_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, honestReveal, rs)).to.be.revertedWithCustomError(
        fraudProofs,
        "NotAFault",
      );
    });
    it("proveRevealMismatch_differentSigners_reverts", async function () {
      const { fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(other, fraudDomain, "Reveal", lyingReveal);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs))
        .to.be.revertedWithCustomError(fraudProofs, "SignerMismatch")
        .withArgs(node.address, other.address);
    });
    it("proveRevealMismatch_differentSlot_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      for (const r of [{ ...lyingReveal, step: 4n }, { ...lyingReveal, shard: 2 }, { ...lyingReveal, session: ethers.id("x") }]) {
        const rs = await sign1(node, fraudDomain, "Reveal", r);
        await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, r, rs)).to.be.revertedWithCustomError(fraudProofs, "DifferentSlot");
      }
    });
    it("proveRevealMismatch_malformedSignature_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, "0x1234"))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(1);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, "0x", lyingReveal, cs))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(0);
    });
    it("proveRevealMismatch_signedForOtherDomain_doesNotSlashTheNode", async function () {
      const { staking, fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const wrong = { ...fraudDomain, chainId: 1n };
      const cs = await sign1(node, wrong, "Commitment", honestCommitment);
      const rs = await sign1(node, wrong, "Reveal", lyingReveal);
      // Under this contract's domain they recover to two unrelated addresses, not to the node.
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs)).to.be.revertedWithCustomError(
        fraudProofs,
        "SignerMismatch",
      );
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE * 2n);
    });
    it("proveRevealMismatch_twice_revertsAlreadyProven", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      await fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs);
      const id = await fraudProofs.evidenceId(node.address, session, 3n, 1);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(id);
      // The same slot cannot be slashed again as equivocation either.
      const other = { ...honestCommitment, commitment: ethers.id("x") };
      const os = await sign1(node, fraudDomain, "Commitment", other);
      await expect(fraudProofs.proveEquivocation(honestCommitment, cs, other, os)).to.be.revertedWithCustomError(fraudProofs, "AlreadyProven");
    });
    it("proveRevealMismatch_unstakedNode_revertsNothingToSlash", async function () {
      const { staking, fraudProofs, fraudDomain, other } = await loadFixture(fixture);
      const cs = await sign1(other, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(other, fraudDomain, "Reveal", lyingReveal);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs))
        .to.be.revertedWithCustomError(staking, "NothingToSlash")
        .withArgs(other.address);
    });
    it("proveRevealMismatch_unbondingNode_stillSlashed", async function () {
      const { staking, fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      await staking.connect(node).requestUnstake();
      await time.increase(h.DEFAULTS.challengeWindow); // the whole challenge window later
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      await fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      await expect(staking.connect(node).withdraw()).to.be.revertedWithCustomError(staking, "NotUnbonding");
    });
  });

  describe("proveEquivocation", function () {
    const a = { session, step: 9n, shard: 0, commitment: ethers.id("a") };
    const b = { ...a, commitment: ethers.id("b") };
    it("proveEquivocation_twoCommitments_slashesAll", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sb = await sign1(node, fraudDomain, "Commitment", b);
      await expect(fraudProofs.connect(challenger).proveEquivocation(a, sa, b, sb))
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.Equivocation, h.ONE * 2n, challenger.address, h.ONE, h.ONE);
    });
    it("proveEquivocation_sameCommitment_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      await expect(fraudProofs.proveEquivocation(a, sa, a, sa)).to.be.revertedWithCustomError(fraudProofs, "NotAFault");
    });
    it("proveEquivocation_differentSlot_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const c = { ...b, step: 10n };
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sc = await sign1(node, fraudDomain, "Commitment", c);
      await expect(fraudProofs.proveEquivocation(a, sa, c, sc)).to.be.revertedWithCustomError(fraudProofs, "DifferentSlot");
    });
    it("proveEquivocation_differentSigners_reverts", async function () {
      const { fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sb = await sign1(other, fraudDomain, "Commitment", b);
      await expect(fraudProofs.proveEquivocation(a, sa, b, sb))
        .to.be.revertedWithCustomError(fraudProofs, "SignerMismatch")
        .withArgs(node.address, other.address);
    });
    it("proveEquivocation_badSignature_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      await expect(fraudProofs.proveEquivocation(a, sa, b, "0x00"))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(1);
    });
  });

  describe("slashByVerdict", function () {
    const verdictFor = (node, offence, challenger, nonce, evidence = "evidence") => ({
      node,
      offence,
      evidenceHash: ethers.id(evidence),
      challenger,
      nonce,
    });
    for (const [name, offence, bps] of [
      ["FailedVerification", h.Offence.FailedVerification, 5000n],
      ["Timeout", h.Offence.Timeout, 500n],
      ["Collusion", h.Offence.Collusion, 10000n],
      ["CommitRevealMismatch", h.Offence.CommitRevealMismatch, 10000n],
    ]) {
      it(`slashByVerdict_${name}_slashesItsShare`, async function () {
        const { staking, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
        const v = verdictFor(node.address, offence, challenger.address, 1n);
        const sigs = await h.signAll(members.slice(0, 3), committeeDomain, "Verdict", v);
        const amount = (h.ONE * 2n * bps) / 10000n;
        await expect(fraudProofs.slashByVerdict(v, sigs))
          .to.emit(staking, "Slashed")
          .withArgs(node.address, offence, amount, challenger.address, amount / 2n, amount - amount / 2n);
        expect(await staking.stakeOf(node.address)).to.equal(h.ONE * 2n - amount);
        expect(await fraudProofs.verdictNonceUsed(1n)).to.equal(true);
        expect(await fraudProofs.proven(await fraudProofs.verdictEvidenceId(node.address, v.evidenceHash))).to.equal(true);
      });
    }
    it("slashByVerdict_partialSlash_nodeNoLongerEligibleBelowMinimum", async function () {
      const { staking, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.FailedVerification, challenger.address, 1n);
      await fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v));
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE);
      expect(await staking.isEligible(node.address)).to.equal(true);
      const v2 = verdictFor(node.address, h.Offence.Timeout, challenger.address, 2n, "late");
      await fraudProofs.slashByVerdict(v2, await h.signAll(members, committeeDomain, "Verdict", v2));
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE - h.ONE / 20n);
      expect(await staking.isEligible(node.address)).to.equal(false);
      expect(await staking.statusOf(node.address)).to.equal(1n);
    });
    it("slashByVerdict_invalidOffence_reverts", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      for (const offence of [0, 6]) {
        const v = verdictFor(node.address, offence, challenger.address, 1n);
        const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
        await expect(fraudProofs.slashByVerdict(v, sigs)).to.be.revertedWithCustomError(fraudProofs, "InvalidOffence").withArgs(offence);
      }
    });
    it("slashByVerdict_replayedNonce_reverts", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.Timeout, challenger.address, 7n);
      const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
      await fraudProofs.slashByVerdict(v, sigs);
      await expect(fraudProofs.slashByVerdict(v, sigs)).to.be.revertedWithCustomError(fraudProofs, "VerdictNonceUsed").withArgs(7n);
    });
    it("slashByVerdict_sameEvidenceNewNonce_revertsAlreadyProven", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.Timeout, challenger.address, 1n);
      await fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v));
      const v2 = { ...v, nonce: 2n };
      await expect(fraudProofs.slashByVerdict(v2, await h.signAll(members, committeeDomain, "Verdict", v2)))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(await fraudProofs.verdictEvidenceId(node.address, v.evidenceHash));
    });
    it("slashByVerdict_insufficientSignatures_reverts", async function () {
      const { committee, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.Collusion, challenger.address, 1n);
      await expect(fraudProofs.slashByVerdict(v, await h.signAll(members.slice(0, 2), committeeDomain, "Verdict", v)))
        .to.be.revertedWithCustomError(committee, "InsufficientPower")
        .withArgs(2, 4);
    });
    it("slashByVerdict_tamperedVerdict_reverts", async function () {
      const { committee, fraudProofs, members, committeeDomain, node, challenger, other } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.Timeout, challenger.address, 1n);
      const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
      await expect(fraudProofs.slashByVerdict({ ...v, challenger: other.address }, sigs)).to.be.revertedWithCustomError(
        committee,
        "UnknownSigner",
      );
    });
    it("slashByVerdict_zeroChallenger_reverts", async function () {
      const { staking, fraudProofs, members, committeeDomain, node } = await loadFixture(fixture);
      const v = verdictFor(node.address, h.Offence.Timeout, ethers.ZeroAddress, 1n);
      await expect(fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v))).to.be.revertedWithCustomError(
        staking,
        "ZeroChallenger",
      );
    });
  });

  describe("proveComputationFault (ZK hook)", function () {
    it("proveComputationFault_acceptedProof_slashesFailedVerification", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      const proof = ethers.keccak256(outputHash);
      await expect(fraudProofs.connect(challenger).proveComputationFault(honestReveal, rs, proof))
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.FailedVerification, h.ONE, challenger.address, h.ONE / 2n, h.ONE / 2n);
      await expect(fraudProofs.connect(challenger).proveComputationFault(honestReveal, rs, proof)).to.be.revertedWithCustomError(
        fraudProofs,
        "AlreadyProven",
      );
    });
    it("proveComputationFault_rejectedProof_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      await expect(fraudProofs.proveComputationFault(honestReveal, rs, "0xdeadbeef")).to.be.revertedWithCustomError(fraudProofs, "NotAFault");
    });
    it("proveComputationFault_badSignature_reverts", async function () {
      const { fraudProofs } = await loadFixture(fixture);
      await expect(fraudProofs.proveComputationFault(honestReveal, "0x", "0x"))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(0);
    });
    it("proveComputationFault_noVerifier_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(noVerifierFixture);
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      await expect(fraudProofs.proveComputationFault(honestReveal, rs, "0x")).to.be.revertedWithCustomError(fraudProofs, "FaultVerifierDisabled");
    });
  });

  it("domainSeparator_matchesEthersDomain", async function () {
    const { fraudProofs, fraudDomain } = await loadFixture(fixture);
    expect(await fraudProofs.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(fraudDomain));
  });
});
