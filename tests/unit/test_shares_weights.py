"""Share weights: the per-layer-token rule, the scarcity bonus and their rejections."""

from __future__ import annotations

import pytest

from protocol.errors import ProtocolError
from shares.errors import CountError, PoolHealthError
from shares.weights import (
    LLAMA_DECODER_LAYER,
    SHARES_PER_LAYER_TOKEN,
    LayerOperations,
    compute_shares,
    scarcity_multiplier,
    verification_shares,
)

pytestmark = pytest.mark.unit


def test_llama_layer_is_seven_matmuls_one_softmax_two_norms_one_activation() -> None:
    assert LayerOperations(matmul=7, softmax=1, norm=2, activation=1) == LLAMA_DECODER_LAYER
    # 7·5 + 1·2 + 2·1 + 1·1
    assert SHARES_PER_LAYER_TOKEN == 40


def test_layer_operations_weigh_by_the_seed_rates() -> None:
    # The seed's block example: 12 MatMul + 3 Softmax; 8 GELU; 15 LayerNorm.
    assert LayerOperations(matmul=12, softmax=3, norm=0, activation=0).shares() == 66
    assert LayerOperations(matmul=0, softmax=0, norm=0, activation=8).shares() == 8
    assert LayerOperations(matmul=0, softmax=0, norm=15, activation=0).shares() == 15


@pytest.mark.parametrize(
    ("routable", "multiplier"), [(1, 5), (2, 2), (3, 1), (4, 1), (1_000_000, 1)]
)
def test_scarcity_multiplier_by_routable_nodes(routable: int, multiplier: int) -> None:
    assert scarcity_multiplier(routable) == multiplier


def test_compute_shares_hand_computed() -> None:
    # 3 layers × 10 tokens × 40 shares, then ×1 / ×2 / ×5
    assert compute_shares(layers=3, tokens=10, routable_nodes=5) == 1_200
    assert compute_shares(layers=3, tokens=10, routable_nodes=2) == 2_400
    assert compute_shares(layers=3, tokens=10, routable_nodes=1) == 6_000
    assert compute_shares(layers=30, tokens=0, routable_nodes=1) == 0


def test_verification_shares_one_per_spot_check() -> None:
    assert verification_shares(7) == 7
    assert verification_shares(0) == 0


def test_scarcity_multiplier_zero_routable_nodes_is_pool_health_error() -> None:
    with pytest.raises(PoolHealthError):
        scarcity_multiplier(0)


@pytest.mark.parametrize(
    ("layers", "tokens"),
    [(0, 1), (-1, 1), (1, -1), (1 << 16, 1), (1, 1 << 63), (True, 1), (1.0, 1)],
)
def test_compute_shares_out_of_range_counts_are_count_errors(
    layers: object, tokens: object
) -> None:
    with pytest.raises(CountError) as caught:
        compute_shares(layers, tokens, 3)  # type: ignore[arg-type]
    assert isinstance(caught.value, ProtocolError)


@pytest.mark.parametrize("checks", [-1, 1 << 63, False, "3"])
def test_verification_shares_bad_counts_are_count_errors(checks: object) -> None:
    with pytest.raises(CountError):
        verification_shares(checks)  # type: ignore[arg-type]


def test_scarcity_multiplier_non_integer_is_count_error() -> None:
    with pytest.raises(CountError):
        scarcity_multiplier(True)
