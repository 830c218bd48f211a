// FraudProofs: node-signed evidence (reveal mismatch, equivocation), committee verdicts bound to
// this contract, the ZK hook judging exactly what the node signed, challenger commit-then-reveal
// (no mempool theft), evidence top-ups (a smaller penalty never pre-empts a larger one), the
// self-report bound, recorded work keeping the stake, and the 50 % challenger / 50 % burn split.
const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

describe("FraudProofs", function () {
  async function fixture() {
    const verifier = await (await ethers.getContractFactory("MockFaultVerifier")).deploy();
    const env = await h.deployAll({ faultVerifier: await verifier.getAddress() });
    const [deployer, node, other, challenger, node2, alt, copier] = await ethers.getSigners();
    await env.staking.connect(node).stake(h.Role.Compute, { value: h.ONE * 2n });
    return { ...env, deployer, node, other, challenger, node2, alt, copier, verifier };
  }
  async function noVerifierFixture() {
    const env = await h.deployAll();
    const [, node, , challenger] = await ethers.getSigners();
    await env.staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
    return { ...env, node, challenger };
  }

  const session = ethers.id("session-1");
  const manifestHash = ethers.id("manifest");
  const inputHash = ethers.id("input");
  const salt = ethers.id("salt");
  const SIGNED_AT = 1_767_225_600n;
  // The toy model of MockFaultVerifier: the correct output of (manifest, shard, input).
  const correctOutput = (m, shard, input) =>
    ethers.keccak256(ethers.AbiCoder.defaultAbiCoder().encode(["bytes32", "uint32", "bytes32"], [m, shard, input]));
  const outputHash = correctOutput(manifestHash, 1, inputHash);
  const honestCommitment = {
    session,
    step: 3n,
    shard: 1,
    commitment: h.commitmentValue(session, 3n, 1, outputHash, salt),
    signedAt: SIGNED_AT,
  };
  const honestReveal = { session, step: 3n, shard: 1, manifestHash, inputHash, outputHash, salt, signedAt: SIGNED_AT + 1n };
  const lyingReveal = { ...honestReveal, outputHash: ethers.id("another output") };
  const FAULT_PROOF = ethers.toUtf8Bytes("fault");
  const slotId = (node) => h.evidenceId(node, session, 3n, 1);
  const sign1 = async (signer, dom, type, value) => (await h.signAll([signer], dom, type, value))[0];

  describe("proveRevealMismatch", function () {
    it("proveRevealMismatch_mismatch_slashesAllHalfToChallengerHalfBurned", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const id = await fraudProofs.evidenceId(node.address, session, 3n, 1);
      expect(id).to.equal(slotId(node.address));
      const s = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch);
      const burnBefore = await ethers.provider.getBalance(h.BURN_ADDRESS);
      const tx = fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s);
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
      expect(await fraudProofs.penaltyOf(id)).to.equal(10000n);
      // The commitment is consumed.
      expect(await fraudProofs.challengeCommittedAt(h.challengeCommitment(challenger.address, id, h.Offence.CommitRevealMismatch, s))).to.equal(0n);
    });
    it("proveRevealMismatch_matchingReveal_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, honestReveal, rs, salt)).to.be.revertedWithCustomError(
        fraudProofs,
        "NotAFault",
      );
    });
    it("proveRevealMismatch_differentSigners_reverts", async function () {
      const { fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(other, fraudDomain, "Reveal", lyingReveal);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, salt))
        .to.be.revertedWithCustomError(fraudProofs, "SignerMismatch")
        .withArgs(node.address, other.address);
    });
    it("proveRevealMismatch_differentSlot_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      for (const r of [{ ...lyingReveal, step: 4n }, { ...lyingReveal, shard: 2 }, { ...lyingReveal, session: ethers.id("x") }]) {
        const rs = await sign1(node, fraudDomain, "Reveal", r);
        await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, r, rs, salt)).to.be.revertedWithCustomError(fraudProofs, "DifferentSlot");
      }
    });
    it("proveRevealMismatch_malformedSignature_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, "0x1234", salt))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(1);
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, "0x", lyingReveal, cs, salt))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(0);
    });
    it("proveRevealMismatch_signedForOtherDomain_doesNotSlashTheNode", async function () {
      const { staking, fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const wrong = { ...fraudDomain, chainId: 1n };
      const cs = await sign1(node, wrong, "Commitment", honestCommitment);
      const rs = await sign1(node, wrong, "Reveal", lyingReveal);
      // Under this contract's domain they recover to two unrelated addresses, not to the node.
      await expect(fraudProofs.proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, salt)).to.be.revertedWithCustomError(
        fraudProofs,
        "SignerMismatch",
      );
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE * 2n);
    });
    it("proveRevealMismatch_twice_revertsAlreadyProven", async function () {
      const { fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const id = slotId(node.address);
      const s1 = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch);
      await fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s1);
      const s2 = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch, ethers.id("again"));
      await expect(fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s2))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(id);
      // The same slot cannot be slashed again as equivocation either (same 100 % share).
      const other = { ...honestCommitment, commitment: ethers.id("x") };
      const os = await sign1(node, fraudDomain, "Commitment", other);
      const s3 = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.Equivocation);
      await expect(fraudProofs.connect(challenger).proveEquivocation(honestCommitment, cs, other, os, s3)).to.be.revertedWithCustomError(
        fraudProofs,
        "AlreadyProven",
      );
    });
    it("proveRevealMismatch_unstakedNode_revertsNothingToSlash", async function () {
      const { staking, fraudProofs, fraudDomain, other, challenger } = await loadFixture(fixture);
      const cs = await sign1(other, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(other, fraudDomain, "Reveal", lyingReveal);
      const s = await h.commitChallenge(fraudProofs, challenger, slotId(other.address), h.Offence.CommitRevealMismatch);
      await expect(fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s))
        .to.be.revertedWithCustomError(staking, "NothingToSlash")
        .withArgs(other.address);
    });
    it("proveRevealMismatch_unbondingNode_stillSlashed", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      await staking.connect(node).requestUnstake();
      await time.increase(h.DEFAULTS.challengeWindow); // the whole challenge window later
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const s = await h.commitChallenge(fraudProofs, challenger, slotId(node.address), h.Offence.CommitRevealMismatch);
      await fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      await expect(staking.connect(node).withdraw()).to.be.revertedWithCustomError(staking, "NotUnbonding");
    });
  });

  describe("proveEquivocation", function () {
    const a = { session, step: 9n, shard: 0, commitment: ethers.id("a"), signedAt: SIGNED_AT };
    const b = { ...a, commitment: ethers.id("b") };
    const id = (node) => h.evidenceId(node, session, 9n, 0);
    it("proveEquivocation_twoCommitments_slashesAll", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sb = await sign1(node, fraudDomain, "Commitment", b);
      const s = await h.commitChallenge(fraudProofs, challenger, id(node.address), h.Offence.Equivocation);
      await expect(fraudProofs.connect(challenger).proveEquivocation(a, sa, b, sb, s))
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.Equivocation, h.ONE * 2n, challenger.address, h.ONE, h.ONE);
    });
    it("proveEquivocation_sameCommitment_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      await expect(fraudProofs.proveEquivocation(a, sa, a, sa, salt)).to.be.revertedWithCustomError(fraudProofs, "NotAFault");
    });
    it("proveEquivocation_sameValueSignedAgainLater_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const later = { ...a, signedAt: a.signedAt + 5n }; // a retry re-signs the same commitment
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sl = await sign1(node, fraudDomain, "Commitment", later);
      await expect(fraudProofs.proveEquivocation(a, sa, later, sl, salt)).to.be.revertedWithCustomError(fraudProofs, "NotAFault");
    });
    it("proveEquivocation_differentSlot_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const c = { ...b, step: 10n };
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sc = await sign1(node, fraudDomain, "Commitment", c);
      await expect(fraudProofs.proveEquivocation(a, sa, c, sc, salt)).to.be.revertedWithCustomError(fraudProofs, "DifferentSlot");
    });
    it("proveEquivocation_differentSigners_reverts", async function () {
      const { fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      const sb = await sign1(other, fraudDomain, "Commitment", b);
      await expect(fraudProofs.proveEquivocation(a, sa, b, sb, salt))
        .to.be.revertedWithCustomError(fraudProofs, "SignerMismatch")
        .withArgs(node.address, other.address);
    });
    it("proveEquivocation_badSignature_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const sa = await sign1(node, fraudDomain, "Commitment", a);
      await expect(fraudProofs.proveEquivocation(a, sa, b, "0x00", salt))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(1);
    });
  });

  describe("challenger commit-then-reveal (c)", function () {
    async function evidence(env) {
      const cs = await sign1(env.node, env.fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(env.node, env.fraudDomain, "Reveal", lyingReveal);
      return { cs, rs, id: slotId(env.node.address) };
    }
    it("prove_withoutCommitment_revertsChallengeNotCommitted", async function () {
      const env = await loadFixture(fixture);
      const { cs, rs, id } = await evidence(env);
      const expected = h.challengeCommitment(env.challenger.address, id, h.Offence.CommitRevealMismatch, salt);
      await expect(env.fraudProofs.connect(env.challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, salt))
        .to.be.revertedWithCustomError(env.fraudProofs, "ChallengeNotCommitted")
        .withArgs(expected);
    });
    it("prove_someoneElsesCommitmentOrWrongOffence_reverts", async function () {
      const env = await loadFixture(fixture);
      const { cs, rs, id } = await evidence(env);
      const s = await h.commitChallenge(env.fraudProofs, env.challenger, id, h.Offence.CommitRevealMismatch);
      // The challenger's commitment does not count for another sender...
      await expect(env.fraudProofs.connect(env.copier).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s)).to.be.revertedWithCustomError(
        env.fraudProofs,
        "ChallengeNotCommitted",
      );
      // ...nor for another offence about the same slot.
      const other = { ...honestCommitment, commitment: ethers.id("x") };
      const os = await sign1(env.node, env.fraudDomain, "Commitment", other);
      await expect(env.fraudProofs.connect(env.challenger).proveEquivocation(honestCommitment, cs, other, os, s)).to.be.revertedWithCustomError(
        env.fraudProofs,
        "ChallengeNotCommitted",
      );
    });
    it("commitChallenge_zero_reverts_andRepeatKeepsFirstBlock", async function () {
      const env = await loadFixture(fixture);
      await expect(env.fraudProofs.commitChallenge(ethers.ZeroHash)).to.be.revertedWithCustomError(env.fraudProofs, "ZeroCommitment");
      const c = ethers.id("some commitment");
      const tx = await env.fraudProofs.connect(env.challenger).commitChallenge(c);
      const first = (await tx.wait()).blockNumber;
      await expect(tx).to.emit(env.fraudProofs, "ChallengeCommitted").withArgs(c, env.challenger.address, first);
      // A copy of the commitment (e.g. by a front-runner) changes nothing and emits nothing.
      await expect(env.fraudProofs.connect(env.copier).commitChallenge(c)).not.to.emit(env.fraudProofs, "ChallengeCommitted");
      expect(await env.fraudProofs.challengeCommittedAt(c)).to.equal(BigInt(first));
    });
    it("prove_commitmentInSameBlock_revertsChallengeNotMatured", async function () {
      const env = await loadFixture(fixture);
      const { cs, rs, id } = await evidence(env);
      const c = h.challengeCommitment(env.challenger.address, id, h.Offence.CommitRevealMismatch, salt);
      await network.provider.send("evm_setAutomine", [false]);
      try {
        const commitTx = await env.fraudProofs.connect(env.challenger).commitChallenge(c, { gasLimit: 100000n });
        const proveTx = await env.fraudProofs
          .connect(env.challenger)
          .proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, salt, { gasLimit: 500000n });
        await network.provider.send("evm_mine", []);
        const committed = await commitTx.wait();
        expect(committed.status).to.equal(1);
        await expect(proveTx.wait()).to.be.rejected;
        expect(await env.fraudProofs.challengeCommittedAt(c)).to.equal(BigInt(committed.blockNumber));
      } finally {
        await network.provider.send("evm_setAutomine", [true]);
      }
      expect(await env.staking.stakeOf(env.node.address)).to.equal(h.ONE * 2n);
      // In a later block the same proof counts.
      await env.fraudProofs.connect(env.challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, salt);
      expect(await env.staking.stakeOf(env.node.address)).to.equal(0n);
    });
    it("prove_mempoolCopyWithHigherTip_sameBlock_copierGetsNoReward", async function () {
      const env = await loadFixture(fixture);
      const { staking, fraudProofs, node, challenger, copier } = env;
      const { cs, rs, id } = await evidence(env);
      const s = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch);
      const copierSalt = ethers.id("copier salt");
      const copierCommitment = h.challengeCommitment(copier.address, id, h.Offence.CommitRevealMismatch, copierSalt);
      const base = (await ethers.provider.getBlock("latest")).baseFeePerGas;
      const low = { maxPriorityFeePerGas: 1n, maxFeePerGas: base * 4n + 1n, gasLimit: 500000n };
      const high = { maxPriorityFeePerGas: base * 10n, maxFeePerGas: base * 20n, gasLimit: 500000n };
      await network.provider.send("evm_setAutomine", [false]);
      let honestTx, copyTx, copierCommitTx, copierOwnTx;
      try {
        // The honest challenger's proof is pending...
        honestTx = await fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s, low);
        // ...a copier replays it verbatim with a higher tip, and also commits and proves in its own name.
        copyTx = await fraudProofs.connect(copier).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s, high);
        copierCommitTx = await fraudProofs.connect(copier).commitChallenge(copierCommitment, high);
        copierOwnTx = await fraudProofs.connect(copier).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, copierSalt, high);
        await network.provider.send("evm_mine", []);
      } finally {
        await network.provider.send("evm_setAutomine", [true]);
      }
      const honest = await honestTx.wait();
      const block = await ethers.provider.getBlock(honest.blockNumber);
      // All four landed in one block, the copier's first (higher tip).
      expect(block.transactions).to.have.length(4);
      expect(block.transactions[0]).to.equal(copyTx.hash);
      expect(block.transactions[3]).to.equal(honestTx.hash);
      await expect(copyTx.wait()).to.be.rejected;
      await expect(copierOwnTx.wait()).to.be.rejected;
      expect((await copierCommitTx.wait()).status).to.equal(1);
      expect(honest.status).to.equal(1);
      expect(await staking.creditOf(copier.address)).to.equal(0n);
      expect(await staking.creditOf(challenger.address)).to.equal(h.ONE);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      // Later, the copier's own (now mature) commitment finds the evidence already proven.
      await expect(fraudProofs.connect(copier).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, copierSalt))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(id);
    });
  });

  describe("evidence top-ups and self-reports (b, c)", function () {
    it("smallerPenaltyFirst_largerProofStillCostsFullShare", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger, other } = await loadFixture(fixture);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const id = slotId(node.address);
      const s1 = await h.commitChallenge(fraudProofs, other, id, h.Offence.FailedVerification);
      await fraudProofs.connect(other).proveComputationFault(lyingReveal, rs, FAULT_PROOF, s1);
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE);
      expect(await fraudProofs.penaltyOf(id)).to.equal(5000n);
      // The 100 % proof of the same slot is not pre-empted: it takes the rest.
      const s2 = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch);
      await expect(fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s2))
        .to.emit(fraudProofs, "FaultProven")
        .withArgs(id, node.address, h.Offence.CommitRevealMismatch, challenger.address, h.ONE);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      expect(await staking.totalSlashed()).to.equal(h.ONE * 2n);
      expect(await fraudProofs.penaltyOf(id)).to.equal(10000n);
      // And a smaller one after the larger reverts.
      const s3 = await h.commitChallenge(fraudProofs, other, id, h.Offence.FailedVerification, ethers.id("again"));
      await expect(fraudProofs.connect(other).proveComputationFault(lyingReveal, rs, FAULT_PROOF, s3))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(id);
    });
    it("selfReport_secondAccountFilesSmallerOffenceFirst_netLossAtLeastHalfOfSeedPenalty", async function () {
      const { staking, fraudProofs, fraudDomain, node, alt, challenger } = await loadFixture(fixture);
      const stake = await staking.stakeOf(node.address);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const id = slotId(node.address);
      // The offender's own second account reports the cheapest offence on its lying reveal first...
      const s1 = await h.commitChallenge(fraudProofs, alt, id, h.Offence.FailedVerification);
      await fraudProofs.connect(alt).proveComputationFault(lyingReveal, rs, FAULT_PROOF, s1);
      // ...then an honest challenger proves the 100 % mismatch of the same slot.
      const s2 = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.CommitRevealMismatch);
      await fraudProofs.connect(challenger).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s2);
      const lost = stake - (await staking.stakeOf(node.address));
      const regained = await staking.creditOf(alt.address);
      const net = lost - regained;
      // The heaviest offence proven is 100 %: the offender must lose at least half of it, net.
      expect(net).to.be.gte(stake / 2n);
      expect(net).to.equal(stake - stake / 4n);
    });
    it("selfReport_secondAccountFilesTheFullOffence_netLossIsExactlyHalf", async function () {
      const { staking, fraudProofs, fraudDomain, node, alt } = await loadFixture(fixture);
      const stake = await staking.stakeOf(node.address);
      const cs = await sign1(node, fraudDomain, "Commitment", honestCommitment);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const s = await h.commitChallenge(fraudProofs, alt, slotId(node.address), h.Offence.CommitRevealMismatch);
      await fraudProofs.connect(alt).proveRevealMismatch(honestCommitment, cs, lyingReveal, rs, s);
      const net = stake - (await staking.stakeOf(node.address)) - (await staking.creditOf(alt.address));
      expect(net).to.equal(stake / 2n); // the documented effective penalty of a self-report
    });
    it("verdicts_smallerThenLargerOnSameEvidence_topsUpToLargerShare", async function () {
      const { staking, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const consumer = await fraudProofs.getAddress();
      const evidenceHash = ethers.id("shared evidence");
      const v1 = { node: node.address, offence: h.Offence.Timeout, evidenceHash, challenger: challenger.address, nonce: 1n, consumer };
      await fraudProofs.slashByVerdict(v1, await h.signAll(members, committeeDomain, "Verdict", v1));
      expect(await staking.stakeOf(node.address)).to.equal((h.ONE * 2n * 9500n) / 10000n);
      const v2 = { ...v1, offence: h.Offence.FailedVerification, nonce: 2n };
      await fraudProofs.slashByVerdict(v2, await h.signAll(members, committeeDomain, "Verdict", v2));
      // 5 % then ceil(45 / 95) of the rest: at least 50 % of the original stake, less than 50.01 %.
      const slashed = h.ONE * 2n - (await staking.stakeOf(node.address));
      expect(slashed).to.be.gte(h.ONE);
      expect(slashed).to.be.lt((h.ONE * 2n * 5001n) / 10000n);
      const v3 = { ...v1, offence: h.Offence.Collusion, nonce: 3n };
      await fraudProofs.slashByVerdict(v3, await h.signAll(members, committeeDomain, "Verdict", v3));
      expect(await staking.stakeOf(node.address)).to.equal(0n);
      const v4 = { ...v1, offence: h.Offence.Timeout, nonce: 4n };
      await expect(fraudProofs.slashByVerdict(v4, await h.signAll(members, committeeDomain, "Verdict", v4)))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(await fraudProofs.verdictEvidenceId(node.address, evidenceHash));
    });
  });

  describe("slashByVerdict", function () {
    async function verdictFor(fraudProofs, node, offence, challenger, nonce, evidence = "evidence") {
      return { node, offence, evidenceHash: ethers.id(evidence), challenger, nonce, consumer: await fraudProofs.getAddress() };
    }
    for (const [name, offence, bps] of [
      ["FailedVerification", h.Offence.FailedVerification, 5000n],
      ["Timeout", h.Offence.Timeout, 500n],
      ["Collusion", h.Offence.Collusion, 10000n],
      ["CommitRevealMismatch", h.Offence.CommitRevealMismatch, 10000n],
    ]) {
      it(`slashByVerdict_${name}_slashesItsShare`, async function () {
        const { staking, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
        const v = await verdictFor(fraudProofs, node.address, offence, challenger.address, 1n);
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
      const v = await verdictFor(fraudProofs, node.address, h.Offence.FailedVerification, challenger.address, 1n);
      await fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v));
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE);
      expect(await staking.isEligible(node.address)).to.equal(true);
      const v2 = await verdictFor(fraudProofs, node.address, h.Offence.Timeout, challenger.address, 2n, "late");
      await fraudProofs.slashByVerdict(v2, await h.signAll(members, committeeDomain, "Verdict", v2));
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE - h.ONE / 20n);
      expect(await staking.isEligible(node.address)).to.equal(false);
      expect(await staking.statusOf(node.address)).to.equal(1n);
    });
    it("slashByVerdict_invalidOffence_reverts", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      for (const offence of [0, 6]) {
        const v = await verdictFor(fraudProofs, node.address, offence, challenger.address, 1n);
        const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
        await expect(fraudProofs.slashByVerdict(v, sigs)).to.be.revertedWithCustomError(fraudProofs, "InvalidOffence").withArgs(offence);
      }
    });
    it("slashByVerdict_replayedNonce_reverts", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Timeout, challenger.address, 7n);
      const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
      await fraudProofs.slashByVerdict(v, sigs);
      await expect(fraudProofs.slashByVerdict(v, sigs)).to.be.revertedWithCustomError(fraudProofs, "VerdictNonceUsed").withArgs(7n);
    });
    it("slashByVerdict_sameEvidenceSameOffenceNewNonce_revertsAlreadyProven", async function () {
      const { fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Timeout, challenger.address, 1n);
      await fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v));
      const v2 = { ...v, nonce: 2n };
      await expect(fraudProofs.slashByVerdict(v2, await h.signAll(members, committeeDomain, "Verdict", v2)))
        .to.be.revertedWithCustomError(fraudProofs, "AlreadyProven")
        .withArgs(await fraudProofs.verdictEvidenceId(node.address, v.evidenceHash));
    });
    it("slashByVerdict_insufficientSignatures_reverts", async function () {
      const { committee, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Collusion, challenger.address, 1n);
      await expect(fraudProofs.slashByVerdict(v, await h.signAll(members.slice(0, 2), committeeDomain, "Verdict", v)))
        .to.be.revertedWithCustomError(committee, "InsufficientPower")
        .withArgs(2, 4);
    });
    it("slashByVerdict_tamperedVerdict_reverts", async function () {
      const { committee, fraudProofs, members, committeeDomain, node, challenger, other } = await loadFixture(fixture);
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Timeout, challenger.address, 1n);
      const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
      await expect(fraudProofs.slashByVerdict({ ...v, challenger: other.address }, sigs)).to.be.revertedWithCustomError(
        committee,
        "UnknownSigner",
      );
    });
    it("slashByVerdict_zeroChallenger_reverts", async function () {
      const { staking, fraudProofs, members, committeeDomain, node } = await loadFixture(fixture);
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Timeout, ethers.ZeroAddress, 1n);
      await expect(fraudProofs.slashByVerdict(v, await h.signAll(members, committeeDomain, "Verdict", v))).to.be.revertedWithCustomError(
        staking,
        "ZeroChallenger",
      );
    });
    it("slashByVerdict_secondDeploymentSharingCommittee_refusesOldVerdict", async function () {
      const { committee, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      // A second Staking/FraudProofs pair wired to the same committee; the node stakes there too.
      const staking2 = await (await ethers.getContractFactory("Staking")).deploy(
        await committee.getAddress(),
        ethers.ZeroAddress,
        h.ONE,
        h.ONE / 2n,
        h.ONE / 10n,
        h.DEFAULTS.challengeWindow,
        h.DEFAULTS.unstakeDelay,
      );
      const fraudProofs2 = await ethers.getContractAt("FraudProofs", await staking2.fraudProofs());
      await staking2.connect(node).stake(h.Role.Compute, { value: h.ONE });
      const v = await verdictFor(fraudProofs, node.address, h.Offence.Collusion, challenger.address, 1n);
      const sigs = await h.signAll(members, committeeDomain, "Verdict", v);
      await expect(fraudProofs2.slashByVerdict(v, sigs))
        .to.be.revertedWithCustomError(fraudProofs2, "WrongConsumer")
        .withArgs(await fraudProofs.getAddress());
      // Renaming the consumer breaks the committee's signatures.
      await expect(fraudProofs2.slashByVerdict({ ...v, consumer: await fraudProofs2.getAddress() }, sigs)).to.be.revertedWithCustomError(
        committee,
        "UnknownSigner",
      );
      expect(await staking2.stakeOf(node.address)).to.equal(h.ONE);
      await fraudProofs.slashByVerdict(v, sigs); // the deployment it was signed for accepts it
    });
  });

  describe("proveComputationFault (ZK hook, a)", function () {
    it("proveComputationFault_lyingReveal_slashesFailedVerification", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      const s = await h.commitChallenge(fraudProofs, challenger, slotId(node.address), h.Offence.FailedVerification);
      await expect(fraudProofs.connect(challenger).proveComputationFault(lyingReveal, rs, FAULT_PROOF, s))
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.FailedVerification, h.ONE, challenger.address, h.ONE / 2n, h.ONE / 2n);
      const s2 = await h.commitChallenge(fraudProofs, challenger, slotId(node.address), h.Offence.FailedVerification, ethers.id("2"));
      await expect(fraudProofs.connect(challenger).proveComputationFault(lyingReveal, rs, FAULT_PROOF, s2)).to.be.revertedWithCustomError(
        fraudProofs,
        "AlreadyProven",
      );
    });
    it("proveComputationFault_honestNode_soundVerifierCannotBeUsedToSlash", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      // The node computed correctly: its signed (model, input, output) is consistent.
      const rs = await sign1(node, fraudDomain, "Reveal", honestReveal);
      const s = await h.commitChallenge(fraudProofs, challenger, slotId(node.address), h.Offence.FailedVerification);
      await expect(fraudProofs.connect(challenger).proveComputationFault(honestReveal, rs, FAULT_PROOF, s)).to.be.revertedWithCustomError(
        fraudProofs,
        "NotAFault",
      );
      // Claiming another input or model than the node signed does not make a fault of the node:
      // the signature no longer recovers to it.
      for (const forged of [
        { ...honestReveal, inputHash: ethers.id("other input") },
        { ...honestReveal, manifestHash: ethers.id("other model") },
      ]) {
        await expect(fraudProofs.connect(challenger).proveComputationFault(forged, rs, FAULT_PROOF, s)).to.be.reverted;
      }
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE * 2n);
    });
    it("proveComputationFault_rejectedProof_revertsNotAFault", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(fixture);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      await expect(fraudProofs.proveComputationFault(lyingReveal, rs, "0xdeadbeef", salt)).to.be.revertedWithCustomError(fraudProofs, "NotAFault");
    });
    it("proveComputationFault_badSignature_reverts", async function () {
      const { fraudProofs } = await loadFixture(fixture);
      await expect(fraudProofs.proveComputationFault(lyingReveal, "0x", "0x", salt))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(0);
    });
    it("proveComputationFault_noVerifier_reverts", async function () {
      const { fraudProofs, fraudDomain, node } = await loadFixture(noVerifierFixture);
      const rs = await sign1(node, fraudDomain, "Reveal", lyingReveal);
      await expect(fraudProofs.proveComputationFault(lyingReveal, rs, "0x", salt)).to.be.revertedWithCustomError(fraudProofs, "FaultVerifierDisabled");
    });
  });

  describe("recorded work keeps the stake (e)", function () {
    it("withdraw_workSignedWhileUnbonding_lockedUntilItsWindowCloses", async function () {
      const { staking, fraudProofs, fraudDomain, node, other, challenger } = await loadFixture(fixture);
      await staking.connect(node).requestUnstake();
      const withdrawableAt = await staking.unbondingAt(node.address);
      // The node keeps signing work 50 s into its unbonding; a verifier records it.
      await time.increase(50);
      const signedAt = BigInt(await time.latest());
      const c = { ...honestCommitment, signedAt };
      const cs = await sign1(node, fraudDomain, "Commitment", c);
      const lockedUntil = signedAt + h.DEFAULTS.challengeWindow + 1n;
      const tx = fraudProofs.connect(other).recordCommitment(c, cs);
      await expect(tx).to.emit(staking, "WithdrawLocked").withArgs(node.address, lockedUntil);
      await expect(tx)
        .to.emit(fraudProofs, "WorkRecorded")
        .withArgs(node.address, ethers.TypedDataEncoder.hashStruct("Commitment", { Commitment: h.TYPES.Commitment }, c), signedAt, lockedUntil);
      expect(await staking.lockedUntil(node.address)).to.equal(lockedUntil);
      expect(lockedUntil).to.be.greaterThan(withdrawableAt);
      // The unstake delay alone has passed, the work's window has not.
      await time.increaseTo(withdrawableAt);
      await expect(staking.connect(node).withdraw())
        .to.be.revertedWithCustomError(staking, "FraudWindowOpen")
        .withArgs(node.address, lockedUntil);
      // Fraud about that work is still provable, and slashes.
      const r = { ...lyingReveal, signedAt: signedAt + 1n };
      const rs = await sign1(node, fraudDomain, "Reveal", r);
      const s = await h.commitChallenge(fraudProofs, challenger, slotId(node.address), h.Offence.CommitRevealMismatch);
      await fraudProofs.connect(challenger).proveRevealMismatch(c, cs, r, rs, s);
      expect(await staking.stakeOf(node.address)).to.equal(0n);
    });
    it("withdraw_afterRecordedWindow_pays", async function () {
      const { staking, fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      await staking.connect(node).requestUnstake();
      await time.increase(30);
      const r = { ...honestReveal, signedAt: BigInt(await time.latest()) };
      await fraudProofs.connect(other).recordReveal(r, await sign1(node, fraudDomain, "Reveal", r));
      const lockedUntil = await staking.lockedUntil(node.address);
      expect(lockedUntil).to.equal(r.signedAt + h.DEFAULTS.challengeWindow + 1n);
      await time.increaseTo(lockedUntil);
      await expect(staking.connect(node).withdraw()).to.changeEtherBalance(node, h.ONE * 2n);
      expect(await staking.lockedUntil(node.address)).to.equal(0n);
    });
    it("recordWork_olderWork_revertsWorkAlreadyCovered", async function () {
      const { staking, fraudProofs, fraudDomain, node, other } = await loadFixture(fixture);
      const c = { ...honestCommitment, signedAt: 1000n };
      await fraudProofs.connect(other).recordCommitment(c, await sign1(node, fraudDomain, "Commitment", c));
      const lock = 1000n + h.DEFAULTS.challengeWindow + 1n;
      const older = { ...c, signedAt: 999n };
      await expect(fraudProofs.connect(other).recordCommitment(older, await sign1(node, fraudDomain, "Commitment", older)))
        .to.be.revertedWithCustomError(staking, "WorkAlreadyCovered")
        .withArgs(node.address, lock);
    });
    it("recordWork_unstakedNodeOrBadSignature_reverts", async function () {
      const { staking, fraudProofs, fraudDomain, other } = await loadFixture(fixture);
      const cs = await sign1(other, fraudDomain, "Commitment", honestCommitment);
      await expect(fraudProofs.recordCommitment(honestCommitment, cs)).to.be.revertedWithCustomError(staking, "NotStaked").withArgs(other.address);
      await expect(fraudProofs.recordReveal(honestReveal, "0x01"))
        .to.be.revertedWithCustomError(fraudProofs, "InvalidNodeSignature")
        .withArgs(0);
    });
  });

  it("domainSeparator_matchesEthersDomain", async function () {
    const { fraudProofs, fraudDomain } = await loadFixture(fixture);
    expect(await fraudProofs.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(fraudDomain));
  });
});
