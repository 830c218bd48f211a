// Randomized sequences (seeded PRNG) of stake / unstake / withdraw / slash / deposit / settle /
// claim / refund / dispute / credit claims / time travel / ZK fault proofs / recorded work, checked
// against a plain JS model. After every step: every contract balance equals what it owes (stakes +
// credits; deposits + unclaimed payouts), a slash never exceeds the stake, burned + rewarded ==
// slashed, every piece of evidence has cost its node exactly its highest proven share (top-ups), and
// no node withdraws while a recorded work window is open.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

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

const STEPS = 70;
const SEEDS = [1, 7, 2026];
// Slashing-heavy sequences: stakes, proofs, verdicts on a small evidence pool, recorded work and
// withdrawals dominate, so top-ups, AlreadyProven and FraudWindowOpen are all reached.
const SLASHING_SEEDS = [11, 42];
const MIXED_WEIGHTS = [
  ["stake", 4],
  ["requestUnstake", 1],
  ["withdraw", 1],
  ["equivocate", 1],
  ["fault", 1],
  ["recordWork", 1],
  ["verdict", 1],
  ["claimCredit", 1],
  ["deposit", 4],
  ["settle", 2],
  ["claim", 3],
  ["refund", 2],
  ["dispute", 0.5],
  ["wait", 2],
];
const SLASHING_WEIGHTS = [
  ["stake", 6],
  ["requestUnstake", 1],
  ["withdraw", 2],
  ["equivocate", 3],
  ["fault", 3],
  ["recordWork", 2],
  ["verdict", 4],
  ["claimCredit", 1],
  ["deposit", 1],
  ["wait", 1],
];

describe("invariants under random sequences", function () {
  async function fixture() {
    const verifier = await (await ethers.getContractFactory("MockFaultVerifier")).deploy();
    const env = await h.deployAll({ faultVerifier: await verifier.getAddress() });
    const signers = await ethers.getSigners();
    return {
      ...env,
      nodes: signers.slice(1, 6),
      users: signers.slice(6, 9),
      challengers: signers.slice(9, 11),
      operators: signers.slice(11, 14),
    };
  }

  const runs = [
    ...SEEDS.map((seed) => ({ seed, weights: MIXED_WEIGHTS, name: `randomSequence_seed${seed}_preservesAccounting` })),
    ...SLASHING_SEEDS.map((seed) => ({ seed, weights: SLASHING_WEIGHTS, name: `slashingSequence_seed${seed}_topUpsLocksAndAccounting` })),
  ];
  for (const { seed, weights, name: testName } of runs) {
    it(testName, async function () {
      const env = await loadFixture(fixture);
      const { staking, fraudProofs, escrow, members, committeeDomain, fraudDomain } = env;
      const rnd = mulberry32(seed);
      const byAddress = new Map([...env.operators, ...env.challengers].map((o) => [o.address, o]));
      const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
      const randBig = (max) => BigInt(Math.floor(rnd() * 1e9)) * max / 1000000000n;

      // --- model -------------------------------------------------------------------------------
      const stakes = new Map(); // address -> {amount, role, withdrawableAt}
      const credits = new Map();
      let slashedTotal = 0n;
      const deposits = new Map(); // queryId -> {user, amount, status, depositedAt, gateway}
      const epochs = new Map(); // epoch -> {unclaimed, claimableAt, status, tree, entries, claimed:Set, queryIds, fees, sigs, total, qh}
      let nextQuery = 0;
      let nextEpoch = 1n;
      let nextSlot = 0n;
      let nextVerdictNonce = 1n;
      const burnStart = await ethers.provider.getBalance(h.BURN_ADDRESS);
      const counts = {};
      const penalties = new Map(); // evidence id -> highest share applied (bps)
      let saltCounter = 0;
      const locks = new Map(); // node address -> lockedUntil
      const slots = []; // [{node, slot}] with a lying reveal signed, for repeated proofs
      const BPS = { 1: 10000n, 2: 10000n, 3: 5000n, 4: 500n, 5: 10000n };

      async function now() {
        return BigInt(await time.latest());
      }
      const minFor = (role) => (role === h.Role.Compute ? h.ONE : h.ONE / 2n);

      async function applySlash(node, id, offence, challenger, send) {
        const s = stakes.get(node.address);
        const target = BPS[offence];
        const applied = penalties.get(id) ?? 0n;
        if (!s || s.amount === 0n || target <= applied) {
          await expect(send()).to.be.reverted;
          return false;
        }
        // A larger offence on already-slashed evidence takes ceil((new - old) / (100 % - old)) of the rest.
        const bps = ((target - applied) * 10000n + (10000n - applied) - 1n) / (10000n - applied);
        penalties.set(id, target);
        if (applied > 0n) counts.topUp = (counts.topUp ?? 0) + 1;
        const amount = (s.amount * bps) / 10000n;
        const reward = amount / 2n;
        await expect(send())
          .to.emit(staking, "Slashed")
          .withArgs(node.address, offence, amount, challenger, reward, amount - reward);
        expect(amount).to.be.lte(s.amount); // a slash never exceeds the stake
        s.amount -= amount;
        if (s.amount === 0n) stakes.delete(node.address);
        credits.set(challenger, (credits.get(challenger) ?? 0n) + reward);
        slashedTotal += amount;
        return true;
      }

      const actions = {
        async stake() {
          const node = pick(env.nodes);
          const role = pick([h.Role.Compute, h.Role.Verifier]);
          const value = randBig(h.ONE * 2n) + 1n;
          const s = stakes.get(node.address);
          const total = (s?.amount ?? 0n) + value;
          const ok = (!s || (s.role === role && s.withdrawableAt === 0n)) && total >= minFor(role);
          const tx = staking.connect(node).stake(role, { value });
          if (!ok) return expect(tx).to.be.reverted;
          await tx;
          stakes.set(node.address, { amount: total, role, withdrawableAt: 0n });
        },
        async requestUnstake() {
          const node = pick(env.nodes);
          const s = stakes.get(node.address);
          const tx = staking.connect(node).requestUnstake();
          if (!s || s.withdrawableAt !== 0n) return expect(tx).to.be.reverted;
          await tx;
          s.withdrawableAt = (await now()) + h.DEFAULTS.unstakeDelay;
        },
        async withdraw() {
          const node = pick(env.nodes);
          const s = stakes.get(node.address);
          const t = (await now()) + 1n;
          const tx = staking.connect(node).withdraw();
          const lock = locks.get(node.address) ?? 0n;
          if (!s || s.withdrawableAt === 0n || t < s.withdrawableAt || t < lock) return expect(tx).to.be.reverted;
          await expect(tx).to.changeEtherBalance(node, s.amount);
          stakes.delete(node.address);
          locks.delete(node.address);
        },
        async equivocate() {
          const node = pick(env.nodes);
          const challenger = pick(env.challengers);
          // Half of the time on a slot already proven as a (50 %) computation fault: a top-up.
          const reuse = slots.length > 0 && rnd() < 0.7 ? pick(slots) : null;
          const owner = reuse ? reuse.node : node;
          const slot = reuse ? reuse.slot : { session: ethers.id(`s${seed}`), step: nextSlot++, shard: 0 };
          const a = { ...slot, commitment: ethers.id("a"), signedAt: 1n };
          const b = { ...slot, commitment: ethers.id("b"), signedAt: 2n };
          const [sa] = await h.signAll([owner], fraudDomain, "Commitment", a);
          const [sb] = await h.signAll([owner], fraudDomain, "Commitment", b);
          const id = h.evidenceId(owner.address, slot.session, slot.step, slot.shard);
          const salt = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.Equivocation, ethers.id(`eq${saltCounter++}`));
          await applySlash(owner, id, h.Offence.Equivocation, challenger.address, () =>
            fraudProofs.connect(challenger).proveEquivocation(a, sa, b, sb, salt),
          );
        },
        async fault() {
          // Mostly a node that has stake, so the slot can be topped up later.
          const staked = env.nodes.filter((n) => stakes.has(n.address));
          const node = staked.length > 0 && rnd() < 0.8 ? pick(staked) : pick(env.nodes);
          const challenger = pick(env.challengers);
          const slot = { session: ethers.id(`f${seed}`), step: nextSlot++, shard: 1 };
          const r = { ...slot, manifestHash: ethers.id("m"), inputHash: ethers.id("i"), outputHash: ethers.id("wrong"), salt: ethers.id("s"), signedAt: 3n };
          const [rs] = await h.signAll([node], fraudDomain, "Reveal", r);
          const id = h.evidenceId(node.address, slot.session, slot.step, slot.shard);
          const salt = await h.commitChallenge(fraudProofs, challenger, id, h.Offence.FailedVerification, ethers.id(`f${saltCounter++}`));
          const slashed = await applySlash(node, id, h.Offence.FailedVerification, challenger.address, () =>
            fraudProofs.connect(challenger).proveComputationFault(r, rs, ethers.toUtf8Bytes("fault"), salt),
          );
          if (slashed) slots.push({ node, slot });
        },
        async recordWork() {
          const node = pick(env.nodes);
          const signedAt = (await now()) - BigInt(Math.floor(rnd() * 90));
          const c = { session: ethers.id(`w${seed}`), step: nextSlot++, shard: 0, commitment: ethers.id("w"), signedAt };
          const [cs] = await h.signAll([node], fraudDomain, "Commitment", c);
          const until = signedAt + h.DEFAULTS.challengeWindow + 1n;
          const tx = fraudProofs.recordCommitment(c, cs);
          const s = stakes.get(node.address);
          if (!s || until <= (locks.get(node.address) ?? 0n)) return expect(tx).to.be.reverted;
          await expect(tx).to.emit(staking, "WithdrawLocked").withArgs(node.address, until);
          locks.set(node.address, until);
        },
        async verdict() {
          const node = pick(env.nodes);
          const challenger = pick(env.challengers);
          const offence = pick([h.Offence.FailedVerification, h.Offence.Timeout, h.Offence.Collusion]);
          // A small pool of evidence hashes, so verdicts repeat, top up and hit AlreadyProven.
          const evidenceHash = ethers.id(`e${Math.floor(rnd() * 3)}`);
          const consumer = await fraudProofs.getAddress();
          const v = { node: node.address, offence, evidenceHash, challenger: challenger.address, nonce: nextVerdictNonce++, consumer };
          const sigs = await h.signAll(members.slice(0, 3), committeeDomain, "Verdict", v);
          const id = await fraudProofs.verdictEvidenceId(node.address, evidenceHash);
          await applySlash(node, id, offence, challenger.address, () => fraudProofs.slashByVerdict(v, sigs));
        },
        async claimCredit() {
          const c = pick(env.challengers);
          const credit = credits.get(c.address) ?? 0n;
          const tx = staking.connect(c).claimCredit();
          if (credit === 0n) return expect(tx).to.be.reverted;
          await expect(tx).to.changeEtherBalance(c, credit);
          credits.set(c.address, 0n);
        },
        async deposit() {
          const user = pick(env.users);
          // two gateways, alternating (no extra draw: the seeds' sequences stay as they were)
          const gateway = env.challengers[nextQuery % 2].address;
          const q = ethers.id(`seed${seed}-q${nextQuery++}`);
          const value = randBig(h.ONE / 10n) + 1n;
          await escrow.connect(user).deposit(q, ethers.ZeroHash, gateway, { value });
          deposits.set(q, { user, amount: value, status: "Funded", depositedAt: await now(), gateway });
        },
        async settle() {
          // one gateway's page, as the committee cuts them: its own deposits, one leaf paying it
          const gateway = env.challengers[Number(nextEpoch % 2n)].address;
          const funded = [...deposits.entries()].filter(([, d]) => d.status === "Funded" && d.gateway === gateway);
          const chosen = funded.filter(() => rnd() < 0.6);
          const queryIds = chosen.map(([q]) => q);
          const fees = chosen.map(([, d]) => (rnd() < 0.2 ? d.amount : randBig(d.amount)));
          const total = fees.reduce((x, y) => x + y, 0n);
          const entries = [{ epoch: nextEpoch, account: gateway, amount: total }];
          const tree = h.merkleTree(entries);
          const qh = h.queriesHash(queryIds, fees);
          const epoch = nextEpoch++;
          const sigs = await h.signAll(members, committeeDomain, "PayoutRoot", { consumer: await escrow.getAddress(), epoch, root: tree.root, total, queriesHash: qh });
          await escrow.postPayoutRoot(epoch, tree.root, total, h.charges(queryIds, fees), sigs);
          chosen.forEach(([, d], i) => {
            d.amount -= fees[i];
            d.status = "Settled";
          });
          epochs.set(epoch, {
            unclaimed: total,
            claimableAt: (await now()) + h.DEFAULTS.challengeWindow,
            status: "Posted",
            tree,
            entries,
            claimed: new Set(),
            queryIds,
            fees,
            sigs,
            total,
            qh,
          });
        },
        async claim() {
          if (epochs.size === 0) return;
          const epoch = pick([...epochs.keys()]);
          const e = epochs.get(epoch);
          const i = Math.floor(rnd() * e.entries.length);
          const entry = e.entries[i];
          const t = (await now()) + 1n;
          const tx = escrow.connect(byAddress.get(entry.account)).claim(epoch, entry.account, entry.amount, e.tree.proof(i));
          if (e.status !== "Posted" || t < e.claimableAt || e.claimed.has(entry.account) || entry.amount === 0n) {
            return expect(tx).to.be.reverted;
          }
          await tx;
          e.claimed.add(entry.account);
          e.unclaimed -= entry.amount;
        },
        async refund() {
          if (deposits.size === 0) return;
          const q = pick([...deposits.keys()]);
          const d = deposits.get(q);
          const t = (await now()) + 1n;
          const tx = escrow.connect(d.user).refund(q);
          const timedOut = d.status === "Funded" && t >= d.depositedAt + h.DEFAULTS.refundTimeout;
          if ((d.status === "Funded" && !timedOut) || d.amount === 0n) return expect(tx).to.be.reverted;
          await expect(tx).to.changeEtherBalance(d.user, d.amount);
          d.amount = 0n;
          if (d.status === "Funded") d.status = "Refunded";
        },
        async dispute() {
          const open = [];
          const t = (await now()) + 1n;
          for (const [epoch, e] of epochs) if (e.status === "Posted" && t < e.claimableAt) open.push(epoch);
          if (open.length === 0) return;
          const epoch = pick(open);
          const e = epochs.get(epoch);
          const other = { root: ethers.id(`other-${epoch}`), total: e.total, queriesHash: e.qh };
          const sigs = await h.signAll(members, committeeDomain, "PayoutRoot", { consumer: await escrow.getAddress(), epoch, ...other });
          await escrow.disputeRoot(epoch, h.charges(e.queryIds, e.fees), e.sigs, other, sigs);
          e.queryIds.forEach((q, i) => {
            const d = deposits.get(q);
            d.amount += e.fees[i];
            d.status = "Reclaimed";
          });
          e.status = "Disputed";
          e.unclaimed = 0n;
        },
        async wait() {
          await time.increase(Math.floor(rnd() * 120));
        },
      };
      const totalWeight = weights.reduce((a, [, w]) => a + w, 0);
      const choose = () => {
        let r = rnd() * totalWeight;
        for (const [name, w] of weights) if ((r -= w) < 0) return name;
        return "wait";
      };

      async function checkInvariants(step, name) {
        const ctx = `seed ${seed} step ${step} (${name})`;
        // Staking: balance == stakes + challenger credits; burned + rewarded == slashed.
        const staked = [...stakes.values()].reduce((a, s) => a + s.amount, 0n);
        const credited = [...credits.values()].reduce((a, c) => a + c, 0n);
        expect(await staking.totalStaked(), ctx).to.equal(staked);
        expect(await staking.totalCredits(), ctx).to.equal(credited);
        expect(await ethers.provider.getBalance(await staking.getAddress()), ctx).to.equal(staked + credited);
        const [burned, rewarded, slashed] = await Promise.all([staking.totalBurned(), staking.totalRewarded(), staking.totalSlashed()]);
        expect(burned + rewarded, ctx).to.equal(slashed);
        expect(slashed, ctx).to.equal(slashedTotal);
        expect((await ethers.provider.getBalance(h.BURN_ADDRESS)) - burnStart, ctx).to.equal(burned);
        for (const node of env.nodes) {
          expect(await staking.stakeOf(node.address), ctx).to.equal(stakes.get(node.address)?.amount ?? 0n);
          expect(await staking.lockedUntil(node.address), ctx).to.equal(locks.get(node.address) ?? 0n);
        }
        for (const [id, bps] of penalties) expect(await fraudProofs.penaltyOf(id), ctx).to.equal(bps);
        // Escrow: balance == what queries still hold + every epoch's unclaimed fees.
        let held = 0n;
        for (const [q, d] of deposits) {
          const onChain = await escrow.depositOf(q);
          expect(onChain.amount, ctx).to.equal(d.amount);
          expect(onChain.gateway, ctx).to.equal(d.gateway);
          held += d.amount;
        }
        for (const [epoch, e] of epochs) {
          expect((await escrow.epochOf(epoch)).unclaimed, ctx).to.equal(e.unclaimed);
          held += e.unclaimed;
        }
        expect(await ethers.provider.getBalance(await escrow.getAddress()), ctx).to.equal(held);
      }

      for (let step = 0; step < STEPS; step++) {
        const name = choose();
        counts[name] = (counts[name] ?? 0) + 1;
        await actions[name]();
        await checkInvariants(step, name);
      }
      // Drain: after everything times out and every payout is claimed, the escrow is empty.
      await time.increase(Number(h.DEFAULTS.refundTimeout));
      for (const [epoch, e] of epochs) {
        if (e.status !== "Posted") continue;
        for (const [i, entry] of e.entries.entries()) {
          if (!e.claimed.has(entry.account) && entry.amount > 0n) {
            await escrow.connect(byAddress.get(entry.account)).claim(epoch, entry.account, entry.amount, e.tree.proof(i));
          }
        }
      }
      for (const [q, d] of deposits) if (d.amount > 0n) await escrow.connect(d.user).refund(q);
      expect(await ethers.provider.getBalance(await escrow.getAddress())).to.equal(0n);
      expect(Object.keys(counts).length).to.be.greaterThan(6); // the sequence exercised most actions
      if (weights === SLASHING_WEIGHTS) expect(counts.topUp ?? 0, JSON.stringify(counts)).to.be.greaterThan(0);
    });
  }
});
