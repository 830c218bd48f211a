"""PlanetServe sec. 3.4 reputation in fixed point, against values computed by hand, and its
two consumers (the committee chain and the verifier's calibration) agreeing bit for bit."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from abci_app.queries import query
from protocol.committee.registry import RegisterNode, sign_registration
from protocol.eip712 import address_of
from protocol.reputation import (
    SCALE,
    ReputationParams,
    abnormal_count,
    epochs_until_untrusted,
    is_untrusted,
    punished,
    trajectory,
    update,
)
from tests.committee_chain import Chain, seeded_evm_key, seeded_key

pytestmark = pytest.mark.unit

P = ReputationParams()  # α 0.4, β 0.6, W 5, γ 1/5, τ 0.3, untrusted < 0.4


def test_reputation_moving_average_matches_hand_value() -> None:
    # 0.4·0.5 + 0.6·0.8 = 0.68
    value, window = update(500_000, (), 800_000, P)
    assert value == 680_000
    assert window == (800_000,)


def test_reputation_single_abnormal_value_is_not_punished() -> None:
    # window [0.9, 0.1]: c = 1, c/W = 0.2 is not > γ = 0.2 → 0.4·0.68 + 0.6·0.1 = 0.332
    value, window = update(680_000, (900_000,), 100_000, P)
    assert abnormal_count(window, P) == 1
    assert not punished(1, P)
    assert value == 332_000


def test_reputation_two_abnormal_values_punish_with_hand_value() -> None:
    # window [0.9, 0.1, 0.1]: c = 2 → factor (W+1)/(W + c/γ + 2) = 6/17;
    # 0.4·0.68 + 6/17·0.1 = 0.272 + 0.0352941… = 0.3072941… → floor at 10^6 = 307294
    value, window = update(680_000, (900_000, 100_000), 100_000, P)
    assert window == (900_000, 100_000, 100_000)
    assert value == 307_294


def test_reputation_all_abnormal_window_hand_value() -> None:
    # c = 5 → factor 6/32; 0.4·0.2 + 6/32·0.1 = 0.08 + 0.01875 = 0.09875
    value, _ = update(200_000, (0, 0, 0, 0), 100_000, P)
    assert value == 98_750


def test_reputation_window_keeps_last_w_values() -> None:
    value, window = update(500_000, (1, 2, 3, 4, 5), 600_000, P)
    assert window == (2, 3, 4, 5, 600_000)
    # c = 4 of 5 below τ → punished: D = 7 + 20 = 27; 0.2 + 6/27·0.6 = 0.2 + 0.1333… = 0.3333…
    assert value == 333_333


def test_reputation_floor_rounding_never_rounds_up() -> None:
    assert update(1, (), 1, P)[0] == 1  # (0.4 + 0.6)·1e-6 exactly
    assert update(1, (), 0, P)[0] == 0  # 0.4e-6 floors to 0
    assert update(SCALE, (), SCALE, P)[0] == SCALE


def test_reputation_abnormal_is_strictly_below_tau() -> None:
    assert abnormal_count((299_999, 300_000, 300_001), P) == 1


def test_reputation_untrusted_threshold_is_strict() -> None:
    assert is_untrusted(399_999, P)
    assert not is_untrusted(400_000, P)


def test_reputation_gamma_one_third_needs_two_abnormal_in_five() -> None:
    params = ReputationParams(gamma_num=1, gamma_den=3)
    assert not punished(1, params)  # 1/5 = 0.2 < 1/3
    assert punished(2, params)  # 2/5 = 0.4 > 1/3
    # D = 7·1 + 2·3 = 13; 0.4·0.5 + 6/13·0.1 = 0.2 + 0.0461538… → 246153
    assert update(500_000, (100_000,), 100_000, params)[0] == 246_153


def test_reputation_out_of_range_credibility_raises() -> None:
    with pytest.raises(ValueError):
        update(500_000, (), SCALE + 1, P)


def test_reputation_params_reject_weights_not_summing_to_scale() -> None:
    with pytest.raises(ValueError):
        ReputationParams(alpha=500_000, beta=600_000)


def test_reputation_documented_examples() -> None:
    assert update(500_000, (), 900_000, P)[0] == 740_000
    assert update(500_000, (100_000,), 100_000, P)[0] == 235_294
    assert update(500_000, (), 100_000, P) == (260_000, (100_000,))


def test_reputation_trajectory_counts_epochs_until_untrusted() -> None:
    trace = trajectory([0] * 4, start=SCALE, window=(SCALE,) * 5)
    assert epochs_until_untrusted(trace) == 2
    assert epochs_until_untrusted(trajectory([SCALE] * 9)) is None


def _register_compute(chain: Chain, label: str) -> str:
    key, evm = seeded_key(label), seeded_evm_key(label)
    node = key.verify_key.encode().hex()
    body = RegisterNode(
        address_of(evm), sign_registration(evm, node), "compute", "m", (0,), "http://x", 1
    )
    assert chain.block([chain.tx(body, key)])[0].code == 0
    return node


@settings(max_examples=5, deadline=None)
@given(st.lists(st.integers(0, SCALE), min_size=1, max_size=7))
def test_reputation_chain_and_calibration_agree(credibilities: list[int]) -> None:
    """The committee's applied R per epoch (every validator reporting the same C) equals the
    calibration's `trajectory` of the same credibilities."""
    chain = Chain()
    node = _register_compute(chain, "agree")
    applied = []
    for epoch, credibility in enumerate(credibilities, start=1):
        chain.advance_to(5 * epoch)
        chain.block(scores={i: {node: credibility} for i in range(4)})
        reps = json.loads(query(chain.state, "/reputations", b"")[1])["reputations"]
        applied.append(reps[node]["r"])
    assert applied == trajectory(credibilities, chain.state.genesis.reputation)
