"""Chain clients: web3 for the EVM settlement chain (`node.chain.evm`), RPC for the CometBFT
committee chain (`committee_rpc`, `committee_link`)."""
