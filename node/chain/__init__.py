"""Chain clients: web3 for the EVM settlement chain, RPC for the CometBFT committee chain."""
