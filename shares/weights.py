"""Share weights: how much one node's served work counts, from the operation rates of the seed.

Operation rates (seed, "Share Weighting"):

    MatMul 5 · Softmax 2 · LayerNorm (RMSNorm) 1 · activation (GELU/SiLU) 1 · verification 1

Unit of compute work: one **layer-token**, one token passed through one decoder layer. A
Llama-family decoder layer (Llama, SmolLM2, Mistral, Qwen2: pre-norm attention + SwiGLU MLP)
costs, per token:

    7 MatMul      the weight projections q, k, v, o (attention) and gate, up, down (MLP)
    1 Softmax     the attention of that token over its context; the two context products
                  (scores QKᵀ and the weighted sum of V) are folded into it because their size
                  depends on the context length, which the chain does not record
    2 LayerNorm   the two RMSNorms (before attention, before the MLP)
    1 activation  the SiLU of the gate (the gate·up product and the residual adds are not counted)

    = 7·5 + 1·2 + 2·1 + 1·1 = 40 shares per layer-token (`SHARES_PER_LAYER_TOKEN`)

so a node that ran `layers` decoder layers over `tokens` tokens (prompt and generated tokens
alike) earns `layers · tokens · 40` base shares. The seed quotes its rates "per 12-layer batch";
counting per layer instead multiplies every compute share by the same constant, which cancels in
the split of the compute pool (verifiers are paid from their own pool, `shares.payouts`), so no
payout depends on that choice. The final norm and the LM head of the last shard, and the
embedding lookup of the first, are not counted (they are not decoder layers).

Verification: 1 share per spot check a verifier completed (`VERIFICATION_WEIGHT`).

Scarcity bonus (seed, "Self-Balancing Incentives"), from the pool's health in the epoch. The count
is the number of distinct nodes that were routable on that shard (same model, same shard id) at
any time in the epoch, supplied by the caller (the committee chain's registry):

    routable nodes on the shard   multiplier
    1                             5×  (critical scarcity)
    2                             2×  (< 3 nodes)
    3 or more                     1×

A count of 0 for a shard someone served is contradictory input (`PoolHealthError`).

Pure and deterministic: integers only; imports only the standard library, `shares.errors` and
`protocol.fields`.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.fields import is_int
from shares.errors import CountError, PoolHealthError

MATMUL_WEIGHT = 5
SOFTMAX_WEIGHT = 2
NORM_WEIGHT = 1
ACTIVATION_WEIGHT = 1
VERIFICATION_WEIGHT = 1

MAX_LAYERS = (1 << 16) - 1
MAX_COUNT = (1 << 63) - 1

SCARCITY_CRITICAL_MULTIPLIER = 5
SCARCITY_MULTIPLIER = 2
SCARCITY_THRESHOLD = 3  # fewer routable nodes than this earn the bonus


def check_int(value: object, field: str, lo: int, hi: int) -> int:
    """`value` if it is an integer (not a bool) in [lo, hi], else `CountError`."""
    if not is_int(value, lo, hi):
        raise CountError(field, value, lo, hi)
    return value


@dataclass(frozen=True, slots=True)
class LayerOperations:
    """Operations one token costs in one decoder layer, by type."""

    matmul: int
    softmax: int
    norm: int
    activation: int

    def __post_init__(self) -> None:
        for name in ("matmul", "softmax", "norm", "activation"):
            check_int(getattr(self, name), name, 0, 1 << 16)

    def shares(self) -> int:
        """Weighted shares of one layer-token."""
        return (
            self.matmul * MATMUL_WEIGHT
            + self.softmax * SOFTMAX_WEIGHT
            + self.norm * NORM_WEIGHT
            + self.activation * ACTIVATION_WEIGHT
        )


LLAMA_DECODER_LAYER = LayerOperations(matmul=7, softmax=1, norm=2, activation=1)
SHARES_PER_LAYER_TOKEN = LLAMA_DECODER_LAYER.shares()  # 40


def scarcity_multiplier(routable_nodes: int) -> int:
    """The scarcity bonus of a shard with `routable_nodes` routable nodes in the epoch."""
    if isinstance(routable_nodes, bool) or not isinstance(routable_nodes, int):
        raise CountError("routable_nodes", routable_nodes, 1, MAX_COUNT)
    if routable_nodes < 1:
        raise PoolHealthError("routable_nodes", f"a served shard has {routable_nodes} nodes")
    if routable_nodes == 1:
        return SCARCITY_CRITICAL_MULTIPLIER
    if routable_nodes < SCARCITY_THRESHOLD:
        return SCARCITY_MULTIPLIER
    return 1


def compute_shares(layers: int, tokens: int, routable_nodes: int) -> int:
    """Shares of `tokens` tokens through `layers` decoder layers of a shard with
    `routable_nodes` routable nodes: `layers · tokens · 40 · scarcity_multiplier`."""
    check_int(layers, "layers", 1, MAX_LAYERS)
    check_int(tokens, "tokens", 0, MAX_COUNT)
    return layers * tokens * SHARES_PER_LAYER_TOKEN * scarcity_multiplier(routable_nodes)


def verification_shares(spot_checks: int) -> int:
    """Shares of `spot_checks` completed spot checks."""
    return check_int(spot_checks, "spot_checks", 0, MAX_COUNT) * VERIFICATION_WEIGHT
