// Hardhat 2 configuration for Planet's settlement contracts (contracts/, tests in tests/contracts/).
// Compiles offline: the solc-js compiler comes from the pinned npm `solc` package instead of a
// download. A version mismatch between that package and SOLC_VERSION is a hard error, so a stale
// node_modules can never silently build the contracts with another compiler.
require("@nomicfoundation/hardhat-ethers");
require("@nomicfoundation/hardhat-chai-matchers");
const { subtask } = require("hardhat/config");
const { TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD } = require("hardhat/builtin-tasks/task-names");

const SOLC_VERSION = "0.8.28";

subtask(TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD, async (args) => {
  const solc = require("solc");
  const longVersion = solc.version(); // e.g. "0.8.28+commit.7893614a.Emscripten.clang"
  const npmVersion = longVersion.split("+")[0];
  if (args.solcVersion !== SOLC_VERSION || npmVersion !== SOLC_VERSION) {
    throw new Error(
      `solc version mismatch: hardhat.config.js wants ${args.solcVersion} (pinned ${SOLC_VERSION}) ` +
        `but node_modules/solc is ${longVersion}; run \`bash deploy/setup.sh\` (npm ci) or fix package.json`,
    );
  }
  return {
    compilerPath: require.resolve("solc/soljson.js"),
    isSolcJs: true,
    version: SOLC_VERSION,
    longVersion,
  };
});

/** @type import('hardhat/config').HardhatUserConfig */
module.exports = {
  solidity: {
    version: SOLC_VERSION,
    settings: {
      optimizer: { enabled: true, runs: 10000 },
      evmVersion: "cancun",
    },
  },
  paths: {
    sources: "./contracts",
    tests: "./tests/contracts",
    artifacts: "./artifacts",
    cache: "./cache",
  },
  mocha: { timeout: 60000 },
};
