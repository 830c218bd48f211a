"""The share-chain: contributions, share weights, epoch payouts and Merkle proofs.

Pure and deterministic: integers and canonical bytes only.
"""
