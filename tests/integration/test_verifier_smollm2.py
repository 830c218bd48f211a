"""The verifier on real SmolLM2-135M shards (fp32 / int8 / int4, 3 shards of 10 layers).

Honest circuits score trusted on a teacher-forced challenge and their fingerprints pass a
one-prefill recomputation (int8: the int8 kernel on both sides, bit for bit); substitutes (a
skipped layer, noisy int4 weights, noise on every 4th position, another computation claiming
int8) score 0 and fail. Tolerances and the credibility map come from the shipped
`node/verifier/calibration.json`. Kept small: one 32+48-token challenge, one served shard.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from node.model.evaluate import heldout_text
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.verifier import cheats
from node.verifier.calibration import load_calibration
from node.verifier.fingerprint import check, fingerprint_bytes
from node.verifier.measure import load_circuit, recompute, run_prefill, serve_trace
from node.verifier.measure import text_challenges as windows
from node.verifier.scoring import SCALE, Challenge, compare_logits

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRUSTED = 400_000


@pytest.fixture(scope="module")
def circuits() -> dict[str, Any]:
    return {quant: load_circuit(quant) for quant in ("none", "int8", "int4")}


@pytest.fixture(scope="module")
def challenge(circuits: dict[str, Any]) -> Challenge:
    full = windows(circuits["none"].head, heldout_text(), count=3)[1]
    return Challenge(full.prompt_ids, full.continuation_ids[:48])


@pytest.fixture(scope="module")
def reference(circuits: dict[str, Any], challenge: Challenge) -> torch.Tensor:
    head = circuits["none"].head
    return head.all_logits(run_prefill(circuits["none"].shards, head.embed(challenge.ids)))


@pytest.fixture(scope="module")
def noisy_int4_shard() -> ShardModel:
    path = prepare(parts=3, quant="int4", progress=lambda _m: None)
    shard = ShardModel.load(path, 1, device="cpu")
    return cheats.perturb_weights_(shard, 0.05, 1, confirm=cheats.CHEAT)


def _credibility(circuit_shards: list[Any], circuits: dict, challenge, reference) -> int:
    head = circuits["none"].head
    logits = head.all_logits(run_prefill(circuit_shards, head.embed(challenge.ids)))
    gap = compare_logits(challenge, logits, reference)
    return load_calibration().credibility_map.credibility(gap)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_verifier_honest_quantized_circuit_scores_trusted(
    quant: str, circuits: dict, challenge: Challenge, reference: torch.Tensor
) -> None:
    score = _credibility(circuits[quant].shards, circuits, challenge, reference)
    assert score >= TRUSTED
    assert score == SCALE


def test_verifier_one_prefill_of_fp32_circuit_equals_reference(
    circuits: dict, challenge: Challenge, reference: torch.Tensor
) -> None:
    assert _credibility(circuits["none"].shards, circuits, challenge, reference) == SCALE


def test_verifier_substitutes_score_zero(
    circuits: dict, challenge: Challenge, reference: torch.Tensor, noisy_int4_shard: ShardModel
) -> None:
    fp = circuits["none"].shards
    int4 = circuits["int4"].shards
    c = cheats.CHEAT
    substitutes = {
        "skip_one_layer": [fp[0], cheats.drop_layer(fp[1], 5, confirm=c), fp[2]],
        "int4_weight_noise_5pct_one_shard": [int4[0], noisy_int4_shard, int4[2]],
        "activation_noise_every_4th": [
            fp[0],
            cheats.NoisyShard(fp[1], 0.1, 4, 0, confirm=c),
            fp[2],
        ],
    }
    scores = {
        name: _credibility(shards, circuits, challenge, reference)
        for name, shards in substitutes.items()
    }
    assert all(score < TRUSTED for score in scores.values()), scores
    assert max(scores.values()) == 0, scores


@pytest.fixture(scope="module")
def middle_inputs(circuits: dict, challenge: Challenge) -> torch.Tensor:
    """What shard 1 receives for the challenge's 80 positions (from an fp32 shard 0)."""
    head = circuits["none"].head
    first = circuits["none"].shards[0]
    ids = challenge.ids
    return first.forward(head.embed(ids), torch.arange(len(ids)), first.new_cache())


def _served(shard: Any, inputs: torch.Tensor) -> bytes:
    """The node's fingerprints: prompt prefill, then one position per forward."""
    trace = serve_trace([shard], inputs, prompt_len=32)
    return fingerprint_bytes(trace.outputs[0], 0)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_fingerprint_honest_served_shard_passes_recomputation(
    quant: str, circuits: dict, middle_inputs: torch.Tensor
) -> None:
    shard = circuits[quant].shards[1]
    verdict = check(
        _served(shard, middle_inputs),
        recompute(shard, middle_inputs),
        0,
        load_calibration().tolerance(quant),
    )
    assert verdict.passed, verdict
    assert len(verdict.blocks) == 3
    if quant == "int8":  # the kernel computes a served step as the recomputation does
        assert verdict.match_per_mille == 1000, verdict


def test_fingerprint_other_computations_claiming_int8_fail(
    circuits: dict, middle_inputs: torch.Tensor
) -> None:
    """Against the verifiers' int8 reference (the int8 kernel): fp32 and int4 shards fail, and
    so does an int8 node opted out of the kernel (`PLANET_INT8_KERNEL=0`, de-quantized fp32),
    whose steps are off by up to ~20 fp16 ULP: that opt-out is not for a verified network."""
    path = prepare(parts=3, quant="int8", progress=lambda _m: None)
    dequantized = ShardModel.load(path, 1, device="cpu", int8_kernel=False)
    reference = circuits["int8"].shards[1]
    assert "Int8Linear" in {type(m).__name__ for m in reference.module.modules()}
    own = recompute(reference, middle_inputs)
    for node in (dequantized, circuits["none"].shards[1], circuits["int4"].shards[1]):
        verdict = check(_served(node, middle_inputs), own, 0, load_calibration().tolerance("int8"))
        assert not any(block.passed for block in verdict.blocks), verdict


def test_fingerprint_int8_node_claiming_fp32_fails(
    circuits: dict, middle_inputs: torch.Tensor
) -> None:
    committed = _served(circuits["int8"].shards[1], middle_inputs)
    own = recompute(circuits["none"].shards[1], middle_inputs)
    verdict = check(committed, own, 0, load_calibration().tolerance("none"))
    assert not any(block.passed for block in verdict.blocks), verdict


def test_fingerprint_perturbed_int4_weights_fail(
    circuits: dict, middle_inputs: torch.Tensor, noisy_int4_shard: ShardModel
) -> None:
    committed = _served(noisy_int4_shard, middle_inputs)
    own = recompute(circuits["int4"].shards[1], middle_inputs)
    verdict = check(committed, own, 0, load_calibration().tolerance("int4"))
    assert not any(block.passed for block in verdict.blocks), verdict


def test_fingerprint_noise_on_some_steps_fails(circuits: dict, middle_inputs: torch.Tensor) -> None:
    shard = circuits["none"].shards[1]
    noisy = cheats.NoisyShard(shard, 0.1, 4, 3, confirm=cheats.CHEAT)
    committed = _served(noisy, middle_inputs)
    verdict = check(
        committed, recompute(shard, middle_inputs), 0, load_calibration().tolerance("none")
    )
    assert not any(block.passed for block in verdict.blocks), verdict
