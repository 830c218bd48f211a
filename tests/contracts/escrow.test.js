// QueryEscrow: deposits and refunds, committee-signed settlement, Merkle claims after the challenge
// window, disputes by committee equivocation, and hostile payees.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

const MAX_DEPOSIT = 2n ** 64n - 1n;
const FEE_CAP = h.ONE / 100n;
const QueryStatus = { None: 0n, Funded: 1n, Settled: 2n, Reclaimed: 3n, Refunded: 4n };
const EpochStatus = { None: 0n, Posted: 1n, Disputed: 2n };

describe("QueryEscrow", function () {
  async function fixture() {
    const env = await h.deployAll();
    const [deployer, user, user2, op1, op2, stranger, gateway, gateway2] = await ethers.getSigners();
    const receiver = await (await ethers.getContractFactory("ReentrantReceiver")).deploy();
    const q1 = ethers.id("query-1");
    const q2 = ethers.id("query-2");
    // q1 and q2 are paid to op1 (their gateway): a page listing them pays op1 alone (one leaf)
    await env.escrow.connect(user).deposit(q1, ethers.id("model"), op1.address, { value: FEE_CAP });
    await env.escrow.connect(user2).deposit(q2, ethers.id("model"), op1.address, { value: FEE_CAP });
    return { ...env, deployer, user, user2, op1, op2, stranger, gateway, gateway2, receiver, q1, q2 };
  }

  /** Signs and returns everything for an epoch paying `entries` for `queryIds`/`fees`. */
  async function statement(env, epoch, entries, queryIds, fees, signers = env.members) {
    const tree = h.merkleTree(entries.map((e) => ({ epoch, ...e })));
    const total = fees.reduce((a, b) => a + b, 0n);
    const qh = h.queriesHash(queryIds, fees);
    const sigs = await h.signAll(signers, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch, root: tree.root, total, queriesHash: qh });
    return { epoch, tree, total, qh, sigs, queryIds, fees };
  }
  const post = (env, s) =>
    env.escrow.postPayoutRoot(s.epoch, s.tree.root, s.total, h.charges(s.queryIds, s.fees, s.payers, s.gateways, s.debits), s.sigs);

  /** A statement with no per-query deposit (its rows may pay anyone): `user` prepays `gateway`
   * `total` and the statement debits it, paying `entries`. */
  async function prepaidStatement(env, epoch, entries, total) {
    await env.escrow.connect(env.user).depositBalance(env.gateway.address, { value: total });
    const tree = h.merkleTree(entries.map((e) => ({ epoch, ...e })));
    const [payers, gateways, debits] = [[env.user.address], [env.gateway.address], [total]];
    const qh = h.queriesHash([], [], payers, gateways, debits);
    const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch, root: tree.root, total, queriesHash: qh });
    return { epoch, tree, total, qh, sigs, queryIds: [], fees: [], payers, gateways, debits };
  }

  /** A statement charging `queryIds`/`fees` plus optional debits, paying `entries`. */
  async function pageStatement(env, epoch, entries, queryIds, fees, payers = [], gateways = [], debits = []) {
    const tree = h.merkleTree(entries.map((e) => ({ epoch, ...e })));
    const total = [...fees, ...debits].reduce((a, b) => a + b, 0n);
    const qh = h.queriesHash(queryIds, fees, payers, gateways, debits);
    const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch, root: tree.root, total, queriesHash: qh });
    return { epoch, tree, total, qh, sigs, queryIds, fees, payers, gateways, debits };
  }

  async function settledFixture() {
    const env = await fixture();
    const fees = [FEE_CAP / 2n, FEE_CAP / 4n];
    const s = await statement(
      env,
      1n,
      [{ account: env.op1.address, amount: (FEE_CAP * 3n) / 4n }],
      [env.q1, env.q2],
      fees,
    );
    await post(env, s);
    return { ...env, s };
  }

  describe("constructor", function () {
    it("constructor_zeroWindows_reverts", async function () {
      const F = await ethers.getContractFactory("QueryEscrow");
      const c = ethers.Wallet.createRandom().address;
      await expect(F.deploy(c, 0n, 600n)).to.be.revertedWithCustomError(F, "InvalidWindows").withArgs(0n, 600n);
      await expect(F.deploy(c, 60n, 0n)).to.be.revertedWithCustomError(F, "InvalidWindows").withArgs(60n, 0n);
      await expect(F.deploy(c, 2n ** 32n, 600n)).to.be.revertedWithCustomError(F, "InvalidWindows");
    });
  });

  describe("deposit", function () {
    it("deposit_fresh_fundsQueryBoundToModelAndGateway", async function () {
      const { escrow, user, gateway2 } = await loadFixture(fixture);
      const q = ethers.id("fresh");
      const tx = escrow.connect(user).deposit(q, ethers.id("smollm2"), gateway2.address, { value: 123n });
      await expect(tx).to.emit(escrow, "Deposited").withArgs(q, user.address, ethers.id("smollm2"), gateway2.address, 123n);
      await expect(tx).to.changeEtherBalances([user, escrow], [-123n, 123n]);
      expect(await escrow.isFunded(q)).to.equal(true);
      const d = await escrow.depositOf(q);
      expect(d.user).to.equal(user.address);
      expect(d.amount).to.equal(123n);
      expect(d.status).to.equal(QueryStatus.Funded);
      expect(d.depositedAt).to.equal(BigInt(await time.latest()));
      expect(d.modelId).to.equal(ethers.id("smollm2"));
      expect(d.gateway).to.equal(gateway2.address);
    });
    it("depositOf_manyModelsAndGateways_eachQueryKeepsItsOwn", async function () {
      const { escrow, user, gateway, gateway2, q1 } = await loadFixture(fixture);
      // models named again, new ones, and the zero id, in an interleaved order
      const cases = [
        ["a", ethers.id("model"), gateway2],
        ["b", ethers.id("other model"), gateway],
        ["c", ethers.ZeroHash, gateway2],
        ["d", ethers.id("other model"), gateway2],
        ["e", ethers.id("model"), gateway],
      ];
      for (const [label, model, gw] of cases) await escrow.connect(user).deposit(ethers.id(label), model, gw.address, { value: 5n });
      for (const [label, model, gw] of cases) {
        const d = await escrow.depositOf(ethers.id(label));
        expect([d.modelId, d.gateway], label).to.deep.equal([model, gw.address]);
      }
      expect((await escrow.depositOf(q1)).modelId).to.equal(ethers.id("model"));
      // a settled or refunded query still names its model and gateway
      await time.increase(h.DEFAULTS.refundTimeout);
      await escrow.connect(user).refund(ethers.id("b"));
      const d = await escrow.depositOf(ethers.id("b"));
      expect([d.status, d.modelId, d.gateway]).to.deep.equal([QueryStatus.Refunded, ethers.id("other model"), gateway.address]);
    });
    it("deposit_secondForKnownModel_costsLessThanFirst", async function () {
      const { escrow, user, gateway } = await loadFixture(fixture);
      const gasOf = async (tx) => (await (await tx).wait()).gasUsed;
      const first = await gasOf(escrow.connect(user).deposit(ethers.id("g1"), ethers.id("new model"), gateway.address, { value: 5n }));
      const again = await gasOf(escrow.connect(user).deposit(ethers.id("g2"), ethers.id("new model"), gateway.address, { value: 5n }));
      // the model id is stored once: a deposit for a known model writes two slots, not three
      expect(first - again).to.be.greaterThan(40000n);
      expect(again).to.be.lessThan(75000n);
    });
    it("deposit_maxAmount_accepted", async function () {
      const { escrow, user, gateway } = await loadFixture(fixture);
      await escrow.connect(user).deposit(ethers.id("max"), ethers.ZeroHash, gateway.address, { value: MAX_DEPOSIT });
      expect((await escrow.depositOf(ethers.id("max"))).amount).to.equal(MAX_DEPOSIT);
    });
    it("deposit_zeroOrTooLarge_reverts", async function () {
      const { escrow, user, gateway } = await loadFixture(fixture);
      await expect(escrow.connect(user).deposit(ethers.id("z"), ethers.ZeroHash, gateway.address))
        .to.be.revertedWithCustomError(escrow, "InvalidDepositAmount")
        .withArgs(0n, MAX_DEPOSIT);
      await expect(escrow.connect(user).deposit(ethers.id("z"), ethers.ZeroHash, gateway.address, { value: MAX_DEPOSIT + 1n }))
        .to.be.revertedWithCustomError(escrow, "InvalidDepositAmount")
        .withArgs(MAX_DEPOSIT + 1n, MAX_DEPOSIT);
    });
    it("deposit_zeroGateway_revertsInvalidGateway", async function () {
      const { escrow, user } = await loadFixture(fixture);
      await expect(escrow.connect(user).deposit(ethers.id("z"), ethers.ZeroHash, ethers.ZeroAddress, { value: 1n }))
        .to.be.revertedWithCustomError(escrow, "InvalidGateway")
        .withArgs(ethers.ZeroAddress);
      expect((await escrow.depositOf(ethers.id("z"))).status).to.equal(QueryStatus.None);
    });
    it("deposit_existingQueryId_reverts", async function () {
      const { escrow, stranger, gateway2, q1 } = await loadFixture(fixture);
      // not even for another gateway: one payment, one gateway
      await expect(escrow.connect(stranger).deposit(q1, ethers.ZeroHash, gateway2.address, { value: 1n }))
        .to.be.revertedWithCustomError(escrow, "QueryExists")
        .withArgs(q1);
    });
    it("isFunded_unknownQuery_false", async function () {
      const { escrow } = await loadFixture(fixture);
      expect(await escrow.isFunded(ethers.id("nope"))).to.equal(false);
      const d = await escrow.depositOf(ethers.id("nope"));
      expect([d.status, d.modelId, d.gateway]).to.deep.equal([QueryStatus.None, ethers.ZeroHash, ethers.ZeroAddress]);
    });
  });

  describe("refund", function () {
    it("refund_afterTimeoutUnsettled_returnsAll", async function () {
      const { escrow, user, q1 } = await loadFixture(fixture);
      const { depositedAt } = await escrow.depositOf(q1);
      await time.increaseTo(depositedAt + h.DEFAULTS.refundTimeout - 1n);
      const tx = escrow.connect(user).refund(q1);
      await expect(tx).to.emit(escrow, "Refunded").withArgs(q1, user.address, FEE_CAP);
      await expect(tx).to.changeEtherBalances([user, escrow], [FEE_CAP, -FEE_CAP]);
      expect(await escrow.isFunded(q1)).to.equal(false);
      expect((await escrow.depositOf(q1)).status).to.equal(QueryStatus.Refunded);
      await expect(escrow.connect(user).refund(q1)).to.be.revertedWithCustomError(escrow, "NothingToRefund").withArgs(q1);
      await expect(escrow.connect(user).deposit(q1, ethers.ZeroHash, user.address, { value: 1n })).to.be.revertedWithCustomError(escrow, "QueryExists");
    });
    it("refund_beforeTimeout_reverts", async function () {
      const { escrow, user, q1 } = await loadFixture(fixture);
      const { depositedAt } = await escrow.depositOf(q1);
      await expect(escrow.connect(user).refund(q1))
        .to.be.revertedWithCustomError(escrow, "RefundNotYetAvailable")
        .withArgs(q1, depositedAt + h.DEFAULTS.refundTimeout);
    });
    it("refund_notDepositor_reverts", async function () {
      const { escrow, stranger, q1 } = await loadFixture(fixture);
      await time.increase(h.DEFAULTS.refundTimeout);
      await expect(escrow.connect(stranger).refund(q1))
        .to.be.revertedWithCustomError(escrow, "NotDepositor")
        .withArgs(q1, stranger.address);
      await expect(escrow.connect(stranger).refund(ethers.id("unknown"))).to.be.revertedWithCustomError(escrow, "NotDepositor");
    });
    it("refund_settledQuery_returnsRemainderImmediately", async function () {
      const { escrow, user, user2, q1, q2 } = await loadFixture(settledFixture);
      const d = await escrow.depositOf(q1);
      expect(d.status).to.equal(QueryStatus.Settled);
      expect(d.amount).to.equal(FEE_CAP / 2n);
      await expect(escrow.connect(user).refund(q1)).to.changeEtherBalance(user, FEE_CAP / 2n);
      await expect(escrow.connect(user2).refund(q2)).to.changeEtherBalance(user2, (FEE_CAP * 3n) / 4n);
      expect((await escrow.depositOf(q1)).status).to.equal(QueryStatus.Settled);
      await expect(escrow.connect(user).refund(q1)).to.be.revertedWithCustomError(escrow, "NothingToRefund");
    });
    it("refund_receiverReenters_blocked", async function () {
      const { escrow, receiver, gateway } = await loadFixture(fixture);
      const q = ethers.id("hostile");
      const e = await escrow.getAddress();
      await receiver.act(e, 1000n, escrow.interface.encodeFunctionData("deposit", [q, ethers.ZeroHash, gateway.address]), { value: 1000n });
      await time.increase(h.DEFAULTS.refundTimeout);
      await receiver.arm(e, escrow.interface.encodeFunctionData("refund", [q]));
      await receiver.act(e, 0, escrow.interface.encodeFunctionData("refund", [q]));
      expect(await receiver.reentrySuccesses()).to.equal(0n);
      expect(escrow.interface.parseError(await receiver.lastReentryError()).name).to.equal("ReentrancyGuardReentrantCall");
      expect(await ethers.provider.getBalance(await receiver.getAddress())).to.equal(1000n);
    });
    it("refund_receiverRejects_revertsTransferFailed", async function () {
      const { escrow, receiver, gateway } = await loadFixture(fixture);
      const q = ethers.id("rejecting");
      const e = await escrow.getAddress();
      await receiver.act(e, 1000n, escrow.interface.encodeFunctionData("deposit", [q, ethers.ZeroHash, gateway.address]), { value: 1000n });
      await time.increase(h.DEFAULTS.refundTimeout);
      await receiver.setRejectPayments(true);
      await expect(receiver.act(e, 0, escrow.interface.encodeFunctionData("refund", [q])))
        .to.be.revertedWithCustomError(escrow, "TransferFailed")
        .withArgs(await receiver.getAddress(), 1000n);
      expect(await escrow.isFunded(q)).to.equal(true);
    });
  });

  describe("postPayoutRoot", function () {
    it("postPayoutRoot_signedForAnotherEscrowSharingTheCommittee_reverts", async function () {
      const env = await loadFixture(fixture);
      // A second escrow on the same committee, with the same query funded there.
      const escrow2 = await (await ethers.getContractFactory("QueryEscrow")).deploy(
        await env.committee.getAddress(),
        h.DEFAULTS.challengeWindow,
        h.DEFAULTS.refundTimeout,
      );
      await escrow2.connect(env.user).deposit(env.q1, ethers.id("model"), env.gateway.address, { value: FEE_CAP });
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]);
      await expect(escrow2.postPayoutRoot(1n, s.tree.root, 5n, h.charges([env.q1], [5n]), s.sigs)).to.be.revertedWithCustomError(
        env.committee,
        "UnknownSigner",
      );
      await post(env, s); // the escrow it names accepts it
      expect(await escrow2.isFunded(env.q1)).to.equal(true);
    });
    it("postPayoutRoot_signed_settlesQueriesAndOpensWindow", async function () {
      const env = await loadFixture(fixture);
      const fees = [FEE_CAP, 1n];
      const s = await statement(env, 5n, [{ account: env.op1.address, amount: FEE_CAP + 1n }], [env.q1, env.q2], fees);
      const tx = await post(env, s);
      const claimableAt = (await h.blockTime(tx)) + h.DEFAULTS.challengeWindow;
      await expect(tx).to.emit(env.escrow, "PayoutRootPosted").withArgs(5n, s.tree.root, FEE_CAP + 1n, s.qh, claimableAt);
      expect(await env.escrow.isFunded(env.q1)).to.equal(false);
      expect((await env.escrow.depositOf(env.q1)).amount).to.equal(0n);
      expect((await env.escrow.depositOf(env.q2)).amount).to.equal(FEE_CAP - 1n);
      const e = await env.escrow.epochOf(5n);
      expect(e.root).to.equal(s.tree.root);
      expect(e.unclaimed).to.equal(FEE_CAP + 1n);
      expect(e.claimableAt).to.equal(claimableAt);
      expect(e.status).to.equal(EpochStatus.Posted);
      expect(await env.escrow.rootOf(5n)).to.equal(s.tree.root);
    });
    it("postPayoutRoot_emptyEpoch_allowed", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 2n, [{ account: env.op1.address, amount: 0n }], [], []);
      await post(env, s);
      expect((await env.escrow.epochOf(2n)).status).to.equal(EpochStatus.Posted);
    });
    it("postPayoutRoot_sameEpochTwice_reverts", async function () {
      const { escrow, s, ...env } = await loadFixture(settledFixture);
      await expect(post({ escrow, ...env }, s)).to.be.revertedWithCustomError(escrow, "EpochAlreadyPosted").withArgs(1n);
    });
    it("postPayoutRoot_zeroRoot_reverts", async function () {
      const env = await loadFixture(fixture);
      await expect(env.escrow.postPayoutRoot(1n, ethers.ZeroHash, 0n, h.charges([], []), [])).to.be.revertedWithCustomError(env.escrow, "ZeroRoot");
    });
    it("postPayoutRoot_lengthMismatch_reverts", async function () {
      const env = await loadFixture(fixture);
      await expect(env.escrow.postPayoutRoot(1n, ethers.id("r"), 0n, h.charges([env.q1], []), []))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 0);
    });
    it("postPayoutRoot_unfundedQuery_reverts", async function () {
      const env = await loadFixture(fixture);
      const unknown = ethers.id("unknown");
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 1n }], [unknown], [1n]);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "QueryNotFunded").withArgs(unknown);
    });
    it("postPayoutRoot_duplicateQuery_reverts", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 2n }], [env.q1, env.q1], [1n, 1n]);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "QueryNotFunded").withArgs(env.q1);
    });
    it("postPayoutRoot_alreadySettledQuery_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const s2 = await statement(env, 2n, [{ account: env.op1.address, amount: 1n }], [env.q1], [1n]);
      await expect(post(env, s2)).to.be.revertedWithCustomError(env.escrow, "QueryNotFunded").withArgs(env.q1);
    });
    it("postPayoutRoot_feeAboveDeposit_reverts", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: FEE_CAP + 1n }], [env.q1], [FEE_CAP + 1n]);
      await expect(post(env, s))
        .to.be.revertedWithCustomError(env.escrow, "FeeExceedsDeposit")
        .withArgs(env.q1, FEE_CAP + 1n, FEE_CAP);
    });
    it("postPayoutRoot_totalNotSumOfFees_reverts", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]);
      const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch: 1n, root: s.tree.root, total: 6n, queriesHash: s.qh });
      await expect(env.escrow.postPayoutRoot(1n, s.tree.root, 6n, h.charges([env.q1], [5n]), sigs))
        .to.be.revertedWithCustomError(env.escrow, "TotalMismatch")
        .withArgs(6n, 5n);
    });
    it("postPayoutRoot_insufficientSignatures_reverts", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n], env.members.slice(0, 2));
      await expect(post(env, s)).to.be.revertedWithCustomError(env.committee, "InsufficientPower").withArgs(2, 4);
    });
    it("postPayoutRoot_feesDifferFromSigned_reverts", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]);
      await expect(env.escrow.postPayoutRoot(1n, s.tree.root, 5n, h.charges([env.q2], [5n]), s.sigs)).to.be.revertedWithCustomError(
        env.committee,
        "UnknownSigner",
      );
    });
  });

  describe("claim", function () {
    it("claim_afterWindow_paysAccountOnce", async function () {
      const env = await loadFixture(settledFixture);
      const amount = (FEE_CAP * 3n) / 4n;
      await time.increaseTo((await env.escrow.epochOf(1n)).claimableAt);
      const tx = env.escrow.connect(env.op1).claim(1n, env.op1.address, amount, env.s.tree.proof(0));
      await expect(tx).to.emit(env.escrow, "Claimed").withArgs(1n, env.op1.address, amount);
      await expect(tx).to.changeEtherBalances([env.op1, env.escrow], [amount, -amount]);
      expect(await env.escrow.claimed(1n, env.op1.address)).to.equal(true);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal((FEE_CAP * 3n) / 4n - amount);
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, amount, env.s.tree.proof(0)))
        .to.be.revertedWithCustomError(env.escrow, "AlreadyClaimed")
        .withArgs(1n, env.op1.address);
      // the page pays its gateway alone: nobody else has a leaf in it
      await expect(env.escrow.connect(env.op2).claim(1n, env.op2.address, amount, env.s.tree.proof(0))).to.be.revertedWithCustomError(
        env.escrow,
        "InvalidClaim",
      );
    });
    it("claim_withinWindow_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { claimableAt } = await env.escrow.epochOf(1n);
      await time.increaseTo(claimableAt - 2n);
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, (FEE_CAP * 3n) / 8n, env.s.tree.proof(0)))
        .to.be.revertedWithCustomError(env.escrow, "ChallengeWindowOpen")
        .withArgs(1n, claimableAt);
    });
    it("claim_unpostedEpoch_reverts", async function () {
      const env = await loadFixture(settledFixture);
      await expect(env.escrow.connect(env.op1).claim(9n, env.op1.address, 1n, [])).to.be.revertedWithCustomError(env.escrow, "EpochNotPosted").withArgs(9n);
    });
    it("claim_forSomeoneElse_revertsNotPayee", async function () {
      const env = await loadFixture(settledFixture);
      await time.increase(h.DEFAULTS.challengeWindow);
      await expect(env.escrow.connect(env.stranger).claim(1n, env.op1.address, (FEE_CAP * 3n) / 8n, env.s.tree.proof(0)))
        .to.be.revertedWithCustomError(env.escrow, "NotPayee")
        .withArgs(env.op1.address, env.stranger.address);
    });
    it("claim_badProofOrAmountOrAccount_revertsInvalidClaim", async function () {
      const env = await loadFixture(settledFixture);
      await time.increase(h.DEFAULTS.challengeWindow);
      const amount = (FEE_CAP * 3n) / 8n;
      const op1 = env.escrow.connect(env.op1);
      await expect(op1.claim(1n, env.op1.address, amount + 1n, env.s.tree.proof(0)))
        .to.be.revertedWithCustomError(env.escrow, "InvalidClaim")
        .withArgs(1n, env.op1.address, amount + 1n);
      await expect(op1.claim(1n, env.op1.address, amount, env.s.tree.proof(1))).to.be.revertedWithCustomError(env.escrow, "InvalidClaim");
      await expect(env.escrow.connect(env.stranger).claim(1n, env.stranger.address, amount, env.s.tree.proof(0))).to.be.revertedWithCustomError(
        env.escrow,
        "InvalidClaim",
      );
      await expect(op1.claim(1n, env.op1.address, 0n, [])).to.be.revertedWithCustomError(env.escrow, "InvalidClaim");
    });
    it("claim_zeroAmountLeaf_revertsInvalidClaim", async function () {
      const env = await loadFixture(fixture);
      const s = await prepaidStatement(
        env,
        4n,
        [
          { account: env.op2.address, amount: 1n },
          { account: env.op1.address, amount: 0n },
        ],
        1n,
      );
      await post(env, s);
      await time.increase(h.DEFAULTS.challengeWindow);
      await expect(env.escrow.connect(env.op1).claim(4n, env.op1.address, 0n, s.tree.proof(1))).to.be.revertedWithCustomError(env.escrow, "InvalidClaim");
      await env.escrow.connect(env.op2).claim(4n, env.op2.address, 1n, s.tree.proof(0));
    });
    it("claim_leavesAboveTotal_neverPaysMoreThanEpochHolds", async function () {
      const env = await loadFixture(fixture);
      // A (buggy) root whose leaves sum to more than the epoch's fees.
      const s = await prepaidStatement(
        env,
        3n,
        [
          { account: env.op1.address, amount: FEE_CAP },
          { account: env.op2.address, amount: FEE_CAP },
        ],
        FEE_CAP,
      );
      await post(env, s);
      await time.increase(h.DEFAULTS.challengeWindow);
      await env.escrow.connect(env.op1).claim(3n, env.op1.address, FEE_CAP, s.tree.proof(0));
      await expect(env.escrow.connect(env.op2).claim(3n, env.op2.address, FEE_CAP, s.tree.proof(1)))
        .to.be.revertedWithCustomError(env.escrow, "ExceedsUnclaimed")
        .withArgs(3n, FEE_CAP, 0n);
    });
    it("claim_receiverReenters_blockedAndPaidOnce", async function () {
      const env = await loadFixture(fixture);
      const r = await env.receiver.getAddress();
      const s = await prepaidStatement(
        env,
        6n,
        [
          { account: r, amount: FEE_CAP / 2n },
          { account: env.op1.address, amount: FEE_CAP / 2n },
        ],
        FEE_CAP,
      );
      await post(env, s);
      await time.increase(h.DEFAULTS.challengeWindow);
      const e = await env.escrow.getAddress();
      const data = env.escrow.interface.encodeFunctionData("claim", [6n, r, FEE_CAP / 2n, s.tree.proof(0)]);
      await env.receiver.arm(e, data);
      await env.receiver.act(e, 0, data);
      expect(await env.receiver.reentrySuccesses()).to.equal(0n);
      expect(await ethers.provider.getBalance(r)).to.equal(FEE_CAP / 2n);
      // A reentry that would have passed the guard still finds the claim already recorded.
      await expect(env.receiver.act(e, 0, data)).to.be.revertedWithCustomError(env.escrow, "AlreadyClaimed");
    });
    it("claim_receiverRejects_revertsAndStaysClaimable", async function () {
      const env = await loadFixture(fixture);
      const r = await env.receiver.getAddress();
      const s = await prepaidStatement(env, 6n, [{ account: r, amount: FEE_CAP }], FEE_CAP);
      await post(env, s);
      await time.increase(h.DEFAULTS.challengeWindow);
      await env.receiver.setRejectPayments(true);
      const e = await env.escrow.getAddress();
      const data = env.escrow.interface.encodeFunctionData("claim", [6n, r, FEE_CAP, s.tree.proof(0)]);
      await expect(env.receiver.act(e, 0, data)).to.be.revertedWithCustomError(env.escrow, "TransferFailed").withArgs(r, FEE_CAP);
      await env.receiver.setRejectPayments(false);
      await env.receiver.act(e, 0, data);
      expect(await ethers.provider.getBalance(r)).to.equal(FEE_CAP);
    });
  });

  describe("disputeRoot", function () {
    async function conflicting(env) {
      const other = { epoch: 1n, root: ethers.id("other root"), total: env.s.total, queriesHash: env.s.qh };
      const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { ...other, consumer: await env.escrow.getAddress() });
      return { other: { root: other.root, total: other.total, queriesHash: other.queriesHash }, sigs };
    }
    it("disputeRoot_equivocation_freezesEpochAndReturnsFees", async function () {
      const env = await loadFixture(settledFixture);
      const { other, sigs } = await conflicting(env);
      await expect(env.escrow.connect(env.stranger).disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, other, sigs))
        .to.emit(env.escrow, "RootDisputed")
        .withArgs(1n, other.root, other.total, other.queriesHash);
      const e = await env.escrow.epochOf(1n);
      expect(e.status).to.equal(EpochStatus.Disputed);
      expect(e.unclaimed).to.equal(0n);
      for (const [q, u] of [
        [env.q1, env.user],
        [env.q2, env.user2],
      ]) {
        const d = await env.escrow.depositOf(q);
        expect(d.status).to.equal(QueryStatus.Reclaimed);
        expect(d.amount).to.equal(FEE_CAP);
        await expect(env.escrow.connect(u).refund(q)).to.changeEtherBalance(u, FEE_CAP);
      }
      await time.increase(h.DEFAULTS.challengeWindow);
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, (FEE_CAP * 3n) / 8n, env.s.tree.proof(0))).to.be.revertedWithCustomError(
        env.escrow,
        "EpochNotPosted",
      );
      expect(await ethers.provider.getBalance(await env.escrow.getAddress())).to.equal(0n);
    });
    it("disputeRoot_differentQueriesHashOnly_isEquivocation", async function () {
      const env = await loadFixture(settledFixture);
      const other = { epoch: 1n, root: env.s.tree.root, total: env.s.total, queriesHash: ethers.id("other list") };
      const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { ...other, consumer: await env.escrow.getAddress() });
      await env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, { root: other.root, total: other.total, queriesHash: other.queriesHash }, sigs);
      expect((await env.escrow.epochOf(1n)).status).to.equal(EpochStatus.Disputed);
    });
    it("disputeRoot_sameStatement_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const same = { root: env.s.tree.root, total: env.s.total, queriesHash: env.s.qh };
      await expect(env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, same, env.s.sigs))
        .to.be.revertedWithCustomError(env.escrow, "SameStatement")
        .withArgs(1n);
    });
    it("disputeRoot_afterWindow_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { other, sigs } = await conflicting(env);
      const { claimableAt } = await env.escrow.epochOf(1n);
      await time.increaseTo(claimableAt);
      await expect(env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, other, sigs))
        .to.be.revertedWithCustomError(env.escrow, "ChallengeWindowClosed")
        .withArgs(1n, claimableAt);
    });
    it("disputeRoot_unpostedOrAlreadyDisputed_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { other, sigs } = await conflicting(env);
      await expect(env.escrow.disputeRoot(2n, h.charges([], []), [], other, sigs)).to.be.revertedWithCustomError(env.escrow, "EpochNotPosted").withArgs(2n);
      await env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, other, sigs);
      await expect(env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, other, sigs))
        .to.be.revertedWithCustomError(env.escrow, "EpochNotPosted")
        .withArgs(1n);
    });
    it("disputeRoot_lengthMismatch_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { other, sigs } = await conflicting(env);
      await expect(env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, [1n]), env.s.sigs, other, sigs))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(2, 1);
    });
    it("disputeRoot_otherNotCommitteeSigned_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { other } = await conflicting(env);
      const forged = await h.signAll(h.wallets(3, "forgers"), env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch: 1n, ...other });
      await expect(env.escrow.disputeRoot(1n, h.charges(env.s.queryIds, env.s.fees), env.s.sigs, other, forged)).to.be.revertedWithCustomError(
        env.committee,
        "UnknownSigner",
      );
    });
    it("disputeRoot_wrongPostedList_reverts", async function () {
      const env = await loadFixture(settledFixture);
      const { other, sigs } = await conflicting(env);
      // A list the committee never signed with the posted root: its signatures do not match.
      await expect(env.escrow.disputeRoot(1n, h.charges([env.q1, env.q2], [env.s.fees[1], env.s.fees[0]]), env.s.sigs, other, sigs)).to.be.revertedWithCustomError(
        env.committee,
        "UnknownSigner",
      );
    });
    it("disputeRoot_signedListWithUnsettledQuery_reverts", async function () {
      const env = await loadFixture(fixture);
      // The committee equivocates on which queries an epoch settled: the alternative list names a
      // query that was never settled, so fees cannot be routed to it.
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]);
      await post(env, s);
      const altQh = h.queriesHash([env.q2], [5n]);
      const alt = { epoch: 1n, root: s.tree.root, total: 5n, queriesHash: altQh };
      const altSigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { ...alt, consumer: await env.escrow.getAddress() });
      await expect(env.escrow.disputeRoot(1n, h.charges([env.q2], [5n]), altSigs, { root: s.tree.root, total: 5n, queriesHash: s.qh }, s.sigs))
        .to.be.revertedWithCustomError(env.escrow, "QueryNotSettled")
        .withArgs(env.q2);
    });
    it("disputeRoot_signedListSummingElsewhere_revertsTotalMismatch", async function () {
      const env = await loadFixture(fixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]);
      await post(env, s);
      const alt = { epoch: 1n, root: s.tree.root, total: 5n, queriesHash: h.queriesHash([env.q1], [4n]) };
      const altSigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { ...alt, consumer: await env.escrow.getAddress() });
      await expect(env.escrow.disputeRoot(1n, h.charges([env.q1], [4n]), altSigs, { root: s.tree.root, total: 5n, queriesHash: s.qh }, s.sigs))
        .to.be.revertedWithCustomError(env.escrow, "TotalMismatch")
        .withArgs(5n, 4n);
    });
  });
  describe("a page pays only its own gateway's deposits", function () {
    // q1, q2 are op1's deposits; q3 is gateway2's.
    async function twoGateways() {
      const env = await fixture();
      const q3 = ethers.id("query-3");
      await env.escrow.connect(env.user).deposit(q3, ethers.id("model"), env.gateway2.address, { value: FEE_CAP });
      return { ...env, q3 };
    }
    it("postPayoutRoot_gatewayListsAnothersDeposit_revertsWrongGatewayQuery", async function () {
      const env = await loadFixture(twoGateways);
      // gateway2's page (its own q3 first) also lists op1's q1: the page cannot be posted
      const s = await pageStatement(env, 1n, [{ account: env.gateway2.address, amount: 2n }], [env.q3, env.q1], [1n, 1n]);
      await expect(post(env, s))
        .to.be.revertedWithCustomError(env.escrow, "WrongGatewayQuery")
        .withArgs(env.q1, env.op1.address, env.gateway2.address);
      expect(await env.escrow.isFunded(env.q1)).to.equal(true);
    });
    it("postPayoutRoot_anothersDepositListedFirst_revertsRootNotPayee", async function () {
      const env = await loadFixture(twoGateways);
      // gateway2 claims op1's deposit alone: its root pays gateway2, the deposit names op1
      const s = await pageStatement(env, 1n, [{ account: env.gateway2.address, amount: 5n }], [env.q1], [5n]);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "RootNotPayee").withArgs(1n, env.op1.address, 5n);
    });
    it("postPayoutRoot_pageMixingTwoGatewaysRows_revertsRootNotPayee", async function () {
      const env = await loadFixture(twoGateways);
      const rows = [
        { account: env.op1.address, amount: 3n },
        { account: env.gateway2.address, amount: 2n },
      ];
      const s = await pageStatement(env, 1n, rows, [env.q1], [5n]);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "RootNotPayee").withArgs(1n, env.op1.address, 5n);
      const mixed = await pageStatement(env, 2n, rows, [env.q1, env.q3], [3n, 2n]);
      await expect(post(env, mixed))
        .to.be.revertedWithCustomError(env.escrow, "WrongGatewayQuery")
        .withArgs(env.q3, env.gateway2.address, env.op1.address);
    });
    it("postPayoutRoot_anothersRefundedDepositListed_revertsWrongGatewayQuery", async function () {
      const env = await loadFixture(twoGateways);
      await time.increase(h.DEFAULTS.refundTimeout);
      await env.escrow.connect(env.user).refund(env.q1);
      const s = await pageStatement(env, 1n, [{ account: env.gateway2.address, amount: 2n }], [env.q3, env.q1], [1n, 1n]);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "WrongGatewayQuery");
    });
    it("postPayoutRoot_queryPageDebitsAnotherGatewaysBalance_revertsWrongGatewayDebit", async function () {
      const env = await loadFixture(twoGateways);
      await env.escrow.connect(env.user2).depositBalance(env.gateway2.address, { value: 7n });
      const s = await pageStatement(env, 1n, [{ account: env.op1.address, amount: 12n }], [env.q1], [5n], [env.user2.address], [env.gateway2.address], [7n]);
      await expect(post(env, s))
        .to.be.revertedWithCustomError(env.escrow, "WrongGatewayDebit")
        .withArgs(env.user2.address, env.gateway2.address, env.op1.address);
      // nor does a query page buy credits (a (payer, escrow) debit) or draw on the pool
      const e = await env.escrow.getAddress();
      await env.escrow.connect(env.user2).depositBalance(e, { value: 7n });
      const buy = await pageStatement(env, 2n, [{ account: env.op1.address, amount: 12n }], [env.q1], [5n], [env.user2.address], [e], [7n]);
      await expect(post(env, buy)).to.be.revertedWithCustomError(env.escrow, "WrongGatewayDebit").withArgs(env.user2.address, e, env.op1.address);
    });
    it("deposit_frontRunForAnotherGateway_bindsOnlyTheFrontRunnersMoney", async function () {
      const env = await loadFixture(twoGateways);
      // a front-runner sees a user's deposit of q4 for op1 and deposits q4 first, for gateway2
      const q4 = ethers.id("query-4");
      await env.escrow.connect(env.stranger).deposit(q4, ethers.id("model"), env.gateway2.address, { value: 3n });
      await expect(env.escrow.connect(env.user).deposit(q4, ethers.id("model"), env.op1.address, { value: FEE_CAP }))
        .to.be.revertedWithCustomError(env.escrow, "QueryExists")
        .withArgs(q4);
      // the binding is the front-runner's own (op1 sees another gateway and depositor and
      // refuses to serve q4); op1 cannot be paid the front-runner's deposit either
      const d = await env.escrow.depositOf(q4);
      expect([d.user, d.gateway, d.amount]).to.deep.equal([env.stranger.address, env.gateway2.address, 3n]);
      const s = await pageStatement(env, 1n, [{ account: env.op1.address, amount: 3n }], [env.q1, q4], [0n, 3n]);
      await expect(post(env, s))
        .to.be.revertedWithCustomError(env.escrow, "WrongGatewayQuery")
        .withArgs(q4, env.gateway2.address, env.op1.address);
    });
    it("postPayoutRoot_ownDepositsAndDebits_paysTheGatewayAlone", async function () {
      const env = await loadFixture(twoGateways);
      await env.escrow.connect(env.user2).depositBalance(env.gateway2.address, { value: 7n });
      const s = await pageStatement(env, 1n, [{ account: env.gateway2.address, amount: 12n }], [env.q3], [5n], [env.user2.address], [env.gateway2.address], [7n]);
      await post(env, s);
      await time.increase(h.DEFAULTS.challengeWindow);
      // the other gateway holds no leaf in it
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, 12n, [])).to.be.revertedWithCustomError(env.escrow, "InvalidClaim");
      await expect(env.escrow.connect(env.gateway2).claim(1n, env.gateway2.address, 12n, [])).to.changeEtherBalance(env.gateway2, 12n);
      // op1's deposits are untouched, still payable on op1's own page
      expect(await env.escrow.isFunded(env.q1)).to.equal(true);
      await post(env, await pageStatement(env, 2n, [{ account: env.op1.address, amount: 5n }], [env.q1], [5n]));
    });
  });
});
