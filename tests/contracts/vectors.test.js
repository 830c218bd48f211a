// Golden vectors shared with the Python side (tests/vectors/*.json, written by
// tests/vectors/generate.py): the Solidity type hashes, struct hashes, domain separators, digests,
// ECDSA recovery and Merkle leaves/proofs must match them exactly.
// Runs last (alphabetical) and resets the network so that the first deployment lands at the
// vectors' verifyingContract (0x5FbDB…, deployer account 0 at nonce 0) and the third at the
// vectors' QueryEscrow (0x9fE46…, nonce 2), which then posts the vectors' prepaid statement.
const { expect } = require("chai");

const { ethers, network } = require("hardhat");
const fs = require("fs");
const path = require("path");

const VECTORS = path.join(__dirname, "..", "vectors");
// JSON numbers above 2^53 (uint64 nonces, epochs) would lose precision in JSON.parse: quote them.
const readJson = (name) =>
  JSON.parse(
    fs.readFileSync(path.join(VECTORS, name), "utf8").replace(/([:\[,]\s*)(\d{16,})(?=\s*[,\]}])/g, '$1"$2"'),
  );
const eip712 = readJson("eip712.json");
const merkle = readJson("merkle.json");

const TYPE_INDEX = { CommitteeUpdate: 0, Verdict: 1, PayoutRoot: 2, ModelRegistration: 3, Commitment: 4, Reveal: 5 };

async function structHash(harness, primaryType, m) {
  switch (primaryType) {
    case "CommitteeUpdate":
      return harness.committeeUpdateHash(m.signers, m.powers.map(BigInt), BigInt(m.nonce));
    case "Verdict":
      return harness.verdictHash({ ...m, nonce: BigInt(m.nonce) });
    case "PayoutRoot":
      return harness.payoutRootHash(BigInt(m.epoch), m.root, BigInt(m.total), m.queriesHash, m.consumer);
    case "ModelRegistration":
      return harness.modelRegistrationHash(m.modelId, m.manifestHash, m.shardHashes, BigInt(m.nonce), m.consumer);
    case "Commitment":
      return harness.commitmentHash({ ...m, step: BigInt(m.step), signedAt: BigInt(m.signedAt) });
    case "Reveal":
      return harness.revealHash({ ...m, step: BigInt(m.step), signedAt: BigInt(m.signedAt) });
    default:
      throw new Error(`unknown primary type ${primaryType}`);
  }
}

describe("golden vectors (tests/vectors)", function () {
  let harness;
  let committee;
  let escrow;
  before(async function () {
    await network.provider.send("hardhat_reset", []);
    // First deployment on the fresh network: lands at the vectors' Committee address.
    const cm = eip712.committee;
    committee = await (await ethers.getContractFactory("Committee")).deploy(
      cm.signers_sorted,
      cm.signers_sorted.map(() => 1n),
    );
    harness = await (await ethers.getContractFactory("EIP712Harness")).deploy();
    escrow = await (await ethers.getContractFactory("QueryEscrow")).deploy(await committee.getAddress(), 60n, 600n);
  });

  it("vectors_cover_every_typed_struct", async function () {
    const covered = new Set(eip712.cases.map((c) => c.primaryType));
    expect([...covered].sort()).to.deep.equal(Object.keys(TYPE_INDEX).sort());
  });

  for (const c of eip712.cases) {
    it(`eip712_${c.name}_matches_solidity`, async function () {
      const typeHashes = await harness.typeHashes();
      expect(typeHashes[TYPE_INDEX[c.primaryType]]).to.equal(c.type_hash);
      if (c.type_string) expect(ethers.id(c.type_string)).to.equal(c.type_hash);
      const d = c.domain;
      const separator = await harness.domainSeparator(d.name, d.version, d.chainId, d.verifyingContract);
      if (c.domain_separator) expect(separator).to.equal(c.domain_separator);
      expect(await structHash(harness, c.primaryType, c.message)).to.equal(c.struct_hash);
      expect(await harness.digest(separator, c.struct_hash)).to.equal(c.digest);
      // ethers' independent EIP-712 implementation agrees as well.
      expect(ethers.TypedDataEncoder.hash(d, c.types, c.message)).to.equal(c.digest);
      expect(await harness.recover(c.digest, c.signature)).to.equal(eip712.signer_address);
    });
  }

  it("eip712_commitment_value_matches_solidity", async function () {
    const v = eip712.helpers.commitment_value;
    // The commitment value covers (session, step, shard, outputHash, salt) only: the reveal's other
    // fields (model, input, signing time) do not change it.
    const reveal = { ...v, step: BigInt(v.step), manifestHash: ethers.ZeroHash, inputHash: ethers.ZeroHash, signedAt: 0n };
    expect(await harness.commitmentValue(reveal)).to.equal(v.value);
    expect(await harness.commitmentValue({ ...reveal, manifestHash: ethers.id("m"), signedAt: 5n })).to.equal(v.value);
  });

  it("eip712_evidence_id_and_challenge_commitment_match_solidity", async function () {
    const fp = await (await ethers.getContractFactory("FraudProofs")).deploy(
      ethers.ZeroAddress,
      ethers.ZeroAddress,
      ethers.ZeroAddress,
      60n,
    );
    const e = eip712.helpers.evidence_id;
    expect(await fp.evidenceId(e.node, e.session, BigInt(e.step), e.shard)).to.equal(e.value);
    const c = eip712.helpers.challenge_commitment;
    expect(await fp.challengeCommitment(c.challenger, c.evidenceId, c.offence, c.salt)).to.equal(c.value);
  });

  const chargesOf = (v) => ({ queryIds: v.queryIds, fees: v.fees.map(BigInt), payers: v.payers, gateways: v.gateways, debits: v.debits.map(BigInt) });

  it("eip712_queries_hash_matches_solidity", async function () {
    for (const name of ["queries_hash", "queries_hash_empty"]) {
      const v = eip712.helpers[name];
      expect(await harness.queriesHash(chargesOf(v)), name).to.equal(v.value);
      const types = ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"];
      const c = chargesOf(v);
      const encoded = ethers.AbiCoder.defaultAbiCoder().encode(types, [c.queryIds, c.fees, c.payers, c.gateways, c.debits]);
      expect(ethers.keccak256(encoded), name).to.equal(v.value);
    }
  });

  it("escrow_postsTheVectorsPrepaidStatement_itsCalldataHashMatchesPython", async function () {
    // QueryEscrow hashes the Charges calldata in place (no ABI re-encoding): posting the
    // committee-signed vector statement succeeds only if that hash equals the Python one.
    const c = eip712.cases.find((x) => x.name === "payout_root_prepaid");
    const v = eip712.helpers.queries_hash;
    expect(c.message.queriesHash).to.equal(v.value);
    expect(await escrow.getAddress()).to.equal(c.message.consumer);
    const [, user] = await ethers.getSigners();
    v.queryIds.forEach((q, i) => expect(BigInt(v.fees[i]) < 2n ** 64n, q).to.equal(true));
    for (const [i, q] of v.queryIds.entries()) {
      await escrow.connect(user).deposit(q, ethers.ZeroHash, v.gateways[0], { value: BigInt(v.fees[i]) });
    }
    const wallets = eip712.committee.private_keys.map((k) => new ethers.Wallet(k));
    const sorted = wallets.sort((a, b) => (BigInt(a.address) < BigInt(b.address) ? -1 : 1));
    const sigs = await Promise.all(sorted.map((w) => w.signTypedData(c.domain, { PayoutRoot: c.types.PayoutRoot }, c.message)));
    const posted = escrow.postPayoutRoot(BigInt(c.message.epoch), c.message.root, BigInt(c.message.total), chargesOf(v), sigs);
    // The committee accepted the signatures over the calldata hash (else `UnknownSigner`): the
    // statement then fails the page rule, since it lists queries of gateway 0 next to a debit
    // of gateway 1 (a page charging deposits pays their gateway alone).
    const second = v.gateways.findIndex((g) => g !== v.gateways[0]);
    await expect(posted)
      .to.be.revertedWithCustomError(escrow, "WrongGatewayDebit")
      .withArgs(v.payers[second], v.gateways[second], v.gateways[0]);
  });

  it("committee_contract_accepts_python_committee_signatures", async function () {
    const cm = eip712.committee;
    const c = eip712.cases.find((x) => x.name === cm.case);
    expect(await committee.getAddress()).to.equal(c.domain.verifyingContract);
    expect(await committee.domainSeparator()).to.equal(ethers.TypedDataEncoder.hashDomain(c.domain));
    const derived = cm.private_keys.map((k) => new ethers.Wallet(k).address);
    expect([...derived].sort()).to.deep.equal([...cm.signers_sorted].sort());
    expect(await committee.signedPower(c.struct_hash, cm.signatures_sorted)).to.equal(4n);
    await committee.verify(c.struct_hash, cm.signatures_sorted); // does not revert
  });

  it("merkle_leaves_root_and_proofs_match_openzeppelin", async function () {
    expect(merkle.leaves.length).to.equal(merkle.leaf_hashes.length);
    expect(merkle.leaves.length).to.equal(merkle.proofs.length);
    let total = 0n;
    for (const [i, leaf] of merkle.leaves.entries()) {
      const h = await harness.payoutLeaf(BigInt(leaf.epoch), leaf.account, BigInt(leaf.amount));
      expect(h).to.equal(merkle.leaf_hashes[i]);
      expect(await harness.verifyProof(merkle.proofs[i], merkle.root, h)).to.equal(true);
      total += BigInt(leaf.amount);
    }
    if (merkle.total !== undefined) expect(total).to.equal(BigInt(merkle.total));
    // A proof for one leaf does not prove another.
    expect(await harness.verifyProof(merkle.proofs[0], merkle.root, merkle.leaf_hashes[1])).to.equal(false);
  });
});
