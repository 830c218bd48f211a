// QueryEscrow prepaid balances per (payer, gateway): one deposit, per-(payer, gateway) debits in the
// committee-signed settlement, withdrawal after a delay; a gateway's debit takes only from the
// balance deposited for it (one payer, two gateways: neither spends the other's); the races (a
// refund or a withdrawal before the root is posted never voids it: the shortfall rule pays claims
// pro rata), re-signing is not equivocation, disputes return exactly what was charged to the
// balance it came from, and random sequences over two gateways keep the escrow's ETH equal to what
// it owes (per-query deposits + prepaid balances + unclaimed epoch payouts).
const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

const MILLI = h.ONE / 1000n;
const U128_MAX = 2n ** 128n - 1n;

describe("QueryEscrow prepaid", function () {
  async function fixture() {
    const env = await h.deployAll();
    const signers = await ethers.getSigners();
    const [, a, b, c, op1, op2, stranger, g1, g2] = signers;
    // payers and gateways sorted by address (postPayoutRoot requires ascending (payer, gateway))
    const payers = h.sortByAddress([a, b, c]);
    const gateways = h.sortByAddress([g1, g2]);
    const receiver = await (await ethers.getContractFactory("ReentrantReceiver")).deploy();
    return { ...env, payers, gateways, gw: gateways[0].address, op1, op2, stranger, receiver };
  }

  /** Every payer has 10 milli at the first gateway (`env.gw`). */
  async function fundedFixture() {
    const env = await fixture();
    for (const p of env.payers) await env.escrow.connect(p).depositBalance(env.gw, { value: 10n * MILLI });
    return env;
  }

  /** Charges of prepaid debits only: `items` are [payer, gateway, debit] (sorted here). */
  function debitCharges(items, queryIds = [], fees = []) {
    const d = h.sortedDebits(items.map(([payer, gateway, debit]) => ({ payer, gateway, debit })));
    return h.charges(queryIds, fees, d.payers, d.gateways, d.debits);
  }

  /** Signs an epoch statement; `entries` are payout leaves, `charges` the Charges tuple. */
  async function statement(env, epoch, entries, charges, signers = env.members) {
    const tree = h.merkleTree(entries.map((e) => ({ epoch, ...e })));
    const total = [...charges.fees, ...charges.debits].reduce((x, y) => x + y, 0n);
    const qh = h.queriesHash(charges.queryIds, charges.fees, charges.payers, charges.gateways, charges.debits);
    const msg = { consumer: await env.escrow.getAddress(), epoch, root: tree.root, total, queriesHash: qh };
    const sigs = await h.signAll(signers, env.committeeDomain, "PayoutRoot", msg);
    return { epoch, tree, total, qh, sigs, charges, entries };
  }
  const post = (env, s) => env.escrow.postPayoutRoot(s.epoch, s.tree.root, s.total, s.charges, s.sigs);
  const claimAfterWindow = async () => time.increase(h.DEFAULTS.challengeWindow);
  const balanceOf = async (env, who, gateway = env.gw) => (await env.escrow.prepaidOf(who.address ?? who, gateway)).balance;

  describe("depositBalance", function () {
    it("depositBalance_twice_addsUpAndEmits", async function () {
      const { escrow, payers, gw } = await loadFixture(fixture);
      const [p] = payers;
      await expect(escrow.connect(p).depositBalance(gw, { value: 5n }))
        .to.emit(escrow, "BalanceDeposited")
        .withArgs(p.address, gw, 5n, 5n);
      const tx = escrow.connect(p).depositBalance(gw, { value: 7n });
      await expect(tx).to.emit(escrow, "BalanceDeposited").withArgs(p.address, gw, 7n, 12n);
      await expect(tx).to.changeEtherBalances([p, escrow], [-7n, 7n]);
      const v = await escrow.prepaidOf(p.address, gw);
      expect(v.balance).to.equal(12n);
      expect(v.withdrawableAt).to.equal(0n);
    });
    it("depositBalance_twoGateways_twoSeparateBalances", async function () {
      const { escrow, payers, gateways } = await loadFixture(fixture);
      const [p] = payers;
      const [g1, g2] = gateways.map((g) => g.address);
      await escrow.connect(p).depositBalance(g1, { value: 5n });
      await expect(escrow.connect(p).depositBalance(g2, { value: 3n })).to.emit(escrow, "BalanceDeposited").withArgs(p.address, g2, 3n, 3n);
      expect((await escrow.prepaidOf(p.address, g1)).balance).to.equal(5n);
      expect((await escrow.prepaidOf(p.address, g2)).balance).to.equal(3n);
      expect((await escrow.prepaidOf(payers[1].address, g1)).balance).to.equal(0n);
    });
    it("depositBalance_zero_reverts", async function () {
      const { escrow, payers, gw } = await loadFixture(fixture);
      await expect(escrow.connect(payers[0]).depositBalance(gw))
        .to.be.revertedWithCustomError(escrow, "InvalidDepositAmount")
        .withArgs(0n, U128_MAX);
    });
    it("depositBalance_zeroGateway_revertsInvalidGateway", async function () {
      const { escrow, payers } = await loadFixture(fixture);
      await expect(escrow.connect(payers[0]).depositBalance(ethers.ZeroAddress, { value: 1n }))
        .to.be.revertedWithCustomError(escrow, "InvalidGateway")
        .withArgs(ethers.ZeroAddress);
    });
    it("depositBalance_aboveUint128_revertsBalanceOverflow", async function () {
      const { escrow, payers, gateways, gw } = await loadFixture(fixture);
      const [p] = payers;
      await network.provider.send("hardhat_setBalance", [p.address, ethers.toQuantity(2n ** 130n)]);
      await escrow.connect(p).depositBalance(gw, { value: U128_MAX });
      await expect(escrow.connect(p).depositBalance(gw, { value: 1n }))
        .to.be.revertedWithCustomError(escrow, "BalanceOverflow")
        .withArgs(p.address, gw, U128_MAX, 1n);
      // the cap is per (payer, gateway)
      await escrow.connect(p).depositBalance(gateways[1].address, { value: 1n });
    });
  });

  describe("withdrawal", function () {
    it("requestWithdrawal_thenWithdrawAfterDelay_paysWholeBalance", async function () {
      const { escrow, payers, gw } = await loadFixture(fundedFixture);
      const [p] = payers;
      const requested = await escrow.connect(p).requestWithdrawal(gw);
      const at = (await h.blockTime(requested)) + h.DEFAULTS.refundTimeout;
      await expect(requested).to.emit(escrow, "WithdrawalRequested").withArgs(p.address, gw, 10n * MILLI, at);
      expect((await escrow.prepaidOf(p.address, gw)).withdrawableAt).to.equal(at);
      await expect(escrow.connect(p).withdrawBalance(gw))
        .to.be.revertedWithCustomError(escrow, "WithdrawalNotYetAvailable")
        .withArgs(p.address, gw, at);
      await time.increaseTo(at);
      const tx = escrow.connect(p).withdrawBalance(gw);
      await expect(tx).to.emit(escrow, "BalanceWithdrawn").withArgs(p.address, gw, 10n * MILLI);
      await expect(tx).to.changeEtherBalances([p, escrow], [10n * MILLI, -10n * MILLI]);
      const v = await escrow.prepaidOf(p.address, gw);
      expect([v.balance, v.withdrawableAt]).to.deep.equal([0n, 0n]);
      await expect(escrow.connect(p).withdrawBalance(gw)).to.be.revertedWithCustomError(escrow, "WithdrawalNotRequested").withArgs(p.address, gw);
    });
    it("requestWithdrawal_emptyOrTwice_reverts", async function () {
      const { escrow, payers, gateways, stranger, gw } = await loadFixture(fundedFixture);
      await expect(escrow.connect(stranger).requestWithdrawal(gw)).to.be.revertedWithCustomError(escrow, "NothingToWithdraw").withArgs(stranger.address, gw);
      // a balance at one gateway is nothing to withdraw at another
      const other = gateways[1].address;
      await expect(escrow.connect(payers[0]).requestWithdrawal(other))
        .to.be.revertedWithCustomError(escrow, "NothingToWithdraw")
        .withArgs(payers[0].address, other);
      await escrow.connect(payers[0]).requestWithdrawal(gw);
      const { withdrawableAt } = await escrow.prepaidOf(payers[0].address, gw);
      await expect(escrow.connect(payers[0]).requestWithdrawal(gw))
        .to.be.revertedWithCustomError(escrow, "WithdrawalAlreadyRequested")
        .withArgs(payers[0].address, gw, withdrawableAt);
    });
    it("withdrawal_atOneGateway_leavesTheOtherBalanceServing", async function () {
      const { escrow, payers, gateways, gw } = await loadFixture(fundedFixture);
      const [p] = payers;
      const other = gateways[1].address;
      await escrow.connect(p).depositBalance(other, { value: 4n * MILLI });
      await escrow.connect(p).requestWithdrawal(gw);
      expect((await escrow.prepaidOf(p.address, other)).withdrawableAt).to.equal(0n);
      await expect(escrow.connect(p).withdrawBalance(other)).to.be.revertedWithCustomError(escrow, "WithdrawalNotRequested").withArgs(p.address, other);
      await expect(escrow.connect(p).cancelWithdrawal(other)).to.be.revertedWithCustomError(escrow, "WithdrawalNotRequested").withArgs(p.address, other);
      await time.increase(h.DEFAULTS.refundTimeout);
      await expect(escrow.connect(p).withdrawBalance(gw)).to.changeEtherBalance(p, 10n * MILLI);
      const v = await escrow.prepaidOf(p.address, other);
      expect([v.balance, v.withdrawableAt]).to.deep.equal([4n * MILLI, 0n]);
    });
    it("cancelWithdrawal_clearsRequest_orRevertsWithoutOne", async function () {
      const { escrow, payers, gw } = await loadFixture(fundedFixture);
      const [p] = payers;
      await expect(escrow.connect(p).cancelWithdrawal(gw)).to.be.revertedWithCustomError(escrow, "WithdrawalNotRequested").withArgs(p.address, gw);
      await escrow.connect(p).requestWithdrawal(gw);
      await expect(escrow.connect(p).cancelWithdrawal(gw)).to.emit(escrow, "WithdrawalCancelled").withArgs(p.address, gw);
      expect((await escrow.prepaidOf(p.address, gw)).withdrawableAt).to.equal(0n);
      await time.increase(h.DEFAULTS.refundTimeout);
      await expect(escrow.connect(p).withdrawBalance(gw)).to.be.revertedWithCustomError(escrow, "WithdrawalNotRequested");
    });
    it("withdrawBalance_allDebited_clearsRequestPaysNothing", async function () {
      const env = await loadFixture(fundedFixture);
      const [p] = env.payers;
      await env.escrow.connect(p).requestWithdrawal(env.gw);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 10n * MILLI }], debitCharges([[p.address, env.gw, 10n * MILLI]]));
      await post(env, s);
      await time.increase(h.DEFAULTS.refundTimeout);
      const tx = env.escrow.connect(p).withdrawBalance(env.gw);
      await expect(tx).to.emit(env.escrow, "BalanceWithdrawn").withArgs(p.address, env.gw, 0n);
      await expect(tx).to.changeEtherBalance(p, 0n);
    });
    it("withdrawBalance_receiverRejects_revertsTransferFailed", async function () {
      const { escrow, receiver, gw } = await loadFixture(fixture);
      const e = await escrow.getAddress();
      const r = await receiver.getAddress();
      await receiver.act(e, 1000n, escrow.interface.encodeFunctionData("depositBalance", [gw]), { value: 1000n });
      await receiver.act(e, 0, escrow.interface.encodeFunctionData("requestWithdrawal", [gw]));
      await time.increase(h.DEFAULTS.refundTimeout);
      await receiver.setRejectPayments(true);
      await expect(receiver.act(e, 0, escrow.interface.encodeFunctionData("withdrawBalance", [gw])))
        .to.be.revertedWithCustomError(escrow, "TransferFailed")
        .withArgs(r, 1000n);
      expect((await escrow.prepaidOf(r, gw)).balance).to.equal(1000n);
    });
    it("withdrawBalance_receiverReenters_blocked", async function () {
      const { escrow, receiver, gw } = await loadFixture(fixture);
      const e = await escrow.getAddress();
      await receiver.act(e, 1000n, escrow.interface.encodeFunctionData("depositBalance", [gw]), { value: 1000n });
      await receiver.act(e, 0, escrow.interface.encodeFunctionData("requestWithdrawal", [gw]));
      await time.increase(h.DEFAULTS.refundTimeout);
      await receiver.arm(e, escrow.interface.encodeFunctionData("withdrawBalance", [gw]));
      await receiver.act(e, 0, escrow.interface.encodeFunctionData("withdrawBalance", [gw]));
      expect(await receiver.reentrySuccesses()).to.equal(0n);
      expect(await ethers.provider.getBalance(await receiver.getAddress())).to.equal(1000n);
    });
  });

  describe("postPayoutRoot with debits", function () {
    it("postPayoutRoot_debits_chargesEachPairOnce", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1, p2] = env.payers;
      const s = await statement(env, 3n, [{ account: env.op1.address, amount: 5n * MILLI }], debitCharges([[p1.address, env.gw, 2n * MILLI], [p2.address, env.gw, 3n * MILLI]]));
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(3n, p1.address, env.gw, 2n * MILLI, 8n * MILLI);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(3n, p2.address, env.gw, 3n * MILLI, 7n * MILLI);
      await expect(tx).not.to.emit(env.escrow, "SettlementShortfall");
      expect(await balanceOf(env, p1)).to.equal(8n * MILLI);
      expect(await balanceOf(env, p2)).to.equal(7n * MILLI);
      expect((await env.escrow.epochOf(3n)).unclaimed).to.equal(5n * MILLI);
      await claimAfterWindow();
      await expect(env.escrow.connect(env.op1).claim(3n, env.op1.address, 5n * MILLI, s.tree.proof(0))).to.changeEtherBalance(env.op1, 5n * MILLI);
    });
    it("postPayoutRoot_onePayerTwoGateways_debitsEachBalanceSeparately", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1] = env.payers;
      const [g1, g2] = env.gateways.map((g) => g.address);
      await env.escrow.connect(p1).depositBalance(g2, { value: 4n * MILLI });
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n * MILLI }], debitCharges([[p1.address, g2, 3n * MILLI], [p1.address, g1, 2n * MILLI]]));
      expect(s.charges.gateways).to.deep.equal([g1, g2]); // (payer, gateway) ascending
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(1n, p1.address, g1, 2n * MILLI, 8n * MILLI);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(1n, p1.address, g2, 3n * MILLI, MILLI);
      expect(await balanceOf(env, p1, g1)).to.equal(8n * MILLI);
      expect(await balanceOf(env, p1, g2)).to.equal(MILLI);
    });
    it("postPayoutRoot_mixedQueriesAndDebits_totalCoversBoth", async function () {
      const env = await loadFixture(fundedFixture);
      const q = ethers.id("per-query");
      await env.escrow.connect(env.stranger).deposit(q, ethers.id("model"), env.gw, { value: MILLI });
      const charges = debitCharges([[env.payers[0].address, env.gw, MILLI]], [q], [MILLI / 2n]);
      // a page charging a deposit pays the deposit's gateway alone
      const s = await statement(env, 1n, [{ account: env.gw, amount: (3n * MILLI) / 2n }], charges);
      await expect(post(env, s)).to.emit(env.escrow, "PayoutRootPosted").withArgs(1n, s.tree.root, (3n * MILLI) / 2n, s.qh, (await time.latest()) + 1 + Number(h.DEFAULTS.challengeWindow));
      expect((await env.escrow.depositOf(q)).amount).to.equal(MILLI / 2n);
      expect(await balanceOf(env, env.payers[0])).to.equal(9n * MILLI);
    });
    it("postPayoutRoot_pairsUnsortedOrDuplicateOrZeroPayer_revertsPayersNotSorted", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1, p2] = env.payers.map((p) => p.address);
      const [g1, g2] = env.gateways.map((g) => g.address);
      for (const [payers, gateways, index] of [
        [[p2, p1], [g1, g1], 1], // payers descending
        [[p2, p1], [g1, g2], 1], // payers descending, gateways ascending
        [[p1, p1], [g1, g1], 1], // the same pair twice
        [[p1, p1], [g2, g1], 1], // one payer, gateways descending
        [[p1, p2, p1], [g1, g1, g2], 2], // a pair of an earlier payer after a later one
        [[ethers.ZeroAddress], [g1], 0], // the zero payer
      ]) {
        const s = await statement(env, 1n, [{ account: env.op1.address, amount: 2n }], h.charges([], [], payers, gateways, payers.map(() => 1n)));
        await expect(post(env, s), `${index}`).to.be.revertedWithCustomError(env.escrow, "PayersNotSorted").withArgs(index);
      }
    });
    it("postPayoutRoot_gatewaysOrDebitsLengthMismatch_reverts", async function () {
      const env = await loadFixture(fundedFixture);
      const p = env.payers[0].address;
      await expect(env.escrow.postPayoutRoot(1n, ethers.id("r"), 0n, h.charges([], [], [p], [env.gw], []), []))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 0);
      await expect(env.escrow.postPayoutRoot(1n, ethers.id("r"), 0n, h.charges([], [], [p], [], [1n]), []))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 0);
      await expect(env.escrow.postPayoutRoot(1n, ethers.id("r"), 0n, h.charges([], [], [p], [env.gw, env.gw], [1n]), []))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 2);
    });
    it("postPayoutRoot_totalNotSumOfFeesAndDebits_reverts", async function () {
      const env = await loadFixture(fundedFixture);
      const charges = debitCharges([[env.payers[0].address, env.gw, 5n]]);
      const qh = h.queriesHash([], [], charges.payers, charges.gateways, charges.debits);
      const root = ethers.id("root");
      const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch: 1n, root, total: 6n, queriesHash: qh });
      await expect(env.escrow.postPayoutRoot(1n, root, 6n, charges, sigs)).to.be.revertedWithCustomError(env.escrow, "TotalMismatch").withArgs(6n, 5n);
    });
    it("postPayoutRoot_debitsDifferFromSigned_reverts", async function () {
      const env = await loadFixture(fundedFixture);
      const p = env.payers[0].address;
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], debitCharges([[p, env.gw, 5n]]));
      // a relayer who raises a payer's debit (an over-cap charge) breaks the committee signature
      const raised = { ...s, charges: debitCharges([[p, env.gw, 6n]]), total: 6n };
      await expect(post(env, raised)).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
      const moved = { ...s, charges: debitCharges([[env.payers[1].address, env.gw, 5n]]) };
      await expect(post(env, moved)).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
      // ... or moves it to the payer's balance at another gateway
      const elsewhere = { ...s, charges: debitCharges([[p, env.gateways[1].address, 5n]]) };
      await expect(post(env, elsewhere)).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
    });
    it("postPayoutRoot_replayedForAnotherEpoch_reverts", async function () {
      const env = await loadFixture(fundedFixture);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 5n }], debitCharges([[env.payers[0].address, env.gw, 5n]]));
      await post(env, s);
      await expect(post(env, s)).to.be.revertedWithCustomError(env.escrow, "EpochAlreadyPosted").withArgs(1n);
      await expect(post(env, { ...s, epoch: 2n })).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
      expect(await balanceOf(env, env.payers[0])).to.equal(10n * MILLI - 5n);
    });
  });

  describe("one payer, two gateways (adversarial)", function () {
    it("gatewayDebitsMoreThanItsBalance_chargesOnlyItsOwnSubBalance", async function () {
      const env = await loadFixture(fixture);
      const [p] = env.payers;
      const [g1, g2] = env.gateways.map((g) => g.address);
      await env.escrow.connect(p).depositBalance(g1, { value: 5n * MILLI });
      await env.escrow.connect(p).depositBalance(g2, { value: 3n * MILLI });
      // The payer spends its one 8-milli "wallet" twice: g1 reports 8 milli (all of both
      // balances), g2 reports its 3. g1 can take only the 5 deposited for it; g2's 3 stay g2's.
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 11n * MILLI }], debitCharges([[p.address, g1, 8n * MILLI], [p.address, g2, 3n * MILLI]]));
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "DebitShortfall").withArgs(1n, p.address, g1, 8n * MILLI, 5n * MILLI);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(1n, p.address, g2, 3n * MILLI, 0n);
      await expect(tx).to.emit(env.escrow, "SettlementShortfall").withArgs(1n, 11n * MILLI, 8n * MILLI);
      expect(await env.escrow.unchargedOf(1n, p.address, g1)).to.equal(3n * MILLI);
      expect(await env.escrow.unchargedOf(1n, p.address, g2)).to.equal(0n);
      expect(await balanceOf(env, p, g1)).to.equal(0n);
      expect(await balanceOf(env, p, g2)).to.equal(0n);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(8n * MILLI);
    });
    it("gatewayWithoutBalance_takesNothingFromTheOther", async function () {
      const env = await loadFixture(fixture);
      const [p] = env.payers;
      const [g1, g2] = env.gateways.map((g) => g.address);
      await env.escrow.connect(p).depositBalance(g2, { value: 3n * MILLI });
      // g1 was never funded by p: its whole debit is a shortfall, g2's balance is untouched
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 2n * MILLI }], debitCharges([[p.address, g1, 2n * MILLI]]));
      await expect(post(env, s)).to.emit(env.escrow, "DebitShortfall").withArgs(1n, p.address, g1, 2n * MILLI, 0n);
      expect(await balanceOf(env, p, g2)).to.equal(3n * MILLI);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(0n);
    });
    it("withdrawalAtOneGatewayBeforeRoot_onlyThatGatewaysDebitFallsShort", async function () {
      const env = await loadFixture(fixture);
      const [p] = env.payers;
      const [g1, g2] = env.gateways.map((g) => g.address);
      await env.escrow.connect(p).depositBalance(g1, { value: 5n * MILLI });
      await env.escrow.connect(p).depositBalance(g2, { value: 5n * MILLI });
      await env.escrow.connect(p).requestWithdrawal(g1);
      await time.increase(h.DEFAULTS.refundTimeout);
      await env.escrow.connect(p).withdrawBalance(g1);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 4n * MILLI }], debitCharges([[p.address, g1, 2n * MILLI], [p.address, g2, 2n * MILLI]]));
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "DebitShortfall").withArgs(1n, p.address, g1, 2n * MILLI, 0n);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(1n, p.address, g2, 2n * MILLI, 3n * MILLI);
      expect(await balanceOf(env, p, g2)).to.equal(3n * MILLI);
    });
    for (const seed of [5, 17, 2024]) {
      it(`randomTwoGatewayDebits_seed${seed}_eachGatewayTakesAtMostItsOwnSubBalance`, async function () {
        const env = await loadFixture(fixture);
        const [p] = env.payers;
        const gws = env.gateways.map((g) => g.address);
        const rnd = mulberry32(seed);
        const amount = (max) => (BigInt(Math.floor(rnd() * 1e6)) * max) / 1000000n;
        const model = new Map(gws.map((g) => [g, 0n])); // what each sub-balance holds
        let collected = 0n;
        for (let epoch = 1n; epoch <= 8n; epoch++) {
          for (const g of gws) {
            if (rnd() < 0.5) {
              const v = amount(4n * MILLI) + 1n;
              await env.escrow.connect(p).depositBalance(g, { value: v });
              model.set(g, model.get(g) + v);
            }
          }
          // each gateway claims any debit, often more than its own sub-balance (up to both)
          const items = gws.filter(() => rnd() < 0.8).map((g) => [p.address, g, amount(10n * MILLI) + 1n]);
          if (items.length === 0) continue;
          const charges = debitCharges(items);
          const total = charges.debits.reduce((a, b) => a + b, 0n);
          const s = await statement(env, epoch, [{ account: env.op1.address, amount: total }], charges);
          await post(env, s);
          let epochCollected = 0n;
          for (const [, g, debit] of items) {
            const before = model.get(g);
            const charged = debit <= before ? debit : before;
            model.set(g, before - charged);
            epochCollected += charged;
            expect(await env.escrow.unchargedOf(epoch, p.address, g)).to.equal(debit - charged);
          }
          for (const g of gws) expect(await balanceOf(env, p, g), `seed ${seed} epoch ${epoch}`).to.equal(model.get(g));
          expect((await env.escrow.epochOf(epoch)).unclaimed).to.equal(epochCollected);
          collected += epochCollected;
        }
        const held = model.get(gws[0]) + model.get(gws[1]) + collected;
        expect(await ethers.provider.getBalance(await env.escrow.getAddress())).to.equal(held);
      });
    }
  });

  describe("calldata hashing", function () {
    it("postPayoutRoot_nonCanonicalChargesEncoding_revertsAndChangesNothing", async function () {
      const env = await loadFixture(fundedFixture);
      const q = ethers.id("q");
      await env.escrow.connect(env.stranger).deposit(q, ethers.id("model"), env.gw, { value: MILLI });
      const charges = debitCharges([[env.payers[0].address, env.gw, MILLI]], [q], [MILLI]);
      const s = await statement(env, 1n, [{ account: env.gw, amount: 2n * MILLI }], charges);
      const data = env.escrow.interface.encodeFunctionData("postPayoutRoot", [s.epoch, s.tree.root, s.total, charges, s.sigs]);
      // Same decoded values, non-canonical bytes: a zero word between the queryIds and fees tails.
      const word = (hex, i) => BigInt("0x" + hex.slice(8 + 64 * i, 8 + 64 * (i + 1)));
      const put = (hex, i, v) => hex.slice(0, 8 + 64 * i) + v.toString(16).padStart(64, "0") + hex.slice(8 + 64 * (i + 1));
      let hex = data.slice(2);
      const tuple = Number(word(hex, 3)) / 32; // the Charges tuple's first word (after the selector)
      const feesAt = tuple + Number(word(hex, tuple + 1)) / 32;
      hex = put(hex, 4, word(hex, 4) + 32n); // bytes[] sigs moves one word down
      for (const k of [1, 2, 3, 4]) hex = put(hex, tuple + k, word(hex, tuple + k) + 32n);
      hex = hex.slice(0, 8 + 64 * feesAt) + "0".repeat(64) + hex.slice(8 + 64 * feesAt);
      const decoded = env.escrow.interface.decodeFunctionData("postPayoutRoot", "0x" + hex);
      expect(decoded[3].fees).to.deep.equal([MILLI]);
      expect(decoded[3].gateways).to.deep.equal([env.gw]);
      expect(decoded[3].debits).to.deep.equal([MILLI]);
      const [sender] = await ethers.getSigners();
      await expect(sender.sendTransaction({ to: await env.escrow.getAddress(), data: "0x" + hex })).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
      expect((await env.escrow.epochOf(1n)).status).to.equal(0n);
      await post(env, s); // the canonical encoding of the same call posts
      expect((await env.escrow.epochOf(1n)).status).to.equal(1n);
    });
  });

  describe("races: user actions never void a signed root", function () {
    it("withdrawThenPost_debitCappedAndClaimsProRata", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1, p2] = env.payers;
      // p1 served 4 milli, then requests and completes its withdrawal before the root lands
      await env.escrow.connect(p1).requestWithdrawal(env.gw);
      await time.increase(h.DEFAULTS.refundTimeout);
      await env.escrow.connect(p1).withdrawBalance(env.gw);
      const entries = [
        { account: env.op1.address, amount: 3n * MILLI },
        { account: env.op2.address, amount: 3n * MILLI },
      ];
      const s = await statement(env, 1n, entries, debitCharges([[p1.address, env.gw, 4n * MILLI], [p2.address, env.gw, 2n * MILLI]]));
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "DebitShortfall").withArgs(1n, p1.address, env.gw, 4n * MILLI, 0n);
      await expect(tx).to.emit(env.escrow, "SettlementShortfall").withArgs(1n, 6n * MILLI, 2n * MILLI);
      await expect(tx).to.emit(env.escrow, "PayoutRootPosted");
      expect(await env.escrow.unchargedOf(1n, p1.address, env.gw)).to.equal(4n * MILLI);
      const sf = await env.escrow.shortfallOf(1n);
      expect([sf.total, sf.collected]).to.deep.equal([6n * MILLI, 2n * MILLI]);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(2n * MILLI);
      await claimAfterWindow();
      // each payee gets amount * collected / total = a third
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, 3n * MILLI, s.tree.proof(0)))
        .to.emit(env.escrow, "Claimed")
        .withArgs(1n, env.op1.address, MILLI);
      await expect(env.escrow.connect(env.op2).claim(1n, env.op2.address, 3n * MILLI, s.tree.proof(1))).to.changeEtherBalance(env.op2, MILLI);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(0n);
    });
    it("partialBalance_chargedWhatItHas", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1] = env.payers;
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 15n * MILLI }], debitCharges([[p1.address, env.gw, 15n * MILLI]]));
      await expect(post(env, s)).to.emit(env.escrow, "DebitShortfall").withArgs(1n, p1.address, env.gw, 15n * MILLI, 10n * MILLI);
      expect(await balanceOf(env, p1)).to.equal(0n);
      expect(await env.escrow.unchargedOf(1n, p1.address, env.gw)).to.equal(5n * MILLI);
      await claimAfterWindow();
      await expect(env.escrow.connect(env.op1).claim(1n, env.op1.address, 15n * MILLI, s.tree.proof(0))).to.changeEtherBalance(env.op1, 10n * MILLI);
    });
    it("refundThenPost_queryUnchargedRootStillPosts", async function () {
      const env = await loadFixture(fundedFixture);
      const q1 = ethers.id("late refund");
      const q2 = ethers.id("kept");
      await env.escrow.connect(env.stranger).deposit(q1, ethers.id("model"), env.gw, { value: 3n * MILLI });
      await env.escrow.connect(env.stranger).deposit(q2, ethers.id("model"), env.gw, { value: 3n * MILLI });
      await time.increase(h.DEFAULTS.refundTimeout);
      await env.escrow.connect(env.stranger).refund(q1); // after the timeout, before the root
      // the page pays the deposits' gateway alone: one leaf for the signed total
      const entries = [{ account: env.gw, amount: 3n * MILLI + 1n }];
      const s = await statement(env, 1n, entries, h.charges([q1, q2], [2n * MILLI, MILLI + 1n]));
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "QueryUncharged").withArgs(1n, q1, 2n * MILLI);
      await expect(tx).to.emit(env.escrow, "SettlementShortfall").withArgs(1n, 3n * MILLI + 1n, MILLI + 1n);
      expect((await env.escrow.depositOf(q1)).status).to.equal(4n); // still Refunded
      expect((await env.escrow.depositOf(q2)).amount).to.equal(2n * MILLI - 1n);
      await claimAfterWindow();
      const paid1 = ((3n * MILLI + 1n) * (MILLI + 1n)) / (3n * MILLI + 1n);
      const gateway = env.gateways[0];
      await expect(env.escrow.connect(gateway).claim(1n, env.gw, 3n * MILLI + 1n, s.tree.proof(0))).to.changeEtherBalance(gateway, paid1);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(MILLI + 1n - paid1);
    });
  });

  describe("re-signing and disputes", function () {
    it("disputeRoot_sameStatementResignedByOtherMembers_revertsSameStatement", async function () {
      const env = await loadFixture(fundedFixture);
      const charges = debitCharges([[env.payers[0].address, env.gw, MILLI]]);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: MILLI }], charges, env.members.slice(0, 3));
      await post(env, s);
      // the committee signs the very same settlement again (another 3 of 4, e.g. after a restart)
      const again = await statement(env, 1n, [{ account: env.op1.address, amount: MILLI }], charges, env.members.slice(1, 4));
      expect(again.sigs).to.not.deep.equal(s.sigs);
      const same = { root: again.tree.root, total: again.total, queriesHash: again.qh };
      await expect(env.escrow.disputeRoot(1n, charges, s.sigs, same, again.sigs))
        .to.be.revertedWithCustomError(env.escrow, "SameStatement")
        .withArgs(1n);
      expect((await env.escrow.epochOf(1n)).status).to.equal(1n);
    });
    it("disputeRoot_differentStatement_returnsChargedDebitsAndFees", async function () {
      const env = await loadFixture(fundedFixture);
      const [p1, p2] = env.payers;
      const g2 = env.gateways[1].address;
      await env.escrow.connect(p1).depositBalance(g2, { value: MILLI });
      // p2 is short: only 10 of its 12 milli are charged; dispute must return exactly 10.
      // p1 pays at both gateways: each debit goes back to the balance it came from. (No
      // per-query deposit here: a page charging one pays its gateway alone; fees returned by a
      // dispute: escrow.test.js.)
      const charges = debitCharges([[p1.address, env.gw, 2n * MILLI], [p1.address, g2, MILLI], [p2.address, env.gw, 12n * MILLI]]);
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 15n * MILLI }], charges);
      await post(env, s);
      expect(await balanceOf(env, p1, g2)).to.equal(0n);
      const other = { root: ethers.id("other"), total: s.total, queriesHash: s.qh };
      const otherSigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch: 1n, ...other });
      const tx = env.escrow.connect(env.stranger).disputeRoot(1n, charges, s.sigs, other, otherSigs);
      await expect(tx).to.emit(env.escrow, "DebitReturned").withArgs(1n, p1.address, env.gw, 2n * MILLI);
      await expect(tx).to.emit(env.escrow, "DebitReturned").withArgs(1n, p1.address, g2, MILLI);
      await expect(tx).to.emit(env.escrow, "DebitReturned").withArgs(1n, p2.address, env.gw, 10n * MILLI);
      await expect(tx).to.emit(env.escrow, "RootDisputed");
      expect(await balanceOf(env, p1)).to.equal(10n * MILLI);
      expect(await balanceOf(env, p1, g2)).to.equal(MILLI);
      expect(await balanceOf(env, p2)).to.equal(10n * MILLI);
      const e = await env.escrow.epochOf(1n);
      expect([e.unclaimed, e.status]).to.deep.equal([0n, 2n]);
    });
    it("disputeRoot_withRefundedQueryInPostedList_skipsIt", async function () {
      const env = await loadFixture(fundedFixture);
      const q1 = ethers.id("refunded");
      await env.escrow.connect(env.stranger).deposit(q1, ethers.id("model"), env.gw, { value: MILLI });
      await time.increase(h.DEFAULTS.refundTimeout);
      await env.escrow.connect(env.stranger).refund(q1);
      const charges = debitCharges([[env.payers[0].address, env.gw, MILLI]], [q1], [MILLI]);
      const s = await statement(env, 1n, [{ account: env.gw, amount: 2n * MILLI }], charges);
      await post(env, s);
      const other = { root: ethers.id("other"), total: s.total, queriesHash: s.qh };
      const otherSigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await env.escrow.getAddress(), epoch: 1n, ...other });
      await env.escrow.disputeRoot(1n, charges, s.sigs, other, otherSigs);
      expect((await env.escrow.depositOf(q1)).status).to.equal(4n);
      expect((await env.escrow.depositOf(q1)).amount).to.equal(0n);
      expect(await balanceOf(env, env.payers[0])).to.equal(10n * MILLI);
    });
    it("disputeRoot_gatewaysOrDebitsLengthMismatch_reverts", async function () {
      const env = await loadFixture(fundedFixture);
      const p = env.payers[0].address;
      const s = await statement(env, 1n, [{ account: env.op1.address, amount: 1n }], debitCharges([[p, env.gw, 1n]]));
      await post(env, s);
      const other = { root: ethers.id("other"), total: 1n, queriesHash: s.qh };
      await expect(env.escrow.disputeRoot(1n, h.charges([], [], [p], [env.gw], []), s.sigs, other, s.sigs))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 0);
      await expect(env.escrow.disputeRoot(1n, h.charges([], [], [p], [], [1n]), s.sigs, other, s.sigs))
        .to.be.revertedWithCustomError(env.escrow, "LengthMismatch")
        .withArgs(1, 0);
    });
  });

  describe("credit pool: purchases fill it, the epochs that redeem draw from it", function () {
    /** A statement whose (payer, escrow) debits are purchases: outside the signed total. */
    async function poolStatement(env, epoch, entries, items) {
      const escrow = await env.escrow.getAddress();
      const charges = debitCharges(items);
      const total = items.filter(([p, g]) => !(g === escrow && p !== escrow)).reduce((x, [, , d]) => x + d, 0n);
      const tree = entries.length ? h.merkleTree(entries.map((e) => ({ epoch, ...e }))) : { root: ethers.id(`no rows ${epoch}`) };
      const qh = h.queriesHash(charges.queryIds, charges.fees, charges.payers, charges.gateways, charges.debits);
      const msg = { consumer: escrow, epoch, root: tree.root, total, queriesHash: qh };
      const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", msg);
      return { epoch, tree, total, qh, sigs, charges, entries };
    }
    /** A payer whose address sorts above the escrow's: its purchase is listed after the draw. */
    async function buyerFixture() {
      const env = await fixture();
      const escrow = await env.escrow.getAddress();
      const buyer = (await ethers.getSigners()).find((s) => BigInt(s.address) > BigInt(escrow));
      await env.escrow.connect(buyer).depositBalance(escrow, { value: 10n * MILLI });
      return { ...env, escrowAddress: escrow, buyer };
    }
    const pool = async (env) => (await env.escrow.prepaidOf(env.escrowAddress, env.escrowAddress)).balance;

    it("purchase_movesIntoThePool_notIntoTheStatement", async function () {
      const env = await loadFixture(buyerFixture);
      const s = await poolStatement(env, 1n, [], [[env.buyer.address, env.escrowAddress, 4n * MILLI]]);
      expect(s.total).to.equal(0n);
      const tx = post(env, s);
      await expect(tx).to.emit(env.escrow, "CreditsBought").withArgs(1n, env.buyer.address, 4n * MILLI, 4n * MILLI, 4n * MILLI);
      await expect(tx).to.emit(env.escrow, "Debited").withArgs(1n, env.buyer.address, env.escrowAddress, 4n * MILLI, 6n * MILLI);
      await expect(tx).not.to.emit(env.escrow, "SettlementShortfall");
      expect(await pool(env)).to.equal(4n * MILLI);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(0n);
    });
    it("draw_paysTheRedeemersClaims_fromThePool", async function () {
      const env = await loadFixture(buyerFixture);
      await post(env, await poolStatement(env, 1n, [], [[env.buyer.address, env.escrowAddress, 4n * MILLI]]));
      const s = await poolStatement(env, 2n, [{ account: env.op1.address, amount: 3n * MILLI }], [[env.escrowAddress, env.escrowAddress, 3n * MILLI]]);
      await expect(post(env, s)).to.emit(env.escrow, "Debited").withArgs(2n, env.escrowAddress, env.escrowAddress, 3n * MILLI, MILLI);
      expect(await pool(env)).to.equal(MILLI);
      await claimAfterWindow();
      await expect(env.escrow.connect(env.op1).claim(2n, env.op1.address, 3n * MILLI, s.tree.proof(0))).to.changeEtherBalance(env.op1, 3n * MILLI);
    });
    it("purchaseAndDrawInOneStatement_theDrawIsChargedAfterThePurchase", async function () {
      const env = await loadFixture(buyerFixture);
      const s = await poolStatement(env, 1n, [{ account: env.op1.address, amount: 2n * MILLI }], [
        [env.buyer.address, env.escrowAddress, 5n * MILLI],
        [env.escrowAddress, env.escrowAddress, 2n * MILLI],
      ]);
      expect(s.charges.payers[0]).to.equal(env.escrowAddress); // the draw is listed first
      await expect(post(env, s)).to.emit(env.escrow, "Debited").withArgs(1n, env.escrowAddress, env.escrowAddress, 2n * MILLI, 3n * MILLI);
      expect((await env.escrow.epochOf(1n)).unclaimed).to.equal(2n * MILLI);
    });
    it("drawBeyondThePool_revertsCreditPoolShort_untilItsPurchasesArePosted", async function () {
      const env = await loadFixture(buyerFixture);
      const buy = await poolStatement(env, 1n, [], [[env.buyer.address, env.escrowAddress, 4n * MILLI]]);
      const draw = await poolStatement(env, 2n, [{ account: env.op1.address, amount: 3n * MILLI }], [[env.escrowAddress, env.escrowAddress, 3n * MILLI]]);
      await expect(post(env, draw)).to.be.revertedWithCustomError(env.escrow, "CreditPoolShort").withArgs(2n, 3n * MILLI, 0n);
      await post(env, buy);
      await expect(post(env, draw)).to.emit(env.escrow, "PayoutRootPosted");
    });
    it("purchaseShort_isThePoolsDeficit_andOnlyThatDrawPaysShort", async function () {
      const env = await loadFixture(buyerFixture);
      const tx = post(env, await poolStatement(env, 1n, [], [[env.buyer.address, env.escrowAddress, 12n * MILLI]]));
      await expect(tx).to.emit(env.escrow, "CreditsBought").withArgs(1n, env.buyer.address, 12n * MILLI, 10n * MILLI, 10n * MILLI);
      expect(await env.escrow.creditPoolDeficit()).to.equal(2n * MILLI);
      const over = await poolStatement(env, 2n, [{ account: env.op1.address, amount: 13n * MILLI }], [[env.escrowAddress, env.escrowAddress, 13n * MILLI]]);
      await expect(post(env, over)).to.be.revertedWithCustomError(env.escrow, "CreditPoolShort").withArgs(2n, 13n * MILLI, 10n * MILLI);
      const s = await poolStatement(env, 3n, [{ account: env.op1.address, amount: 12n * MILLI }], [[env.escrowAddress, env.escrowAddress, 12n * MILLI]]);
      await expect(post(env, s)).to.emit(env.escrow, "SettlementShortfall").withArgs(3n, 12n * MILLI, 10n * MILLI);
      expect([await pool(env), await env.escrow.creditPoolDeficit()]).to.deep.equal([0n, 0n]);
    });
    it("disputeRoot_keepsPurchasesInThePool_andReturnsTheDrawToIt", async function () {
      const env = await loadFixture(buyerFixture);
      const s = await poolStatement(env, 1n, [{ account: env.op1.address, amount: 2n * MILLI }], [
        [env.buyer.address, env.escrowAddress, 5n * MILLI],
        [env.escrowAddress, env.escrowAddress, 2n * MILLI],
      ]);
      await post(env, s);
      const other = { root: ethers.id("other"), total: s.total, queriesHash: s.qh };
      const otherSigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: env.escrowAddress, epoch: 1n, ...other });
      const tx = env.escrow.connect(env.stranger).disputeRoot(1n, s.charges, s.sigs, other, otherSigs);
      const receipt = await (await tx).wait();
      const returned = receipt.logs.map((l) => env.escrow.interface.parseLog(l)).filter((e) => e && e.name === "DebitReturned");
      expect(returned.map((e) => [e.args.payer, e.args.amount])).to.deep.equal([[env.escrowAddress, 2n * MILLI]]);
      expect(await pool(env)).to.equal(5n * MILLI);
      expect(await balanceOf(env, env.buyer, env.escrowAddress)).to.equal(5n * MILLI);
    });
  });

  describe("invariant: escrow ETH == deposits + balances + unclaimed", function () {
    for (const seed of [3, 99, 7]) {
      it(`randomPrepaidSequence_twoGateways_seed${seed}_escrowHoldsExactlyWhatItOwes`, async function () {
        const env = await loadFixture(fixture);
        const { escrow, payers } = env;
        const gateways = env.gateways.map((g) => g.address);
        const rnd = mulberry32(seed);
        const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
        const amount = (max) => (BigInt(Math.floor(rnd() * 1e6)) * max) / 1000000n + 1n;
        const queries = [];
        const epochs = [];
        let nextEpoch = 1n;
        const actions = {
          async fund() {
            await escrow.connect(pick(payers)).depositBalance(pick(gateways), { value: amount(MILLI) });
          },
          async deposit() {
            const q = ethers.id(`s${seed}-q${queries.length}`);
            await escrow.connect(pick(payers)).deposit(q, ethers.ZeroHash, pick(gateways), { value: amount(MILLI) });
            queries.push(q);
          },
          async request() {
            await escrow.connect(pick(payers)).requestWithdrawal(pick(gateways)).catch(() => {});
          },
          async cancel() {
            await escrow.connect(pick(payers)).cancelWithdrawal(pick(gateways)).catch(() => {});
          },
          async withdraw() {
            await escrow.connect(pick(payers)).withdrawBalance(pick(gateways)).catch(() => {});
          },
          async refund() {
            if (queries.length === 0) return;
            const q = pick(queries);
            const d = await escrow.depositOf(q);
            const owner = payers.find((p) => p.address === d.user);
            await escrow.connect(owner).refund(q).catch(() => {});
          },
          async settle() {
            // one gateway's page, as the committee cuts them: its own deposits and balances only
            const payee = pick(env.gateways);
            const queryIds = [];
            const fees = [];
            for (const q of queries) {
              const d = await escrow.depositOf(q);
              // funded queries, and refunded ones (the race), never settled ones
              if (d.gateway === payee.address && (d.status === 1n || d.status === 4n) && rnd() < 0.5) {
                queryIds.push(q);
                fees.push(d.status === 1n ? amount(d.amount) - 1n : amount(MILLI));
              }
            }
            // any payer at this gateway, debits that may exceed that balance
            const items = [];
            for (const p of payers) if (rnd() < 0.4) items.push([p.address, payee.address, amount(2n * MILLI)]);
            const charges = debitCharges(items, queryIds, fees);
            const total = [...fees, ...charges.debits].reduce((x, y) => x + y, 0n);
            const entries = [{ account: payee.address, amount: total }];
            const s = await statement(env, nextEpoch++, entries, charges);
            await post(env, s);
            epochs.push({ ...s, payee });
          },
          async claim() {
            if (epochs.length === 0) return;
            const s = pick(epochs);
            const e = s.entries[0];
            if (e.amount === 0n) return;
            await escrow.connect(s.payee).claim(s.epoch, e.account, e.amount, s.tree.proof(0)).catch(() => {});
          },
          async dispute() {
            if (epochs.length === 0) return;
            const s = pick(epochs);
            const other = { root: ethers.id(`other ${s.epoch}`), total: s.total, queriesHash: s.qh };
            const sigs = await h.signAll(env.members, env.committeeDomain, "PayoutRoot", { consumer: await escrow.getAddress(), epoch: s.epoch, ...other });
            await escrow.disputeRoot(s.epoch, s.charges, s.sigs, other, sigs).catch(() => {});
          },
          async wait() {
            await time.increase(Math.floor(rnd() * 400));
          },
        };
        const names = Object.keys(actions);
        for (let step = 0; step < 60; step++) {
          const name = pick(names);
          await actions[name]();
          let owed = 0n;
          for (const q of queries) owed += (await escrow.depositOf(q)).amount;
          for (const p of payers) for (const g of gateways) owed += (await escrow.prepaidOf(p.address, g)).balance;
          for (const s of epochs) owed += (await escrow.epochOf(s.epoch)).unclaimed;
          expect(await ethers.provider.getBalance(await escrow.getAddress()), `seed ${seed} step ${step} (${name})`).to.equal(owed);
        }
        expect(epochs.length, "the sequence posted roots").to.be.greaterThan(0);
      });
    }
  });
});

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
