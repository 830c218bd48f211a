"""The share-chain: redeemed work, share weights, epoch payouts and Merkle proofs.

Pure and deterministic: integers and canonical bytes only.
"""
