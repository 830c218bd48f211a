// ModelRegistry: committee-signed registration with a sequential nonce, and the devnet-only owner
// shortcut that is disabled unless a dev owner is set at construction.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");

describe("ModelRegistry", function () {
  async function fixture() {
    const [deployer, dev, stranger] = await ethers.getSigners();
    const env = await h.deployAll({ devOwner: dev.address });
    return { ...env, deployer, dev, stranger };
  }
  async function prodFixture() {
    const env = await h.deployAll();
    const [, dev] = await ethers.getSigners();
    return { ...env, dev };
  }
  const modelId = ethers.id("smollm2-135m");
  const manifestHash = ethers.sha256(ethers.toUtf8Bytes("manifest"));
  const shards = [ethers.sha256("0x01"), ethers.sha256("0x02"), ethers.sha256("0x03")];
  const signReg = async (env, value, signers = env.members) =>
    h.signAll(signers, env.committeeDomain, "ModelRegistration", { consumer: await env.registry.getAddress(), ...value });

  it("register_committeeSigned_storesModelAndBumpsNonce", async function () {
    const env = await loadFixture(fixture);
    const value = { modelId, manifestHash, shardHashes: shards, nonce: 0n };
    await expect(env.registry.register(modelId, manifestHash, shards, 0n, await signReg(env, value)))
      .to.emit(env.registry, "ModelRegistered")
      .withArgs(modelId, manifestHash, shards, false);
    expect(await env.registry.isRegistered(modelId)).to.equal(true);
    expect(await env.registry.manifestHashOf(modelId)).to.equal(manifestHash);
    expect(await env.registry.shardHashesOf(modelId)).to.deep.equal(shards);
    expect(await env.registry.nonce()).to.equal(1n);
  });
  it("register_signedForAnotherRegistrySharingTheCommittee_reverts", async function () {
    const env = await loadFixture(fixture);
    const registry2 = await (await ethers.getContractFactory("ModelRegistry")).deploy(await env.committee.getAddress(), ethers.ZeroAddress);
    const sigs = await signReg(env, { modelId, manifestHash, shardHashes: shards, nonce: 0n });
    await expect(registry2.register(modelId, manifestHash, shards, 0n, sigs)).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
    await env.registry.register(modelId, manifestHash, shards, 0n, sigs);
    expect(await registry2.isRegistered(modelId)).to.equal(false);
  });
  it("register_replayedOrFutureNonce_reverts", async function () {
    const env = await loadFixture(fixture);
    const value = { modelId, manifestHash, shardHashes: shards, nonce: 0n };
    const sigs = await signReg(env, value);
    await env.registry.register(modelId, manifestHash, shards, 0n, sigs);
    await expect(env.registry.register(modelId, manifestHash, shards, 0n, sigs))
      .to.be.revertedWithCustomError(env.registry, "InvalidNonce")
      .withArgs(1n, 0n);
    await expect(env.registry.register(modelId, manifestHash, shards, 2n, sigs))
      .to.be.revertedWithCustomError(env.registry, "InvalidNonce")
      .withArgs(1n, 2n);
  });
  it("register_insufficientOrTamperedSignatures_reverts", async function () {
    const env = await loadFixture(fixture);
    const value = { modelId, manifestHash, shardHashes: shards, nonce: 0n };
    await expect(env.registry.register(modelId, manifestHash, shards, 0n, await signReg(env, value, env.members.slice(0, 2))))
      .to.be.revertedWithCustomError(env.committee, "InsufficientPower")
      .withArgs(2, 4);
    const sigs = await signReg(env, value);
    await expect(env.registry.register(modelId, manifestHash, [shards[0]], 0n, sigs)).to.be.revertedWithCustomError(env.committee, "UnknownSigner");
  });
  it("register_sameModelTwice_reverts", async function () {
    const env = await loadFixture(fixture);
    await env.registry.register(modelId, manifestHash, shards, 0n, await signReg(env, { modelId, manifestHash, shardHashes: shards, nonce: 0n }));
    const other = ethers.sha256("0x99");
    const sigs = await signReg(env, { modelId, manifestHash: other, shardHashes: shards, nonce: 1n });
    await expect(env.registry.register(modelId, other, shards, 1n, sigs))
      .to.be.revertedWithCustomError(env.registry, "ModelAlreadyRegistered")
      .withArgs(modelId);
  });
  it("register_zeroHashesOrBadShardCount_reverts", async function () {
    const env = await loadFixture(fixture);
    const cases = [
      [ethers.ZeroHash, manifestHash, shards, "ZeroHash"],
      [modelId, ethers.ZeroHash, shards, "ZeroHash"],
      [modelId, manifestHash, [shards[0], ethers.ZeroHash], "ZeroHash"],
      [modelId, manifestHash, [], "InvalidShardCount"],
    ];
    for (const [id, mh, sh, err] of cases) {
      const sigs = await signReg(env, { modelId: id, manifestHash: mh, shardHashes: sh, nonce: 0n });
      await expect(env.registry.register(id, mh, sh, 0n, sigs)).to.be.revertedWithCustomError(env.registry, err);
    }
    const many = Array.from({ length: 1025 }, (_, i) => ethers.id(`s${i}`));
    await expect(env.registry.connect(env.dev).devRegister(modelId, manifestHash, many))
      .to.be.revertedWithCustomError(env.registry, "InvalidShardCount")
      .withArgs(1025);
  });
  it("devRegister_devOwner_registersWithoutSignatures", async function () {
    const env = await loadFixture(fixture);
    await expect(env.registry.connect(env.dev).devRegister(modelId, manifestHash, shards))
      .to.emit(env.registry, "ModelRegistered")
      .withArgs(modelId, manifestHash, shards, true);
    expect(await env.registry.nonce()).to.equal(0n);
    expect(await env.registry.devOwner()).to.equal(env.dev.address);
  });
  it("devRegister_notOwner_reverts", async function () {
    const env = await loadFixture(fixture);
    await expect(env.registry.connect(env.stranger).devRegister(modelId, manifestHash, shards))
      .to.be.revertedWithCustomError(env.registry, "NotDevOwner")
      .withArgs(env.stranger.address);
  });
  it("devRegister_withoutDevOwner_disabled", async function () {
    const env = await loadFixture(prodFixture);
    expect(await env.registry.devOwner()).to.equal(ethers.ZeroAddress);
    await expect(env.registry.connect(env.dev).devRegister(modelId, manifestHash, shards)).to.be.revertedWithCustomError(
      env.registry,
      "DevRegistrationDisabled",
    );
  });
  it("shardHashesOf_unknownModel_empty", async function () {
    const env = await loadFixture(prodFixture);
    expect(await env.registry.shardHashesOf(modelId)).to.deep.equal([]);
    expect(await env.registry.isRegistered(modelId)).to.equal(false);
  });
});
