// EzklFaultVerifier: the FraudProofs hook for one ezkl circuit. With a stand-in Halo2 verifier
// (MockHalo2Verifier accepts the proof bytes "valid") these tests pin the adapter's own checks:
// model/shard binding, the signed input, "fault only if the output differs", canonical
// instances, a reverting verifier, the blob's shape, and the golden ZK ticket vector
// (tests/vectors/zk_ticket.json, also asserted in Python). The real generated verifier runs on
// anvil in tests/integration/test_zk_ticket.py.
const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("@nomicfoundation/hardhat-network-helpers");
const h = require("./helpers");
const vector = require("../vectors/zk_ticket.json");

describe("EzklFaultVerifier", function () {
  const IN = vector.inputs.length;
  const OUT = vector.outputs.length;
  const manifestHash = ethers.id("zk manifest");
  const SHARD = 1;
  const R = BigInt(vector.field_modulus);
  const word = (v) => ethers.zeroPadValue(ethers.toBeHex(((BigInt(v) % R) + R) % R), 32);
  const words = (values) => ethers.concat(values.map(word));
  const blob = (inputs, outputs, proof = "valid") => ethers.concat([words(inputs), words(outputs), ethers.toUtf8Bytes(proof)]);
  const inputHash = ethers.keccak256(words(vector.inputs));
  const lying = {
    session: ethers.id("zk session"),
    step: 7n,
    shard: SHARD,
    manifestHash,
    inputHash,
    outputHash: ethers.id("not the circuit's output"),
    salt: ethers.id("zk salt"),
    signedAt: 1_767_225_600n,
  };

  async function fixture() {
    const halo2 = await (await ethers.getContractFactory("MockHalo2Verifier")).deploy();
    const adapter = await (await ethers.getContractFactory("EzklFaultVerifier")).deploy(
      await halo2.getAddress(),
      manifestHash,
      SHARD,
      IN,
      OUT,
    );
    return { halo2, adapter };
  }

  it("vector_wordsAndHashes_matchPython", async function () {
    expect(words(vector.inputs)).to.equal(vector.input_words);
    expect(words(vector.outputs)).to.equal(vector.output_words);
    expect(inputHash).to.equal(vector.input_hash);
    expect(ethers.keccak256(words(vector.outputs))).to.equal(vector.output_hash);
    expect(blob(vector.inputs, vector.outputs)).to.equal(vector.fault_proof);
  });

  it("verifyFault_validProofOtherOutput_true", async function () {
    const { adapter } = await loadFixture(fixture);
    expect(await adapter.verifyFault(vector.fault_proof, lying)).to.equal(true);
  });

  it("verifyFault_signedOutputIsTheCircuits_false", async function () {
    const { adapter } = await loadFixture(fixture);
    const honest = { ...lying, outputHash: vector.output_hash };
    expect(await adapter.verifyFault(vector.fault_proof, honest)).to.equal(false);
  });

  it("verifyFault_otherModelOrShard_false", async function () {
    const { adapter } = await loadFixture(fixture);
    expect(await adapter.verifyFault(vector.fault_proof, { ...lying, manifestHash: ethers.id("other") })).to.equal(false);
    expect(await adapter.verifyFault(vector.fault_proof, { ...lying, shard: SHARD + 1 })).to.equal(false);
  });

  it("verifyFault_proofAboutAnotherInput_false", async function () {
    const { adapter } = await loadFixture(fixture);
    const other = [...vector.inputs];
    other[0] = "5";
    expect(await adapter.verifyFault(blob(other, vector.outputs), lying)).to.equal(false);
  });

  it("verifyFault_nonCanonicalOutputWord_false", async function () {
    const { adapter } = await loadFixture(fixture);
    // out[0] + r is the same scalar to the verifier but hashes differently: refused.
    const forged = ethers.concat([
      words(vector.inputs),
      ethers.zeroPadValue(ethers.toBeHex(((BigInt(vector.outputs[0]) % R) + R) % R + R), 32),
      words(vector.outputs.slice(1)),
      ethers.toUtf8Bytes("valid"),
    ]);
    const honest = { ...lying, outputHash: vector.output_hash };
    expect(await adapter.verifyFault(forged, honest)).to.equal(false);
  });

  it("verifyFault_verifierRejectsOrReverts_false", async function () {
    const { adapter } = await loadFixture(fixture);
    expect(await adapter.verifyFault(blob(vector.inputs, vector.outputs, "tampered"), lying)).to.equal(false);
    expect(await adapter.verifyFault(blob(vector.inputs, vector.outputs, "revert"), lying)).to.equal(false);
  });

  it("verifyFault_blobWithoutProofBytes_false", async function () {
    const { adapter } = await loadFixture(fixture);
    expect(await adapter.verifyFault(ethers.concat([words(vector.inputs), words(vector.outputs)]), lying)).to.equal(false);
    expect(await adapter.verifyFault("0x", lying)).to.equal(false);
  });

  it("constructor_zeroVerifierOrEmptyCircuit_reverts", async function () {
    const { halo2 } = await loadFixture(fixture);
    const factory = await ethers.getContractFactory("EzklFaultVerifier");
    await expect(factory.deploy(ethers.ZeroAddress, manifestHash, SHARD, IN, OUT))
      .to.be.revertedWithCustomError(factory, "ZeroVerifier");
    await expect(factory.deploy(await halo2.getAddress(), manifestHash, SHARD, 0, OUT))
      .to.be.revertedWithCustomError(factory, "EmptyCircuit")
      .withArgs(0, OUT);
    await expect(factory.deploy(await halo2.getAddress(), manifestHash, SHARD, IN, 0))
      .to.be.revertedWithCustomError(factory, "EmptyCircuit")
      .withArgs(IN, 0);
  });

  it("proveComputationFault_throughAdapter_slashesFailedVerification", async function () {
    const { adapter } = await loadFixture(fixture);
    const env = await h.deployAll({ faultVerifier: await adapter.getAddress() });
    const [, node, challenger] = await ethers.getSigners();
    await env.staking.connect(node).stake(h.Role.Compute, { value: h.ONE * 2n });
    const sig = (await h.signAll([node], env.fraudDomain, "Reveal", lying))[0];
    const id = h.evidenceId(node.address, lying.session, lying.step, lying.shard);
    const honest = { ...lying, outputHash: vector.output_hash };
    const honestSig = (await h.signAll([node], env.fraudDomain, "Reveal", honest))[0];
    const s0 = await h.commitChallenge(env.fraudProofs, challenger, id, h.Offence.FailedVerification);
    await expect(env.fraudProofs.connect(challenger).proveComputationFault(honest, honestSig, vector.fault_proof, s0))
      .to.be.revertedWithCustomError(env.fraudProofs, "NotAFault");
    await expect(env.fraudProofs.connect(challenger).proveComputationFault(lying, sig, vector.fault_proof, s0))
      .to.emit(env.staking, "Slashed")
      .withArgs(node.address, h.Offence.FailedVerification, h.ONE, challenger.address, h.ONE / 2n, h.ONE / 2n);
  });
});
