// Staking: roles and minimums, unbonding strictly longer than the challenge window, pull credits,
// slash access control, and hostile receivers.
const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

describe("Staking", function () {
  async function fixture() {
    const env = await h.deployAll();
    const [deployer, node, other, challenger] = await ethers.getSigners();
    const receiver = await (await ethers.getContractFactory("ReentrantReceiver")).deploy();
    return { ...env, deployer, node, other, challenger, receiver };
  }

  describe("constructor", function () {
    it("constructor_delayNotLongerThanWindow_reverts", async function () {
      const F = await ethers.getContractFactory("Staking");
      const c = ethers.Wallet.createRandom().address;
      await expect(F.deploy(c, ethers.ZeroAddress, h.ONE, h.ONE, h.ONE, 60n, 60n))
        .to.be.revertedWithCustomError(F, "UnstakeDelayTooShort")
        .withArgs(60n, 60n);
    });
    it("constructor_zeroMinimum_reverts", async function () {
      const F = await ethers.getContractFactory("Staking");
      const c = ethers.Wallet.createRandom().address;
      await expect(F.deploy(c, ethers.ZeroAddress, 0n, h.ONE, h.ONE, 60n, 61n)).to.be.revertedWithCustomError(F, "ZeroAmount");
    });
    it("constructor_zeroRelayMinimum_reverts", async function () {
      const F = await ethers.getContractFactory("Staking");
      const c = ethers.Wallet.createRandom().address;
      await expect(F.deploy(c, ethers.ZeroAddress, h.ONE, h.ONE, 0n, 60n, 61n)).to.be.revertedWithCustomError(F, "ZeroAmount");
    });
    it("constructor_deploysFraudProofsBoundToItself", async function () {
      const { staking, fraudProofs, committee } = await loadFixture(fixture);
      expect(await fraudProofs.staking()).to.equal(await staking.getAddress());
      expect(await fraudProofs.committee()).to.equal(await committee.getAddress());
      expect(await fraudProofs.faultVerifier()).to.equal(ethers.ZeroAddress);
      expect(await fraudProofs.challengeWindow()).to.equal(await staking.challengeWindow());
      expect(await staking.minimumStake(h.Role.Compute)).to.equal(h.ONE);
      expect(await staking.minimumStake(h.Role.Verifier)).to.equal(h.ONE / 2n);
      expect(await staking.minimumStake(h.Role.Relay)).to.equal(h.ONE / 10n);
      expect(await staking.minRelayStake()).to.equal(h.ONE / 10n);
      expect(await staking.minimumStake(h.Role.None)).to.equal(0n);
      expect(await staking.unstakeDelay()).to.be.greaterThan(await staking.challengeWindow());
    });
  });

  describe("stake", function () {
    it("stake_computeAtMinimum_activates", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.Compute, { value: h.ONE }))
        .to.emit(staking, "Staked")
        .withArgs(node.address, h.Role.Compute, h.ONE, h.ONE);
      expect(await staking.stakeOf(node.address)).to.equal(h.ONE);
      expect(await staking.roleOf(node.address)).to.equal(h.Role.Compute);
      expect(await staking.statusOf(node.address)).to.equal(1n);
      expect(await staking.isEligible(node.address)).to.equal(true);
      expect(await staking.totalStaked()).to.equal(h.ONE);
    });
    it("stake_verifierAtMinimum_activates", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Verifier, { value: h.ONE / 2n });
      expect(await staking.roleOf(node.address)).to.equal(h.Role.Verifier);
    });
    it("stake_belowMinimum_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.Compute, { value: h.ONE - 1n }))
        .to.be.revertedWithCustomError(staking, "BelowMinimum")
        .withArgs(h.Role.Compute, h.ONE - 1n, h.ONE);
      await expect(staking.connect(node).stake(h.Role.Verifier, { value: h.ONE / 2n - 1n }))
        .to.be.revertedWithCustomError(staking, "BelowMinimum")
        .withArgs(h.Role.Verifier, h.ONE / 2n - 1n, h.ONE / 2n);
    });
    it("stake_roleNone_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.None, { value: h.ONE }))
        .to.be.revertedWithCustomError(staking, "InvalidRole")
        .withArgs(0);
      await expect(staking.connect(node).stake(4, { value: h.ONE })).to.be.reverted;
    });
    it("stake_zeroValue_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.Compute)).to.be.revertedWithCustomError(staking, "ZeroAmount");
    });
    it("stake_topUpSameRole_adds", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await expect(staking.connect(node).stake(h.Role.Compute, { value: 5n }))
        .to.emit(staking, "Staked")
        .withArgs(node.address, h.Role.Compute, 5n, h.ONE + 5n);
    });
    it("stake_otherRole_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await expect(staking.connect(node).stake(h.Role.Verifier, { value: h.ONE }))
        .to.be.revertedWithCustomError(staking, "RoleMismatch")
        .withArgs(h.Role.Compute, h.Role.Verifier);
    });
    it("stake_whileUnbonding_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await staking.connect(node).requestUnstake();
      const at = await staking.unbondingAt(node.address);
      await expect(staking.connect(node).stake(h.Role.Compute, { value: h.ONE }))
        .to.be.revertedWithCustomError(staking, "AlreadyUnbonding")
        .withArgs(node.address, at);
    });
  });

  describe("unstake and withdraw", function () {
    it("requestUnstake_notStaked_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).requestUnstake()).to.be.revertedWithCustomError(staking, "NotStaked").withArgs(node.address);
    });
    it("requestUnstake_twice_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await staking.connect(node).requestUnstake();
      await expect(staking.connect(node).requestUnstake()).to.be.revertedWithCustomError(staking, "AlreadyUnbonding");
    });
    it("withdraw_afterDelay_paysAndClears", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      const tx = await staking.connect(node).requestUnstake();
      const now = await h.blockTime(tx);
      await expect(tx).to.emit(staking, "UnstakeRequested").withArgs(node.address, h.ONE, now + h.DEFAULTS.unstakeDelay);
      expect(await staking.statusOf(node.address)).to.equal(2n);
      expect(await staking.isEligible(node.address)).to.equal(false);
      await time.increaseTo(now + h.DEFAULTS.unstakeDelay - 1n);
      await expect(staking.connect(node).withdraw()).to.changeEtherBalances([node, staking], [h.ONE, -h.ONE]);
      expect(await staking.statusOf(node.address)).to.equal(0n);
      expect(await staking.roleOf(node.address)).to.equal(h.Role.None);
      expect(await staking.totalStaked()).to.equal(0n);
    });
    it("withdraw_atChallengeWindowEnd_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await staking.connect(node).requestUnstake();
      const at = await staking.unbondingAt(node.address);
      await time.increaseTo(at - 2n); // challenge window fully elapsed, unstake delay not yet
      await expect(staking.connect(node).withdraw())
        .to.be.revertedWithCustomError(staking, "UnbondingNotElapsed")
        .withArgs(node.address, at);
    });
    it("withdraw_notUnbonding_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).withdraw()).to.be.revertedWithCustomError(staking, "NotUnbonding").withArgs(node.address);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await expect(staking.connect(node).withdraw()).to.be.revertedWithCustomError(staking, "NotUnbonding");
    });
    it("withdraw_emitsWithdrawn", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await staking.connect(node).requestUnstake();
      await time.increase(h.DEFAULTS.unstakeDelay);
      await expect(staking.connect(node).withdraw()).to.emit(staking, "Withdrawn").withArgs(node.address, h.ONE);
    });
    it("withdraw_receiverReentersWithdraw_blockedAndPaidOnce", async function () {
      const { staking, receiver } = await loadFixture(fixture);
      const r = await receiver.getAddress();
      await receiver.act(await staking.getAddress(), h.ONE, staking.interface.encodeFunctionData("stake", [h.Role.Compute]), { value: h.ONE });
      await receiver.act(await staking.getAddress(), 0, staking.interface.encodeFunctionData("requestUnstake"));
      await time.increase(h.DEFAULTS.unstakeDelay);
      await receiver.arm(await staking.getAddress(), staking.interface.encodeFunctionData("withdraw"));
      await receiver.act(await staking.getAddress(), 0, staking.interface.encodeFunctionData("withdraw"));
      expect(await receiver.reentryAttempts()).to.equal(1n);
      expect(await receiver.reentrySuccesses()).to.equal(0n);
      const err = staking.interface.parseError(await receiver.lastReentryError());
      expect(err.name).to.equal("ReentrancyGuardReentrantCall");
      expect(await ethers.provider.getBalance(r)).to.equal(h.ONE);
      expect(await ethers.provider.getBalance(await staking.getAddress())).to.equal(0n);
    });
    it("withdraw_receiverRejects_revertsTransferFailed", async function () {
      const { staking, receiver } = await loadFixture(fixture);
      const r = await receiver.getAddress();
      await receiver.act(await staking.getAddress(), h.ONE, staking.interface.encodeFunctionData("stake", [h.Role.Compute]), { value: h.ONE });
      await receiver.act(await staking.getAddress(), 0, staking.interface.encodeFunctionData("requestUnstake"));
      await time.increase(h.DEFAULTS.unstakeDelay);
      await receiver.setRejectPayments(true);
      await expect(receiver.act(await staking.getAddress(), 0, staking.interface.encodeFunctionData("withdraw")))
        .to.be.revertedWithCustomError(staking, "TransferFailed")
        .withArgs(r, h.ONE);
      expect(await staking.stakeOf(r)).to.equal(h.ONE); // nothing lost: the stake is still there
    });
  });

  describe("slash access and credits", function () {
    it("slash_notFraudProofs_reverts", async function () {
      const { staking, node, other } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      await expect(staking.connect(other).slash(node.address, h.Offence.Equivocation, 10000n, other.address))
        .to.be.revertedWithCustomError(staking, "NotFraudProofs")
        .withArgs(other.address);
      await expect(staking.connect(other).lockUntil(node.address, 1n << 40n))
        .to.be.revertedWithCustomError(staking, "NotFraudProofs")
        .withArgs(other.address);
    });
    it("slash_invalidBpsFromFraudProofs_reverts", async function () {
      const { staking, fraudProofs, node, other } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      // FraudProofs never sends these; impersonate it to pin Staking's own guard.
      const fp = await fraudProofs.getAddress();
      await network.provider.send("hardhat_impersonateAccount", [fp]);
      await network.provider.send("hardhat_setBalance", [fp, "0xde0b6b3a7640000"]);
      const asFraudProofs = await ethers.getSigner(fp);
      for (const bps of [0n, 10001n]) {
        await expect(staking.connect(asFraudProofs).slash(node.address, h.Offence.Timeout, bps, other.address))
          .to.be.revertedWithCustomError(staking, "InvalidBps")
          .withArgs(bps);
      }
      await network.provider.send("hardhat_stopImpersonatingAccount", [fp]);
    });
    it("claimCredit_nothing_reverts", async function () {
      const { staking, other } = await loadFixture(fixture);
      await expect(staking.connect(other).claimCredit()).to.be.revertedWithCustomError(staking, "NothingToClaim").withArgs(other.address);
    });
    it("claimCredit_afterSlash_paysOnceAndReentryBlocked", async function () {
      const { staking, fraudProofs, fraudDomain, node, receiver } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      const a = { session: ethers.id("s"), step: 1n, shard: 0, commitment: ethers.id("a"), signedAt: 1n };
      const b = { ...a, commitment: ethers.id("b") };
      const [sa] = await h.signAll([node], fraudDomain, "Commitment", a);
      const [sb] = await h.signAll([node], fraudDomain, "Commitment", b);
      const r = await receiver.getAddress();
      const salt = ethers.id("receiver salt");
      const id = h.evidenceId(node.address, a.session, a.step, a.shard);
      const commitment = h.challengeCommitment(r, id, h.Offence.Equivocation, salt);
      await receiver.act(await fraudProofs.getAddress(), 0, fraudProofs.interface.encodeFunctionData("commitChallenge", [commitment]));
      await receiver.act(await fraudProofs.getAddress(), 0, fraudProofs.interface.encodeFunctionData("proveEquivocation", [a, sa, b, sb, salt]));
      expect(await staking.creditOf(r)).to.equal(h.ONE / 2n);
      await receiver.arm(await staking.getAddress(), staking.interface.encodeFunctionData("claimCredit"));
      await receiver.act(await staking.getAddress(), 0, staking.interface.encodeFunctionData("claimCredit"));
      expect(await receiver.reentrySuccesses()).to.equal(0n);
      expect(await ethers.provider.getBalance(r)).to.equal(h.ONE / 2n);
      expect(await staking.creditOf(r)).to.equal(0n);
      expect(await staking.totalCredits()).to.equal(0n);
    });
    it("claimCredit_emitsCreditClaimed", async function () {
      const { staking, fraudProofs, fraudDomain, node, challenger } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Compute, { value: h.ONE });
      const a = { session: ethers.id("s"), step: 1n, shard: 0, commitment: ethers.id("a"), signedAt: 1n };
      const b = { ...a, commitment: ethers.id("b") };
      const [sa] = await h.signAll([node], fraudDomain, "Commitment", a);
      const [sb] = await h.signAll([node], fraudDomain, "Commitment", b);
      const salt = await h.commitChallenge(fraudProofs, challenger, h.evidenceId(node.address, a.session, a.step, a.shard), h.Offence.Equivocation);
      await fraudProofs.connect(challenger).proveEquivocation(a, sa, b, sb, salt);
      const tx = staking.connect(challenger).claimCredit();
      await expect(tx).to.emit(staking, "CreditClaimed").withArgs(challenger.address, h.ONE / 2n);
      await expect(tx).to.changeEtherBalance(challenger, h.ONE / 2n);
    });
  });

  // A relay (overlay, docs/overlay.md) is an operator like the others: its own smaller minimum,
  // one role per address, the same unbonding delay, and slashable through FraudProofs alone.
  describe("relay role", function () {
    const MIN = h.ONE / 10n;
    it("stake_relayAtMinimum_activates", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.Relay, { value: MIN }))
        .to.emit(staking, "Staked")
        .withArgs(node.address, h.Role.Relay, MIN, MIN);
      expect(await staking.roleOf(node.address)).to.equal(h.Role.Relay);
      expect(await staking.statusOf(node.address)).to.equal(1n);
      expect(await staking.isEligible(node.address)).to.equal(true);
      expect(await staking.totalStaked()).to.equal(MIN);
    });
    it("stake_relayBelowMinimum_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await expect(staking.connect(node).stake(h.Role.Relay, { value: MIN - 1n }))
        .to.be.revertedWithCustomError(staking, "BelowMinimum")
        .withArgs(h.Role.Relay, MIN - 1n, MIN);
    });
    it("stake_relayThenCompute_revertsRoleMismatch", async function () {
      const { staking, node, other } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Relay, { value: MIN });
      await expect(staking.connect(node).stake(h.Role.Compute, { value: h.ONE }))
        .to.be.revertedWithCustomError(staking, "RoleMismatch")
        .withArgs(h.Role.Relay, h.Role.Compute);
      await staking.connect(other).stake(h.Role.Compute, { value: h.ONE });
      await expect(staking.connect(other).stake(h.Role.Relay, { value: MIN }))
        .to.be.revertedWithCustomError(staking, "RoleMismatch")
        .withArgs(h.Role.Compute, h.Role.Relay);
    });
    it("stake_relayWhileUnbonding_reverts", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Relay, { value: MIN });
      await staking.connect(node).requestUnstake();
      const at = await staking.unbondingAt(node.address);
      await expect(staking.connect(node).stake(h.Role.Relay, { value: MIN }))
        .to.be.revertedWithCustomError(staking, "AlreadyUnbonding")
        .withArgs(node.address, at);
    });
    it("withdraw_relay_sameDelayAsOtherRoles", async function () {
      const { staking, node } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Relay, { value: MIN });
      await staking.connect(node).requestUnstake();
      expect(await staking.isEligible(node.address)).to.equal(false);
      const at = await staking.unbondingAt(node.address);
      await time.increaseTo(at - 2n); // the challenge window has passed, the delay has not
      await expect(staking.connect(node).withdraw())
        .to.be.revertedWithCustomError(staking, "UnbondingNotElapsed")
        .withArgs(node.address, at);
      await time.increaseTo(at);
      const tx = staking.connect(node).withdraw();
      await expect(tx).to.emit(staking, "Withdrawn").withArgs(node.address, MIN);
      await expect(tx).to.changeEtherBalances([node, staking], [MIN, -MIN]);
      expect(await staking.roleOf(node.address)).to.equal(h.Role.None);
      expect(await staking.totalStaked()).to.equal(0n);
    });
    it("slash_relayNotFraudProofs_reverts", async function () {
      const { staking, node, other } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Relay, { value: MIN });
      await expect(staking.connect(other).slash(node.address, h.Offence.Timeout, 10000n, other.address))
        .to.be.revertedWithCustomError(staking, "NotFraudProofs")
        .withArgs(other.address);
    });
    it("slashByVerdict_relay_slashesRewardsAndBurns", async function () {
      const { staking, fraudProofs, members, committeeDomain, node, challenger } = await loadFixture(fixture);
      await staking.connect(node).stake(h.Role.Relay, { value: MIN });
      const v = {
        node: node.address,
        offence: h.Offence.Timeout,
        evidenceHash: ethers.id("relay dropped cloves"),
        challenger: challenger.address,
        nonce: 1n,
        consumer: await fraudProofs.getAddress(),
      };
      const sigs = await h.signAll(members.slice(0, 3), committeeDomain, "Verdict", v);
      const slashed = (MIN * 500n) / 10000n; // Timeout: 5 %
      await expect(fraudProofs.slashByVerdict(v, sigs))
        .to.emit(staking, "Slashed")
        .withArgs(node.address, h.Offence.Timeout, slashed, challenger.address, slashed / 2n, slashed - slashed / 2n);
      expect(await staking.stakeOf(node.address)).to.equal(MIN - slashed);
      expect(await staking.isEligible(node.address)).to.equal(false); // below the relay minimum
      expect(await staking.creditOf(challenger.address)).to.equal(slashed / 2n);
    });
  });
});
