"""Teacher-forced scoring and the credibility map (the recurrence they feed: test_reputation.py)."""

from __future__ import annotations

import math

import pytest
import torch

from node.verifier.calibration import load_calibration, parse_calibration
from node.verifier.scoring import (
    SCALE,
    Challenge,
    CredibilityMap,
    Gap,
    compare_logits,
    epoch_credibility,
)
from protocol.errors import ConfigError, ProtocolError, UsageError

pytestmark = pytest.mark.unit

VOCAB = 50


def _challenge() -> Challenge:
    return Challenge(prompt_ids=(1, 2, 3), continuation_ids=(4, 5, 6, 7))


def _logits(seed: int, rows: int = 7) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_compare_identical_logits_zero_gap() -> None:
    ref = _logits(0)
    gap = compare_logits(_challenge(), ref.clone(), ref)
    assert gap.tokens == 4
    assert gap.kl == pytest.approx(0.0, abs=1e-6)
    assert gap.nll_gap == pytest.approx(0.0, abs=1e-6)
    assert gap.top1 == 1.0


def test_compare_scores_only_the_continuation_rows() -> None:
    ref = _logits(1)
    circuit = ref.clone()
    circuit[0] = _logits(9)[0]  # a prompt row: does not predict the continuation
    circuit[6] = _logits(9)[6]  # the last row predicts nothing
    assert compare_logits(_challenge(), circuit, ref).kl == pytest.approx(0.0, abs=1e-6)
    circuit[2] = _logits(9)[2]  # predicts continuation token 4
    assert compare_logits(_challenge(), circuit, ref).kl > 0.1


def test_compare_kl_matches_the_definition() -> None:
    ref, circuit = _logits(2), _logits(3)
    gap = compare_logits(_challenge(), circuit, ref)
    rows = range(2, 6)
    expected = 0.0
    nll = 0.0
    targets = (4, 5, 6, 7)
    for row, target in zip(rows, targets, strict=True):
        p = torch.log_softmax(ref[row], -1)
        q = torch.log_softmax(circuit[row], -1)
        expected += float((p.exp() * (p - q)).sum())
        nll += float(p[target] - q[target])
    assert gap.kl == pytest.approx(expected / 4, rel=1e-5)
    assert gap.nll_gap == pytest.approx(nll / 4, rel=1e-5, abs=1e-6)


def test_compare_nonfinite_circuit_is_infinitely_far() -> None:
    ref = _logits(4)
    circuit = ref.clone()
    circuit[3, 0] = float("nan")
    gap = compare_logits(_challenge(), circuit, ref)
    assert math.isinf(gap.kl)
    assert CredibilityMap(10, 20).credibility(gap) == 0


@pytest.mark.parametrize("shape", [(6, VOCAB), (7, VOCAB + 1), (1, 7, VOCAB)])
def test_compare_wrong_shapes_are_protocol_errors(shape: tuple[int, ...]) -> None:
    with pytest.raises(ProtocolError):
        compare_logits(_challenge(), torch.zeros(shape), _logits(5))


def test_challenge_needs_both_parts() -> None:
    with pytest.raises(UsageError):
        Challenge((), (1,))


def _gap(kl: float) -> Gap:
    return Gap(tokens=100, kl=kl, nll_gap=0.0, top1=1.0)


def test_credibility_map_is_piecewise_linear_in_micro_nats() -> None:
    mapping = CredibilityMap(full_micro=10_000, zero_micro=50_000)
    assert mapping.credibility(_gap(0.0)) == SCALE
    assert mapping.credibility(_gap(0.010)) == SCALE
    assert mapping.credibility(_gap(0.030)) == SCALE // 2
    assert mapping.credibility(_gap(0.040)) == 250_000
    assert mapping.credibility(_gap(0.050)) == 0
    assert mapping.credibility(_gap(7.0)) == 0
    with pytest.raises(ValueError):
        CredibilityMap(full_micro=5, zero_micro=5)


def test_epoch_credibility_floors_the_mean() -> None:
    assert epoch_credibility([SCALE, 0, 1]) == 333_333
    with pytest.raises(UsageError):
        epoch_credibility([])
    with pytest.raises(ValueError):
        epoch_credibility([SCALE + 1])


def test_shipped_calibration_separates_honest_from_substitutes() -> None:
    import json

    from node.verifier.calibration import CALIBRATION_FILE

    table = json.loads(CALIBRATION_FILE.read_text(encoding="utf-8"))
    cal = load_calibration()
    assert table["problems"] == []
    for name in ("fp32", "int8", "int4"):
        assert min(table["gaps"][name]["credibility"]) == SCALE
    for name, entry in table["gaps"].items():
        if name not in ("fp32", "int8", "int4"):
            kls = entry["kl"]
            assert max(cal.credibility_map.credibility(_gap(k)) for k in kls) == 0, name
    assert set(cal.tolerances) == {"none", "int8", "int4"}


def test_parse_calibration_rejects_malformed_tables() -> None:
    with pytest.raises(ConfigError):
        parse_calibration({"credibility_map": {"full_micro": 1}})
    with pytest.raises(ConfigError):
        load_calibration().tolerance("int3")
