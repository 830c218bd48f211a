"""An echo's prompt logprobs (a verifier's challenge: ~96 prompt positions) come from the LM head
in one matmul per `ECHO_ROWS` positions, not a matrix-vector product per position (each of which
read the whole [V, H] head: ~1 CPU-s a challenge on SmolLM2, most of a devnet gateway's CPU), and
the events are those the per-position head gives: same tokens, same top ids, logprobs within
float32 rounding. An echo without logprobs asks the head for nothing.

The head is the real `ClientHead` (its final norm and F.linear) over small random tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from node.client.sampling import SamplingConfig
from node.gateway.engine import ECHO_ROWS, Generation, token_event
from node.model.head import EMBED_KEY, NORM_KEY, ClientHead
from node.model.head_config import HeadConfig

pytestmark = pytest.mark.unit

V, H = 300, 16
TOP = 5


class CountingHead:
    """A real ClientHead that counts the LM-head calls of each kind."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(7)
        tensors = {
            EMBED_KEY: torch.randn(V, H, generator=generator),
            NORM_KEY: 1 + 0.1 * torch.randn(H, generator=generator),
        }
        config = HeadConfig("llama", H, 1e-5, (V - 1,), 2048)
        self.head = ClientHead(config, None, tensors, torch.device("cpu"))
        self.single = 0
        self.batched: list[int] = []  # rows per batched call

    def logits_np(self, hidden_last: np.ndarray) -> np.ndarray:
        self.single += 1
        return self.head.logits_np(hidden_last)

    def logits_batch_np(self, hidden_last: np.ndarray) -> np.ndarray:
        self.batched.append(int(hidden_last.shape[0]))
        return self.head.logits_batch_np(hidden_last)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)


def _generation(head: CountingHead, ids: list[int], logprobs: bool) -> Generation:
    return Generation(
        router=None,  # type: ignore[arg-type]  # only the echo is asked of it here
        head=head,  # type: ignore[arg-type]
        circuits=None,  # type: ignore[arg-type]
        prompt_ids=ids,
        max_tokens=1,
        sampling=SamplingConfig(),
        logprobs=logprobs,
        top_logprobs=TOP if logprobs else 0,
        echo=True,
    )


def _prefilled(generation: Generation, hidden: np.ndarray, chunk: int) -> None:
    """The prefill's final hidden states, handed over in chunks as the circuit answers them."""
    for start in range(0, hidden.shape[0], chunk):
        generation._keep_prefill(start, hidden[None, start : start + chunk])


async def test_an_echo_asks_the_head_once_per_echo_rows_positions_with_the_per_row_events() -> None:
    rng = np.random.default_rng(3)
    length = 2 * ECHO_ROWS + 22  # three batches: 64, 64, 21 rows (the last position predicts none)
    ids = [int(i) for i in rng.integers(0, V, length)]
    hidden = rng.standard_normal((length, H)).astype(np.float32)
    head = CountingHead()
    generation = _generation(head, ids, logprobs=True)
    _prefilled(generation, hidden, chunk=40)

    events = await generation.echoed_events()

    assert head.single == 0
    assert head.batched == [ECHO_ROWS, ECHO_ROWS, length - 1 - 2 * ECHO_ROWS]
    expected = [
        token_event(ids[row + 1], head.head.logits_np(hidden[row]), True, TOP)
        for row in range(length - 1)
    ]
    assert len(events) == length
    assert events[0].token == ids[0] and events[0].logprob is None and events[0].top == ()
    for got, want in zip(events[1:], expected, strict=True):
        assert got.token == want.token
        assert [t for t, _ in got.top] == [t for t, _ in want.top]
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)
        for (_, a), (_, b) in zip(got.top, want.top, strict=True):
            assert a == pytest.approx(b, abs=1e-5)


async def test_an_echo_without_logprobs_computes_no_logits() -> None:
    ids = [3, 1, 4, 1, 5]
    head = CountingHead()
    generation = _generation(head, ids, logprobs=False)
    _prefilled(generation, np.ones((len(ids), H), dtype=np.float32), chunk=len(ids))

    events = await generation.echoed_events()

    assert [e.token for e in events] == ids
    assert all(e.logprob is None and e.top == () for e in events)
    assert head.single == 0 and head.batched == []
