"""`fixed_order_attention` (node/model/fast.py), the int8 shards' one-row attention: its bits do
not depend on torch's thread count (1, 2, 4; set in the calling thread or in a worker thread,
as the verifier's spot checker runs) nor on the cache buffer the keys are a view of, and it is
attention (close to torch's sdpa)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.nn import functional as F

from node.model.fast import fixed_order_attention

pytestmark = pytest.mark.unit

HEADS, KV_HEADS, DIM = 9, 3, 64
LENGTHS = (1, 7, 33, 57, 132, 513)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, 1, DIM, generator=generator)
    keys = torch.randn(KV_HEADS, 1024, DIM, generator=generator)
    values = torch.randn(KV_HEADS, 1024, DIM, generator=generator)
    return q, keys, values


def _all(threads: int) -> dict[tuple[int, int], torch.Tensor]:
    q, keys, values = _inputs()
    torch.set_num_threads(threads)
    out = {}
    for length in LENGTHS:
        for capacity in (length, 1024):  # a fresh buffer and a pooled, larger one
            k = keys[:, :capacity].clone()[:, :length]
            v = values[:, :capacity].clone()[:, :length]
            out[(length, capacity)] = fixed_order_attention(q, k, v, DIM**-0.5)
    return out


def test_fixed_order_attention_bits_do_not_depend_on_threads_or_buffer() -> None:
    before = torch.get_num_threads()
    try:
        reference = _all(1)
        runs = {threads: _all(threads) for threads in (2, 4)}
        in_worker: list[dict] = []
        worker = threading.Thread(target=lambda: in_worker.append(_all(2)))
        worker.start()
        worker.join()
        runs[-2] = in_worker[0]
    finally:
        torch.set_num_threads(before)
    for (length, _), out in reference.items():
        assert torch.equal(out, reference[(length, length)])
    for threads, outs in runs.items():
        for key, out in outs.items():
            assert torch.equal(out, reference[key]), (threads, key)


def test_fixed_order_attention_is_grouped_query_attention() -> None:
    q, keys, values = _inputs()
    for length in LENGTHS:
        k, v = keys[:, :length], values[:, :length]
        expected = F.scaled_dot_product_attention(
            q, k.unsqueeze(0), v.unsqueeze(0), scale=DIM**-0.5, enable_gqa=True
        )
        got = fixed_order_attention(q, k, v, DIM**-0.5)
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
