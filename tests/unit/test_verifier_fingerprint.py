"""node.verifier.fingerprint on a tiny random Llama: extraction, a node's recorder, the check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.verifier import cheats
from node.verifier.fingerprint import FingerprintRecorder, check, fingerprint_bytes, topk_rows
from node.verifier.measure import recompute, serve_trace
from protocol.errors import ProtocolError
from protocol.fingerprint import MAX_BLOCK_BYTES, TOPK, Tolerance, decode_blocks
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

TOLERANCE = Tolerance(max_ulp=4, min_match_per_mille=900, max_mean_ulp_milli=1500)
WORDS = " ".join(f"w{(7 * i) % 120}" for i in range(70))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[ClientHead, list[ShardModel], Path]:
    root = tmp_path_factory.mktemp("tiny-fp")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=True)
    path = prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None)
    head = ClientHead.load(path, device="cpu")
    shards = [ShardModel.load(path, k, device="cpu") for k in range(2)]
    return head, shards, path


def test_topk_rows_pick_largest_magnitudes_lower_channel_on_ties() -> None:
    hidden = torch.zeros(1, 2, 8)
    hidden[0, 0] = torch.tensor([0.5, -9.0, 3.0, 3.0, 1.0, 3.0, 0.0, 2.0])
    hidden[0, 1] = torch.tensor([1.0e6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
    rows = topk_rows(hidden)
    assert [c for c, _ in rows[0]] == [1, 2, 3, 5]
    assert [c for c, _ in rows[1]][:2] == [0, 7]
    assert rows[1][0][1] == 0x7BFF  # saturated at fp16 max, not inf
    assert rows[0][0][1] == 0xC880  # -9.0 in fp16


def test_topk_rows_reject_batched_tensors() -> None:
    with pytest.raises(ProtocolError):
        topk_rows(torch.zeros(2, 3, 8))


def test_fingerprint_bytes_align_blocks_to_absolute_positions() -> None:
    hidden = torch.randn(1, 70, 64, generator=torch.Generator().manual_seed(0))
    blocks = decode_blocks(fingerprint_bytes(hidden, start=10))
    assert [b.positions for b in blocks] == [22, 32, 16]
    assert len(fingerprint_bytes(hidden[:, :32], start=0)) == MAX_BLOCK_BYTES


def test_recorder_equals_one_shot_fingerprint_of_the_same_outputs() -> None:
    hidden = torch.randn(1, 70, 64, generator=torch.Generator().manual_seed(1))
    recorder = FingerprintRecorder()
    recorder.add(hidden[:, :20], torch.arange(20))
    for t in range(20, 70):
        recorder.add(hidden[:, t : t + 1], torch.tensor([t]))
    assert len(recorder.blocks) == 2
    tail = recorder.flush()
    assert tail is not None and recorder.flush() is None
    assert b"".join([*recorder.blocks, tail]) == fingerprint_bytes(hidden, 0)


def test_recorder_refuses_a_position_gap() -> None:
    recorder = FingerprintRecorder()
    recorder.add(torch.randn(1, 3, 64), torch.arange(3))
    with pytest.raises(ProtocolError):
        recorder.add(torch.randn(1, 1, 64), torch.tensor([4]))


def test_check_honest_decode_vs_one_prefill_passes(tiny: Any) -> None:
    head, shards, _ = tiny
    hidden = head.embed(head.encode(WORDS))
    trace = serve_trace(shards, hidden, prompt_len=8)
    for k, shard in enumerate(shards):
        committed = fingerprint_bytes(trace.outputs[k], 0)
        verdict = check(committed, recompute(shard, trace.inputs[k]), 0, TOLERANCE)
        assert verdict.passed, verdict
        assert len(verdict.blocks) == 3 and verdict.match_per_mille >= 900


def test_check_perturbed_weights_fail(tiny: Any) -> None:
    head, shards, path = tiny
    hidden = head.embed(head.encode(WORDS))
    cheat = cheats.perturb_weights_(
        ShardModel.load(path, 1, device="cpu"), 0.05, 0, confirm=cheats.CHEAT
    )
    trace = serve_trace([shards[0], cheat], hidden, prompt_len=8)
    verdict = check(
        fingerprint_bytes(trace.outputs[1]), recompute(shards[1], trace.inputs[1]), 0, TOLERANCE
    )
    assert not any(block.passed for block in verdict.blocks)


def test_check_noise_on_some_steps_fails_those_blocks(tiny: Any) -> None:
    head, shards, _ = tiny
    hidden = head.embed(head.encode(WORDS))
    noisy = cheats.NoisyShard(shards[1], 0.05, 4, 0, confirm=cheats.CHEAT)
    trace = serve_trace([shards[0], noisy], hidden, prompt_len=8)
    verdict = check(
        fingerprint_bytes(trace.outputs[1]), recompute(shards[1], trace.inputs[1]), 0, TOLERANCE
    )
    assert not verdict.passed
    assert all(not block.passed for block in verdict.blocks)


def test_check_block_count_mismatch_is_protocol_error(tiny: Any) -> None:
    hidden = torch.randn(1, 40, 64)
    with pytest.raises(ProtocolError):
        check(fingerprint_bytes(hidden[:, :32]), hidden, 0, TOLERANCE)


def test_cheats_need_explicit_confirmation(tiny: Any) -> None:
    _, shards, _ = tiny
    with pytest.raises(ValueError):
        cheats.skip_layers(shards[0], 2, confirm="yes")
    with pytest.raises(ValueError):
        cheats.NoisyShard(shards[0], 0.1, 2, 0, confirm="")
    with pytest.raises(ValueError):
        cheats.perturb_weights_(shards[0], 0.1, 0, confirm="true")


def test_topk_constant_matches_rows() -> None:
    assert all(len(row) == TOPK for row in topk_rows(torch.randn(3, 64)))


def test_check_mid_session_block_with_context_passes_and_wrong_offset_fails(tiny: Any) -> None:
    head, shards, _ = tiny
    hidden = head.embed(head.encode(WORDS))
    trace = serve_trace(shards, hidden, prompt_len=8)
    recorder = FingerprintRecorder()
    recorder.add(trace.outputs[1], torch.arange(trace.outputs[1].shape[1]))
    block = recorder.blocks[1]  # positions [32, 64)
    own = recompute(shards[1], trace.inputs[1][:, :64])  # the ticket: inputs up to the block's end
    assert check(block, own[:, 32:], 32, TOLERANCE).passed
    assert not check(block, own[:, 31:63], 32, TOLERANCE).passed  # rows shifted by one
