"""What the blockwise codecs (int8, hq9, ohq7) share: blocks of 64 values and the rotation.

A body encodes the flattened [1, T, H] tensor in blocks of BLOCK values (the last block padded
with zeros). H (576 for SmolLM2) is a multiple of BLOCK, so a block never mixes two rows.
"""

from __future__ import annotations

from typing import Final

import numpy as np

BLOCK: Final = 64


def block_count(n_values: int) -> int:
    return -(-n_values // BLOCK)


def padded_blocks(values: np.ndarray) -> np.ndarray:
    """The flattened float32 values as [n_blocks, BLOCK], zero-padded."""
    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n_blocks = block_count(flat.size)
    padded = np.zeros(n_blocks * BLOCK, dtype=np.float32)
    padded[: flat.size] = flat
    return padded.reshape(n_blocks, BLOCK)


def _hadamard(n: int) -> np.ndarray:
    """Orthonormal, symmetric Walsh-Hadamard matrix (n a power of two): H @ H = I."""
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


# Rotating a block by H64 spreads a few outlier channels over all 64 values, so one scale
# fits the block; the receiver rotates back with the same matrix (H64 @ H64 = I).
H64: Final = _hadamard(BLOCK)
