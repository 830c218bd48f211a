"""The share-chain: contributions, share weights, epoch payouts and Merkle proofs (pure, deterministic)."""
