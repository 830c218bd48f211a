"""The ZK-checked operation: our own PyTorch module, built from a prepared model's weights.

The operation is the start of shard `shard`'s first decoder layer L, for one position:

    x [1, H]  →  input_layernorm_L(x) = x · rsqrt(mean(x²) + eps) · g    (RMSNorm, g [H])
              →  q_proj_L rows [64·head, 64·head + 64) applied to it       (one attention head's
                                                                             query, [1, 64])

so its input is exactly what the shard receives. SmolLM2-135M: H = 576, 9 query heads of 64.
ezkl compiles the ONNX export of `NormSliceOp` into a fixed-point circuit (node/verifier/zk/
build.py); the weights are baked into the circuit, and the circuit's identity is the digest of
the weights, the dimensions and `OP_VERSION` (`OpSpec.digest`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from node.model.family import load_config
from node.model.manifest import Manifest, manifest_path, verify_file
from node.model.shard_config import ShardConfig
from protocol.eip712 import as_bytes32
from protocol.errors import UsageError

OP_VERSION = "norm-qslice-v1"  # bump when NormSliceOp's computation changes
HEAD_WIDTH = 64


class NormSliceOp(nn.Module):
    """RMSNorm (weight `norm_weight` [H], epsilon `eps`) then `rows` [W, H] as a bias-free linear
    map: [1, H] float32 → [1, W] float32. Same arithmetic as Llama's RMSNorm + nn.Linear."""

    def __init__(self, norm_weight: torch.Tensor, rows: torch.Tensor, eps: float) -> None:
        super().__init__()
        if norm_weight.dim() != 1 or rows.dim() != 2 or rows.shape[1] != norm_weight.shape[0]:
            raise UsageError(
                f"norm weight [H] and rows [W, H] expected, got {list(norm_weight.shape)} "
                f"and {list(rows.shape)}"
            )
        self.norm_weight = nn.Parameter(norm_weight.to(torch.float32), requires_grad=False)
        self.rows = nn.Parameter(rows.to(torch.float32).contiguous(), requires_grad=False)
        self.eps = float(eps)

    @property
    def hidden_size(self) -> int:
        return int(self.norm_weight.shape[0])

    @property
    def width(self) -> int:
        return int(self.rows.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [1, H] → [1, W]
        variance = x.pow(2).mean(-1, keepdim=True)  # [1, 1]
        normed = x * torch.rsqrt(variance + self.eps) * self.norm_weight  # [1, H]
        return nn.functional.linear(normed, self.rows)  # [1, W]


@dataclass(frozen=True)
class OpSpec:
    """Which operation of which model: the adapter contract is configured with
    (`manifest_hash`, `shard`), and `digest` names the circuit in the build cache."""

    manifest_hash: bytes  # bytes32: the manifest's model_hash
    shard: int
    layer: int
    head: int
    hidden_size: int
    width: int
    weights_sha256: str  # of the fp32 norm weight ‖ rows ‖ eps

    @property
    def digest(self) -> str:
        text = (
            f"{OP_VERSION}|{self.manifest_hash.hex()}|{self.shard}|{self.layer}|{self.head}|"
            f"{self.hidden_size}|{self.width}|{self.weights_sha256}"
        )
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def load_op(
    manifest: str | Path, shard: int = 1, head: int = 0, width: int = HEAD_WIDTH
) -> tuple[NormSliceOp, OpSpec]:
    """The operation at the start of `shard` of a prepared fp32 model (its file hash-checked).
    `width` < 64 keeps only the head's first `width` query rows: a smaller circuit of the same
    computation (bench/zk.py --quick); the product's circuit is the whole head."""
    from safetensors import safe_open

    path = manifest_path(manifest)
    parsed = Manifest.load(path)
    entry = parsed.shard(shard)
    if entry.quant != "none":
        raise UsageError(
            f"shard {shard} is {entry.quant}-quantized; the ZK circuit is built from fp32 weights",
            hint="prepare the model with --quant none",
        )
    # config.json as JSON (ShardConfig); transformers' AutoConfig (torch._dynamo, ~2.3 CPU-s)
    # only for a config ShardConfig does not model
    config = ShardConfig.load(path.parent) or load_config(path.parent)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if head_dim != HEAD_WIDTH:
        raise UsageError(f"the ZK op needs {HEAD_WIDTH}-wide heads, the model has {head_dim}")
    if not 0 <= head < heads:
        raise UsageError(f"head {head} outside [0, {heads})")
    if not 1 <= width <= HEAD_WIDTH:
        raise UsageError(f"width {width} outside [1, {HEAD_WIDTH}]")
    file = path.parent / entry.file
    verify_file(file, entry.hash)
    layer = entry.layers[0]
    with safe_open(str(file), "pt") as tensors:
        norm = tensors.get_tensor(f"model.layers.{layer}.input_layernorm.weight")
        q_proj = tensors.get_tensor(f"model.layers.{layer}.self_attn.q_proj.weight")
    rows = q_proj[HEAD_WIDTH * head : HEAD_WIDTH * head + width]
    op = NormSliceOp(norm, rows, float(config.rms_norm_eps)).eval()
    digest = hashlib.sha256()
    digest.update(op.norm_weight.detach().numpy().tobytes())
    digest.update(op.rows.detach().numpy().tobytes())
    digest.update(repr(op.eps).encode())
    spec = OpSpec(
        manifest_hash=as_bytes32(parsed.model_hash, "model_hash"),
        shard=shard,
        layer=layer,
        head=head,
        hidden_size=op.hidden_size,
        width=op.width,
        weights_sha256=digest.hexdigest(),
    )
    return op, spec
