"""From activation tensors to fingerprint bytes, and the verifier's one-prefill check.

The byte format and the integer comparison are in `protocol.fingerprint` (consensus-relevant,
torch-free); the top-k extraction and the node's recorder live in `node.model.fingerprint` (one
implementation for node and verifier, importable by the server) and are re-exported here:

    rows = topk_rows(hidden)                 # hidden [1, T, H] or [T, H] -> T rows of TOPK points
    data = fingerprint_bytes(hidden, start)  # blocks for absolute positions [start, start + T)
    recorder = FingerprintRecorder()         # what a serving node keeps per session
    recorder.add(out, positions)             # after each forward; completed blocks accumulate
    verdict = check(data, recomputed, start, tolerance)   # verifier: one prefill's outputs

Selection rule (both sides): the TOPK channels with the largest |fp32 value|, ties to the lower
channel (a stable sort), each value rounded to fp16 with overflow saturated at ±65504.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.model.fingerprint import (  # one implementation for node and verifier
    FP16_MAX,
    FingerprintRecorder,
    block_spans,
    fingerprint_bytes,
    topk_rows,
)
from protocol.errors import ProtocolError
from protocol.fingerprint import BlockCheck, Tolerance, compare_block, decode_blocks

__all__ = [
    "FP16_MAX",
    "FingerprintRecorder",
    "Verdict",
    "check",
    "fingerprint_bytes",
    "topk_rows",
]


@dataclass(frozen=True)
class Verdict:
    """The verifier's comparison of committed blocks with its own recomputation."""

    blocks: tuple[BlockCheck, ...]

    @property
    def passed(self) -> bool:
        return bool(self.blocks) and all(block.passed for block in self.blocks)

    @property
    def match_per_mille(self) -> int:
        values = sum(block.values for block in self.blocks)
        return sum(block.matched for block in self.blocks) * 1000 // values if values else 0


def check(data: bytes, recomputed: torch.Tensor, start: int, tolerance: Tolerance) -> Verdict:
    """Compare committed block bytes for positions [start, start + T) with the verifier's own
    outputs `recomputed` for the same positions (one prefill of the same shard)."""
    committed = decode_blocks(data)
    rows = topk_rows(recomputed)
    spans = block_spans(start, len(rows))
    if len(spans) != len(committed):
        raise ProtocolError(f"{len(committed)} committed blocks for {len(spans)} recomputed")
    checks = []
    for block, (first, end) in zip(committed, spans, strict=True):
        checks.append(compare_block(block, rows[first - start : end - start], tolerance))
    return Verdict(tuple(checks))
