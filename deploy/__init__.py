"""Deployment: contracts to an EVM RPC, CometBFT networks, local set-up scripts."""
