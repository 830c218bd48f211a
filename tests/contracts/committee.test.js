// Committee: membership validation, the >= 2/3 signature rule and its edge cases, signed updates.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

async function deployCommittee(members, powers) {
  const c = await (await ethers.getContractFactory("Committee")).deploy(
    members.map((w) => w.address),
    powers,
  );
  const { chainId } = await ethers.provider.getNetwork();
  return { c, dom: h.domain("Planet Committee", chainId, await c.getAddress()) };
}

describe("Committee", function () {
  async function fourEqual() {
    const members = h.wallets(4, "committee-test");
    return { members, ...(await deployCommittee(members, [1n, 1n, 1n, 1n])) };
  }
  async function weighted() {
    // powers 1, 2, 3 (total 6): two thirds is exactly 4.
    const members = h.wallets(3, "committee-weighted");
    return { members, ...(await deployCommittee(members, [1n, 2n, 3n])) };
  }
  const msg = { epoch: 1n, root: ethers.id("root"), total: 5n, queriesHash: ethers.id("q"), consumer: "0x000000000000000000000000000000000000c0de" };
  const structHash = ethers.TypedDataEncoder.hashStruct("PayoutRoot", { PayoutRoot: h.TYPES.PayoutRoot }, msg);
  const sign = (ws, dom, keepOrder = false) => h.signAll(ws, dom, "PayoutRoot", msg, keepOrder);

  describe("constructor", function () {
    it("constructor_validSet_storesMembersPowersAndNonce", async function () {
      const { c, members } = await loadFixture(weighted);
      expect(await c.members()).to.deep.equal(members.map((w) => w.address));
      expect(await c.totalPower()).to.equal(6n);
      expect(await c.powerOf(members[2].address)).to.equal(3n);
      expect(await c.powerOf(ethers.ZeroAddress)).to.equal(0n);
      expect(await c.nonce()).to.equal(0n);
    });
    it("constructor_emptySet_reverts", async function () {
      const F = await ethers.getContractFactory("Committee");
      await expect(F.deploy([], [])).to.be.revertedWithCustomError(F, "InvalidMemberCount").withArgs(0);
    });
    it("constructor_tooManyMembers_reverts", async function () {
      const F = await ethers.getContractFactory("Committee");
      const addrs = Array.from({ length: 257 }, (_, i) => ethers.zeroPadValue(ethers.toBeHex(i + 1), 20));
      await expect(F.deploy(addrs, addrs.map(() => 1n)))
        .to.be.revertedWithCustomError(F, "InvalidMemberCount")
        .withArgs(257);
    });
    it("constructor_lengthMismatch_reverts", async function () {
      const F = await ethers.getContractFactory("Committee");
      const ws = h.wallets(2);
      await expect(F.deploy(ws.map((w) => w.address), [1n]))
        .to.be.revertedWithCustomError(F, "LengthMismatch")
        .withArgs(2, 1);
    });
    it("constructor_unsortedOrDuplicateOrZeroMember_reverts", async function () {
      const F = await ethers.getContractFactory("Committee");
      const [a, b] = h.wallets(2);
      await expect(F.deploy([b.address, a.address], [1n, 1n])).to.be.revertedWithCustomError(F, "MembersNotSorted").withArgs(1);
      await expect(F.deploy([a.address, a.address], [1n, 1n])).to.be.revertedWithCustomError(F, "MembersNotSorted").withArgs(1);
      await expect(F.deploy([ethers.ZeroAddress], [1n])).to.be.revertedWithCustomError(F, "MembersNotSorted").withArgs(0);
    });
    it("constructor_zeroOrHugePower_reverts", async function () {
      const F = await ethers.getContractFactory("Committee");
      const [a, b] = h.wallets(2);
      await expect(F.deploy([a.address, b.address], [1n, 0n])).to.be.revertedWithCustomError(F, "InvalidPower").withArgs(1, 0);
      await expect(F.deploy([a.address], [2n ** 64n])).to.be.revertedWithCustomError(F, "InvalidPower").withArgs(0, 2n ** 64n);
    });
  });

  describe("verify", function () {
    it("verify_allMembers_returnsSignedPower", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      expect(await c.signedPower(structHash, await sign(members, dom))).to.equal(4n);
    });
    it("verify_exactlyTwoThirds_passes", async function () {
      const { c, members, dom } = await loadFixture(weighted);
      // 1 + 3 = 4 of 6: exactly two thirds.
      expect(await c.signedPower(structHash, await sign([members[0], members[2]], dom))).to.equal(4n);
    });
    it("verify_justBelowTwoThirds_reverts", async function () {
      const { c, members, dom } = await loadFixture(weighted);
      await expect(c.verify(structHash, await sign([members[2]], dom)))
        .to.be.revertedWithCustomError(c, "InsufficientPower")
        .withArgs(3, 6);
      const four = await loadFixture(fourEqual);
      await expect(four.c.verify(structHash, await sign(four.members.slice(0, 2), four.dom)))
        .to.be.revertedWithCustomError(four.c, "InsufficientPower")
        .withArgs(2, 4);
      expect(await four.c.signedPower(structHash, await sign(four.members.slice(0, 3), four.dom))).to.equal(3n);
    });
    it("verify_noSignatures_reverts", async function () {
      const { c } = await loadFixture(fourEqual);
      await expect(c.verify(structHash, [])).to.be.revertedWithCustomError(c, "InsufficientPower").withArgs(0, 4);
    });
    it("verify_duplicateSigner_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members.slice(0, 3), dom);
      await expect(c.verify(structHash, [sigs[0], sigs[1], sigs[1], sigs[2]]))
        .to.be.revertedWithCustomError(c, "SignersNotSorted")
        .withArgs(2);
    });
    it("verify_unsortedSigners_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members, dom);
      await expect(c.verify(structHash, [sigs[1], sigs[0], sigs[2], sigs[3]]))
        .to.be.revertedWithCustomError(c, "SignersNotSorted")
        .withArgs(1);
    });
    it("verify_unknownSigner_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const outsider = h.wallets(1, "outsider")[0];
      const signers = h.sortByAddress([...members.slice(0, 2), outsider]);
      await expect(c.verify(structHash, await sign(signers, dom)))
        .to.be.revertedWithCustomError(c, "UnknownSigner")
        .withArgs(outsider.address);
    });
    it("verify_wrongChainId_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members, { ...dom, chainId: 1n });
      await expect(c.verify(structHash, sigs)).to.be.reverted;
      await expect(c.verify(structHash, sigs)).to.be.revertedWithCustomError(c, "UnknownSigner");
    });
    it("verify_wrongVerifyingContract_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members, { ...dom, verifyingContract: ethers.Wallet.createRandom().address });
      await expect(c.verify(structHash, sigs)).to.be.revertedWithCustomError(c, "UnknownSigner");
    });
    it("verify_wrongDomainName_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members, { ...dom, name: "Planet Fraud Proofs" });
      await expect(c.verify(structHash, sigs)).to.be.revertedWithCustomError(c, "UnknownSigner");
    });
    it("verify_malformedOrHighSSignature_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const sigs = await sign(members, dom);
      await expect(c.verify(structHash, [sigs[0], ethers.dataSlice(sigs[1], 0, 64)]))
        .to.be.revertedWithCustomError(c, "InvalidSignature")
        .withArgs(1);
      const sig = ethers.Signature.from(sigs[0]);
      const highS = ethers.concat([sig.r, ethers.toBeHex(SECP256K1_N - BigInt(sig.s), 32), sig.v === 27 ? "0x1c" : "0x1b"]);
      await expect(c.verify(structHash, [highS])).to.be.revertedWithCustomError(c, "InvalidSignature").withArgs(0);
      const badV = ethers.concat([sig.r, sig.s, "0x05"]);
      await expect(c.verify(structHash, [badV])).to.be.revertedWithCustomError(c, "InvalidSignature").withArgs(0);
    });
    it("domainSeparator_matchesEthersDomain", async function () {
      const { c, dom } = await loadFixture(fourEqual);
      expect(await c.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(dom));
    });
  });

  describe("update", function () {
    it("update_signedByTwoThirds_replacesSetAndBumpsNonce", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const next = h.wallets(3, "next-committee");
      const value = { signers: next.map((w) => w.address), powers: [5n, 5n, 5n], nonce: 0n };
      const sigs = await h.signAll(members.slice(1), dom, "CommitteeUpdate", value);
      await expect(c.update(value.signers, value.powers, 0n, sigs))
        .to.emit(c, "CommitteeUpdated")
        .withArgs(0n, value.signers, value.powers, 15n);
      expect(await c.nonce()).to.equal(1n);
      expect(await c.members()).to.deep.equal(value.signers);
      expect(await c.totalPower()).to.equal(15n);
      expect(await c.powerOf(members[0].address)).to.equal(0n);
      // New members sign from now on; the old ones are strangers.
      expect(await c.signedPower(structHash, await sign(next, dom))).to.equal(15n);
      await expect(c.verify(structHash, await sign(members, dom))).to.be.revertedWithCustomError(c, "UnknownSigner");
    });
    it("update_replayedNonce_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const value = { signers: members.map((w) => w.address), powers: [2n, 2n, 2n, 2n], nonce: 0n };
      const sigs = await h.signAll(members, dom, "CommitteeUpdate", value);
      await c.update(value.signers, value.powers, 0n, sigs);
      await expect(c.update(value.signers, value.powers, 0n, sigs))
        .to.be.revertedWithCustomError(c, "InvalidNonce")
        .withArgs(1n, 0n);
    });
    it("update_futureNonce_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const value = { signers: members.map((w) => w.address), powers: [1n, 1n, 1n, 1n], nonce: 5n };
      const sigs = await h.signAll(members, dom, "CommitteeUpdate", value);
      await expect(c.update(value.signers, value.powers, 5n, sigs))
        .to.be.revertedWithCustomError(c, "InvalidNonce")
        .withArgs(0n, 5n);
    });
    it("update_tamperedPowers_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const value = { signers: members.map((w) => w.address), powers: [1n, 1n, 1n, 1n], nonce: 0n };
      const sigs = await h.signAll(members, dom, "CommitteeUpdate", value);
      await expect(c.update(value.signers, [9n, 1n, 1n, 1n], 0n, sigs)).to.be.revertedWithCustomError(c, "UnknownSigner");
    });
    it("update_insufficientPower_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const value = { signers: [members[0].address], powers: [1n], nonce: 0n };
      const sigs = await h.signAll([members[0]], dom, "CommitteeUpdate", value);
      await expect(c.update(value.signers, value.powers, 0n, sigs))
        .to.be.revertedWithCustomError(c, "InsufficientPower")
        .withArgs(1, 4);
    });
    it("update_invalidNewSet_reverts", async function () {
      const { c, members, dom } = await loadFixture(fourEqual);
      const bad = { signers: [members[1].address, members[0].address], powers: [1n, 1n], nonce: 0n };
      const sigs = await h.signAll(members, dom, "CommitteeUpdate", bad);
      await expect(c.update(bad.signers, bad.powers, 0n, sigs)).to.be.revertedWithCustomError(c, "MembersNotSorted").withArgs(1);
      const empty = { signers: [], powers: [], nonce: 0n };
      const sigs2 = await h.signAll(members, dom, "CommitteeUpdate", empty);
      await expect(c.update([], [], 0n, sigs2)).to.be.revertedWithCustomError(c, "InvalidMemberCount").withArgs(0);
    });
  });
});
