"""Activation fingerprints from tensors: per-position top-k rows and the per-session recorder.

The byte format and the integer comparison live in `protocol.fingerprint` (consensus-relevant,
torch-free). This module turns activations into per-position top-k (channel, fp16 bits) rows,
for both sides of a spot check: the serving node (`FingerprintRecorder`, through
`node.server.served`) and the verifier (`node.verifier.fingerprint.check`). One implementation,
so both sides select the same channels the same way:

    rows = topk_rows(hidden)                 # hidden [1, T, H] or [T, H] -> T rows of TOPK points
    data = fingerprint_bytes(hidden, start)  # blocks for absolute positions [start, start + T)
    recorder = FingerprintRecorder()         # what a serving node keeps per session
    recorder.add(out, positions)             # after each forward; completed blocks accumulate

Selection rule: the TOPK channels with the largest |fp32 value|, ties to the lower channel (a
stable sort), each value rounded to fp16 with overflow saturated at ±65504.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.errors import ProtocolError
from protocol.fingerprint import BLOCK_POSITIONS, TOPK, Row, encode_block

FP16_MAX = 65504.0


def _as_matrix(hidden: torch.Tensor) -> torch.Tensor:
    if hidden.dim() == 3 and hidden.shape[0] == 1:
        return hidden[0]
    if hidden.dim() == 2:
        return hidden
    raise ProtocolError(f"activations must be [1, T, H] or [T, H], got {list(hidden.shape)}")


@torch.inference_mode()
def topk_rows(hidden: torch.Tensor, k: int = TOPK) -> list[list[tuple[int, int]]]:
    """Per position the k (channel, fp16 bit pattern) points with the largest |value|."""
    matrix = _as_matrix(hidden).detach().to("cpu", torch.float32)  # [T, H]
    order = torch.sort(matrix.abs(), dim=1, descending=True, stable=True).indices[:, :k]
    values = torch.gather(matrix, 1, order).clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
    bits = values.view(torch.int16).to(torch.int32) & 0xFFFF  # [T, k]
    return [
        list(zip(channels, patterns, strict=True))
        for channels, patterns in zip(order.tolist(), bits.tolist(), strict=True)
    ]


def topk_rows_numpy(hidden: np.ndarray, k: int = TOPK) -> list[list[tuple[int, int]]]:
    """`topk_rows` for a float32 numpy array (what the node's server holds), bit for bit the
    same rows (a unit test compares them): a one-position decode step costs a few µs here
    against ~100 µs of torch op overhead."""
    matrix = hidden[0] if hidden.ndim == 3 and hidden.shape[0] == 1 else hidden
    if matrix.ndim != 2:
        raise ProtocolError(f"activations must be [1, T, H] or [T, H], got {list(hidden.shape)}")
    matrix = matrix.astype(np.float32, copy=False)
    # stable ascending sort of −|x| = descending |x| with ties to the lower channel
    order = np.argsort(-np.abs(matrix), axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(matrix, order, axis=1).clip(-FP16_MAX, FP16_MAX)
    bits = values.astype(np.float16).view(np.uint16)
    return [
        list(zip(channels, patterns, strict=True))
        for channels, patterns in zip(order.tolist(), bits.tolist(), strict=True)
    ]


def block_spans(start: int, count: int) -> list[tuple[int, int]]:
    """(first, end) absolute positions of the aligned blocks that [start, start+count) touches."""
    spans = []
    position = start
    end = start + count
    while position < end:
        block_end = min(end, (position // BLOCK_POSITIONS + 1) * BLOCK_POSITIONS)
        spans.append((position, block_end))
        position = block_end
    return spans


def fingerprint_bytes(hidden: torch.Tensor, start: int = 0) -> bytes:
    """Blocks for the positions [start, start + T) of `hidden`. Blocks are aligned to absolute
    multiples of 32, so a range that starts mid-block begins with a shorter block."""
    rows = topk_rows(hidden)
    out = bytearray()
    for first, end in block_spans(start, len(rows)):
        out += encode_block(rows[first - start : end - start])
    return bytes(out)


@dataclass
class FingerprintRecorder:
    """A serving node's per-session fingerprints: feed every forward's outputs in order;
    `blocks` holds the bytes of each completed 32-position block (what the node commits)."""

    next_position: int = 0
    blocks: list[bytes] = field(default_factory=list)
    _pending: list[Row] = field(default_factory=list)

    def add(
        self, outputs: torch.Tensor | np.ndarray, positions: torch.Tensor | Sequence[int]
    ) -> None:
        plist = [int(p) for p in positions]
        if not plist:
            return
        expected = list(range(self.next_position, self.next_position + len(plist)))
        if plist != expected:
            raise ProtocolError(
                f"fingerprint positions must continue at {self.next_position}, got {plist[0]}"
            )
        rows = topk_rows_numpy(outputs) if isinstance(outputs, np.ndarray) else topk_rows(outputs)
        for row in rows:
            self._pending.append(row)
            self.next_position += 1
            if self.next_position % BLOCK_POSITIONS == 0:
                self.blocks.append(encode_block(self._pending))
                self._pending = []

    def flush(self) -> bytes | None:
        """The partial block at the end of a session (None when nothing is pending)."""
        if not self._pending:
            return None
        block = encode_block(self._pending)
        self._pending = []
        return block
