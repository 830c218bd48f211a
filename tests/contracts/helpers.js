// Shared fixtures for the Hardhat tests and bench/gas.js: deterministic committee wallets, EIP-712
// type definitions (normative, docs/contracts.md), sorted committee signatures, a sorted-pair Merkle
// tree compatible with OpenZeppelin's MerkleProof, and a one-call deployment of all contracts.
const { ethers } = require("hardhat");

const ONE = ethers.parseEther("1");
const BURN_ADDRESS = "0x000000000000000000000000000000000000dEaD";
const Role = { None: 0, Compute: 1, Verifier: 2, Relay: 3 };
const Offence = { None: 0, CommitRevealMismatch: 1, Equivocation: 2, FailedVerification: 3, Timeout: 4, Collusion: 5 };
const DEFAULTS = {
  minCompute: ONE,
  minVerifier: ONE / 2n,
  minRelay: ONE / 10n,
  challengeWindow: 60n,
  unstakeDelay: 61n,
  refundTimeout: 600n,
};

const TYPES = {
  CommitteeUpdate: [
    { name: "signers", type: "address[]" },
    { name: "powers", type: "uint256[]" },
    { name: "nonce", type: "uint64" },
  ],
  Verdict: [
    { name: "node", type: "address" },
    { name: "offence", type: "uint8" },
    { name: "evidenceHash", type: "bytes32" },
    { name: "challenger", type: "address" },
    { name: "nonce", type: "uint64" },
    { name: "consumer", type: "address" },
  ],
  PayoutRoot: [
    { name: "epoch", type: "uint64" },
    { name: "root", type: "bytes32" },
    { name: "total", type: "uint256" },
    { name: "queriesHash", type: "bytes32" },
    { name: "consumer", type: "address" },
  ],
  ModelRegistration: [
    { name: "modelId", type: "bytes32" },
    { name: "manifestHash", type: "bytes32" },
    { name: "shardHashes", type: "bytes32[]" },
    { name: "nonce", type: "uint64" },
    { name: "consumer", type: "address" },
  ],
  Commitment: [
    { name: "session", type: "bytes32" },
    { name: "step", type: "uint64" },
    { name: "shard", type: "uint32" },
    { name: "commitment", type: "bytes32" },
    { name: "signedAt", type: "uint64" },
  ],
  Reveal: [
    { name: "session", type: "bytes32" },
    { name: "step", type: "uint64" },
    { name: "shard", type: "uint32" },
    { name: "manifestHash", type: "bytes32" },
    { name: "inputHash", type: "bytes32" },
    { name: "outputHash", type: "bytes32" },
    { name: "salt", type: "bytes32" },
    { name: "signedAt", type: "uint64" },
  ],
};

const coder = ethers.AbiCoder.defaultAbiCoder();

/** n deterministic wallets (not connected), sorted by ascending address. */
// The time of the block that mined `tx` (a sent transaction): what a contract saw as
// block.timestamp. The latest block's time plus one is not: the next block may be later still
// (Hardhat takes the wall clock), and a transaction sent before reading it may already be mined.
async function blockTime(tx) {
  const mined = await tx.wait();
  return BigInt((await ethers.provider.getBlock(mined.blockNumber)).timestamp);
}

function wallets(n, seed = "planet-committee") {
  const out = [];
  for (let i = 0; i < n; i++) out.push(new ethers.Wallet(ethers.id(`${seed}/${i}`)));
  return out.sort((a, b) => (BigInt(a.address) < BigInt(b.address) ? -1 : 1));
}

function sortByAddress(ws) {
  return [...ws].sort((a, b) => (BigInt(a.address) < BigInt(b.address) ? -1 : 1));
}

function domain(name, chainId, verifyingContract) {
  return { name, version: "1", chainId, verifyingContract };
}

/** Signatures of `signers` (sorted by address unless `keepOrder`) over one typed struct. */
async function signAll(signers, dom, primaryType, value, keepOrder = false) {
  const ordered = keepOrder ? signers : sortByAddress(signers);
  return Promise.all(ordered.map((w) => w.signTypedData(dom, { [primaryType]: TYPES[primaryType] }, value)));
}

/** keccak256(abi.encode(queryIds, fees, payers, gateways, debits)): what a PayoutRoot's queriesHash binds. */
function queriesHash(queryIds, fees, payers = [], gateways = [], debits = []) {
  return ethers.keccak256(
    coder.encode(
      ["bytes32[]", "uint256[]", "address[]", "address[]", "uint256[]"],
      [queryIds, fees, payers, gateways, debits],
    ),
  );
}

/** The `Charges` tuple postPayoutRoot and disputeRoot take. */
function charges(queryIds, fees, payers = [], gateways = [], debits = []) {
  return { queryIds, fees, payers, gateways, debits };
}

/** Sorts prepaid debits [{payer, gateway, debit}] by (payer, gateway), the order a posting needs;
 * returns {payers, gateways, debits}. */
function sortedDebits(items) {
  const key = (a) => [BigInt(a.payer), BigInt(a.gateway)];
  const sorted = [...items].sort((a, b) => {
    const [pa, ga] = key(a);
    const [pb, gb] = key(b);
    if (pa !== pb) return pa < pb ? -1 : 1;
    return ga < gb ? -1 : ga > gb ? 1 : 0;
  });
  return {
    payers: sorted.map((x) => x.payer),
    gateways: sorted.map((x) => x.gateway),
    debits: sorted.map((x) => x.debit),
  };
}

function commitmentValue(session, step, shard, outputHash, salt) {
  return ethers.keccak256(
    coder.encode(["bytes32", "uint64", "uint32", "bytes32", "bytes32"], [session, step, shard, outputHash, salt]),
  );
}

function evidenceId(node, session, step, shard) {
  return ethers.keccak256(coder.encode(["address", "bytes32", "uint64", "uint32"], [node, session, step, shard]));
}

function challengeCommitment(challenger, id, offence, salt) {
  return ethers.keccak256(coder.encode(["address", "bytes32", "uint8", "bytes32"], [challenger, id, offence, salt]));
}

/** Commits `challenger`'s challenge of evidence `id` for `offence` and mines it; returns the salt. */
async function commitChallenge(fraudProofs, challenger, id, offence, salt = ethers.id(`salt/${challenger.address}/${id}/${offence}`)) {
  await (await fraudProofs.connect(challenger).commitChallenge(challengeCommitment(challenger.address, id, offence, salt))).wait();
  return salt;
}

function payoutLeaf(epoch, account, amount) {
  return ethers.keccak256(
    ethers.keccak256(coder.encode(["uint64", "address", "uint256"], [epoch, account, amount])),
  );
}

function hashPair(a, b) {
  return BigInt(a) < BigInt(b) ? ethers.keccak256(ethers.concat([a, b])) : ethers.keccak256(ethers.concat([b, a]));
}

/** Sorted-pair Merkle tree over payout leaves; returns {root, proof(i)}. An odd node moves up as is. */
function merkleTree(entries /* [{epoch, account, amount}] */) {
  const leaves = entries.map((e) => payoutLeaf(e.epoch, e.account, e.amount));
  const levels = [leaves];
  while (levels[levels.length - 1].length > 1) {
    const prev = levels[levels.length - 1];
    const next = [];
    for (let i = 0; i < prev.length; i += 2) next.push(i + 1 < prev.length ? hashPair(prev[i], prev[i + 1]) : prev[i]);
    levels.push(next);
  }
  const root = levels[levels.length - 1][0];
  const proof = (index) => {
    const out = [];
    let idx = index;
    for (let l = 0; l < levels.length - 1; l++) {
      const sibling = idx ^ 1;
      if (sibling < levels[l].length) out.push(levels[l][sibling]);
      idx >>= 1;
    }
    return out;
  };
  return { root, leaves, proof };
}

/** Deploys Committee, Staking (+ its FraudProofs), QueryEscrow and ModelRegistry. */
async function deployAll(opts = {}) {
  const o = { ...DEFAULTS, members: wallets(4), devOwner: ethers.ZeroAddress, faultVerifier: ethers.ZeroAddress, ...opts };
  const members = sortByAddress(o.members);
  const powers = o.powers ?? members.map(() => 1n);
  const committee = await (await ethers.getContractFactory("Committee")).deploy(
    members.map((w) => w.address),
    powers,
  );
  const staking = await (await ethers.getContractFactory("Staking")).deploy(
    await committee.getAddress(),
    o.faultVerifier,
    o.minCompute,
    o.minVerifier,
    o.minRelay,
    o.challengeWindow,
    o.unstakeDelay,
  );
  const fraudProofs = await ethers.getContractAt("FraudProofs", await staking.fraudProofs());
  const escrow = await (await ethers.getContractFactory("QueryEscrow")).deploy(
    await committee.getAddress(),
    o.challengeWindow,
    o.refundTimeout,
  );
  const registry = await (await ethers.getContractFactory("ModelRegistry")).deploy(
    await committee.getAddress(),
    o.devOwner,
  );
  const { chainId } = await ethers.provider.getNetwork();
  return {
    committee,
    staking,
    fraudProofs,
    escrow,
    registry,
    members,
    powers,
    chainId,
    committeeDomain: domain("Planet Committee", chainId, await committee.getAddress()),
    fraudDomain: domain("Planet Fraud Proofs", chainId, await fraudProofs.getAddress()),
    opts: o,
  };
}

module.exports = {
  blockTime,
  ONE,
  BURN_ADDRESS,
  Role,
  Offence,
  DEFAULTS,
  TYPES,
  wallets,
  sortByAddress,
  domain,
  signAll,
  queriesHash,
  charges,
  sortedDebits,
  commitmentValue,
  evidenceId,
  challengeCommitment,
  commitChallenge,
  payoutLeaf,
  merkleTree,
  deployAll,
};
