"""Weight-only quantization of a shard's Linear layers, and its safetensors round trip.

Two schemes, each a maintained library's format and kernels, chosen by measurement
(FINDINGS.md, and `node.model.evaluate.quant_report` on this repo's held-out text):

- int8: torchao `Int8WeightOnlyConfig` (per-row symmetric int8, `Int8Tensor`). Stored with
  torchao's own `flatten_tensor_state_dict` (tensor data + JSON metadata in the safetensors
  header), bit-exact on reload; torchao's kernels run it on CPU and CUDA.
- int4: hqq 4-bit, group 32 along the input dimension, min-max affine with a float (not
  rounded) zero-point. For the default model this is the grid of its Q4_1 GGUF source, so it
  is lossless up to fp32 rounding (relative weight error ~1e-7) where bitsandbytes nf4 and
  quanto qint4 lose 25-90 % perplexity. hqq's proximal optimisation (`optimize=True`) gave the
  same error on this model at ~8x the preparation time, so it is off. hqq's packed format is
  not a safetensors format, so we store its packed `W_q` (uint8, two weights a byte), scale
  as fp16 and zero as fp32 (an fp16 zero moves every weight by up to 8e-4 here: 0.05 % of
  relative error, enough to flip near-tied greedy tokens) and the rest of hqq's meta in the
  header; loading rebuilds an `HQQLinear` through its own `load_state_dict`.

Norm weights (and any non-Linear tensor) stay fp32. The same code runs on CUDA when the module
is there: both libraries pick their device from the tensors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import torch
from torch import nn

from node.model.int8_file import dequantized_int8_state
from protocol.errors import ConfigError

log = logging.getLogger(__name__)

QUANT_NONE, QUANT_INT8, QUANT_INT4 = "none", "int8", "int4"
QUANTS: tuple[str, ...] = (QUANT_NONE, QUANT_INT8, QUANT_INT4)
INT4_GROUP_SIZE = 32
RUNTIMES: tuple[str, ...] = ("auto", "packed", "dequantized")
_FORMAT_KEY = "planet_quant"
_INT4_LAYERS_KEY = "planet_int4_layers"


def check_quant(quant: str) -> str:
    if quant not in QUANTS:
        raise ConfigError(f"unknown quant {quant!r}", hint=f"use one of: {', '.join(QUANTS)}")
    return quant


def _import_torchao() -> None:
    # torchao registers pytree constants at import and torch logs a deprecation for each
    # (node.model's __init__ quiets that logger too; this keeps quant.py self-contained).
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def _linear_names(root: nn.Module) -> list[str]:
    return [name for name, module in root.named_modules() if isinstance(module, nn.Linear)]


# ---- quantize in place --------------------------------------------------------------------
def quantize_module(root: nn.Module, quant: str) -> None:
    """Quantize every `nn.Linear` under `root` in place (weights on the module's device)."""
    check_quant(quant)
    if quant == QUANT_INT8:
        _import_torchao()
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(root, Int8WeightOnlyConfig())
    elif quant == QUANT_INT4:
        for name in _linear_names(root):
            linear = root.get_submodule(name)
            _set_submodule(root, name, _hqq_from_linear(linear))


def _hqq_quant_config() -> dict:
    from hqq.core.quantize import BaseQuantizeConfig

    config = BaseQuantizeConfig(nbits=4, group_size=INT4_GROUP_SIZE, axis=1)
    config["weight_quant_params"]["round_zero"] = False  # float zero-point: the GGUF's grid
    config["weight_quant_params"]["optimize"] = False  # min-max: same error here, 8x faster
    return config


def _hqq_from_linear(linear: nn.Linear) -> nn.Module:
    from hqq.core.quantize import HQQLinear

    if linear.in_features % INT4_GROUP_SIZE:
        raise ConfigError(
            f"int4 needs in_features divisible by {INT4_GROUP_SIZE}, got {linear.in_features}"
        )
    weight = linear.weight.detach()
    layer = HQQLinear(
        linear,
        _hqq_quant_config(),
        del_orig=True,
        compute_dtype=torch.float32,
        device=str(weight.device),
    )
    # The file stores the scale as fp16; round it now so the layer in memory is exactly what
    # a node will load.
    layer.meta["scale"] = layer.meta["scale"].to(torch.float16).to(layer.meta["scale"].dtype)
    return layer


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


# ---- to safetensors -----------------------------------------------------------------------
def quantized_tensors(
    root: nn.Module, quant: str
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """`(tensors, metadata)` ready for `safetensors.torch.save_file` (all on CPU)."""
    check_quant(quant)
    if quant == QUANT_NONE:
        tensors = {k: v.detach().cpu().contiguous() for k, v in root.state_dict().items()}
        return tensors, {_FORMAT_KEY: QUANT_NONE}
    if quant == QUANT_INT8:
        _import_torchao()
        from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

        state = {k: v.detach().to("cpu") for k, v in root.state_dict().items()}
        tensors, metadata = flatten_tensor_state_dict(state)
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        return tensors, {**metadata, _FORMAT_KEY: QUANT_INT8}
    return _int4_tensors(root)


def _int4_tensors(root: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from hqq.core.quantize import HQQLinear

    tensors: dict[str, torch.Tensor] = {}
    layers: dict[str, dict] = {}
    hqq_names: set[str] = set()
    for name, module in root.named_modules():
        if not isinstance(module, HQQLinear):
            continue
        hqq_names.add(name)
        meta = module.meta
        tensors[f"{name}.W_q"] = module.W_q.detach().cpu().contiguous()
        # fp16 scale + fp32 zero: 6 bytes per 32 weights (fp32 both: 8).
        tensors[f"{name}.scale"] = meta["scale"].detach().cpu().to(torch.float16).contiguous()
        tensors[f"{name}.zero"] = meta["zero"].detach().cpu().to(torch.float32).contiguous()
        if module.bias is not None:
            tensors[f"{name}.bias"] = module.bias.detach().cpu().float().contiguous()
        layers[name] = {
            "shape": list(meta["shape"]),
            "nbits": meta["nbits"],
            "group_size": meta["group_size"],
            "axis": meta["axis"],
            "packing": meta["packing"],
        }
    for key, value in root.state_dict().items():
        owner = key.rpartition(".")[0]
        if owner in hqq_names:
            continue
        tensors[key] = value.detach().cpu().contiguous()
    metadata = {_FORMAT_KEY: QUANT_INT4, _INT4_LAYERS_KEY: json.dumps(layers, sort_keys=True)}
    return tensors, metadata


# ---- from safetensors ---------------------------------------------------------------------
def file_quant(metadata: Mapping[str, str] | None) -> str:
    """The quant a shard file was written with (from its safetensors header)."""
    quant = (metadata or {}).get(_FORMAT_KEY, QUANT_NONE)
    return check_quant(quant)


def load_into(
    root: nn.Module,
    tensors: dict[str, torch.Tensor],
    metadata: Mapping[str, str] | None,
    device: torch.device,
    runtime: str = "auto",
) -> None:
    """Load a shard file's tensors into `root` (built on the meta device or CPU), in place.

    `runtime` (quantized files only): "packed" keeps the library's quantized weights in memory
    (torchao `Int8Tensor`, hqq `HQQLinear`; the library de-quantizes in every forward);
    "dequantized" de-quantizes each weight once at load into a plain fp32 Linear (fp32 memory
    and speed, same values; int8 through node/model/int8_file.py, bitwise torchao's values
    without importing torchao; int4 through hqq); "auto" = packed on CUDA, dequantized on CPU,
    where the per-call de-quantization dominates a decode step (measured on 2 cores, one
    10-layer SmolLM2 shard: hqq int4 packed ~0.4-1.4 s, torchao int8 packed 30-600 ms, fp32
    ~25-80 ms). (`ShardModel.from_file` does not come here for an int8 file on the CPU fast path:
    it reads the int8 rows itself into `node.model.fast.Int8Linear`s, torch's int8 kernel,
    unless `PLANET_INT8_KERNEL=0`.)

    Raises `ConfigError` when keys are missing or unexpected, so a wrong file never runs.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown quant runtime {runtime!r}", hint=f"use {', '.join(RUNTIMES)}")
    dequantize = runtime == "dequantized" or (runtime == "auto" and device.type != "cuda")
    quant = file_quant(metadata)
    if quant == QUANT_NONE:
        state = {k: v.to(device) for k, v in tensors.items()}
    elif quant == QUANT_INT8 and dequantize:  # our reader: torchao's values, without torchao
        state = {
            k: v.to(device) for k, v in dequantized_int8_state(tensors, metadata or {}).items()
        }
    elif quant == QUANT_INT8:
        _import_torchao()
        from torchao.prototype.safetensors.safetensors_support import (
            unflatten_tensor_state_dict,
        )

        state, leftover = unflatten_tensor_state_dict(tensors, dict(metadata or {}))
        if leftover:
            raise ConfigError(f"int8 shard has unexpected tensors: {sorted(leftover)[:5]}")
        state = {k: v.to(device) for k, v in state.items()}
    else:
        rest = _load_int4_layers(root, tensors, metadata or {}, device)
        _assign_plain(root, rest)
        if dequantize:
            dequantize_int4(root)
        return
    try:
        root.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as error:  # strict: missing / unexpected keys or wrong shapes
        raise ConfigError(f"shard file does not fit the model: {error}") from error


def dequantize_int8(root: nn.Module) -> None:
    """Replace every torchao `Int8Tensor` Linear weight under `root` by torchao's de-quantized
    fp32 tensor (the reference node/model/int8_file.py is tested against)."""
    for module in root.modules():
        if isinstance(module, nn.Linear) and hasattr(module.weight, "qdata"):
            weight = module.weight.dequantize(torch.float32)  # (qdata - zero_point) * scale
            module.weight = nn.Parameter(weight.contiguous(), requires_grad=False)


def dequantize_int4(root: nn.Module) -> None:
    """Replace every `HQQLinear` under `root` by a plain Linear holding hqq's de-quantized
    weight (in the layer's compute dtype, on its device)."""
    from hqq.core.quantize import HQQLinear

    for name, module in list(root.named_modules()):
        if not isinstance(module, HQQLinear):
            continue
        weight = module.dequantize()  # [out, in], hqq's own unpack + (W_q - zero) * scale
        linear = nn.Linear(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            device="meta",
        )
        linear.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        if module.bias is not None:
            linear.bias = nn.Parameter(module.bias.detach().clone(), requires_grad=False)
        _set_submodule(root, name, linear)


def _assign_plain(root: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Assign plain tensors (norm weights) to the modules that are not `HQQLinear`; every
    such parameter must be present exactly once."""
    from hqq.core.quantize import HQQLinear

    expected: set[str] = set()
    for name, module in root.named_modules():
        if isinstance(module, HQQLinear):
            continue
        for param_name, _ in module.named_parameters(recurse=False):
            expected.add(f"{name}.{param_name}" if name else param_name)
    missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or unexpected:
        raise ConfigError(
            f"int4 shard file does not fit the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    for key, value in state.items():
        owner, _, param_name = key.rpartition(".")
        module = root.get_submodule(owner) if owner else root
        current = getattr(module, param_name)
        if tuple(current.shape) != tuple(value.shape):
            raise ConfigError(f"{key}: shape {tuple(value.shape)} != {tuple(current.shape)}")
        setattr(module, param_name, nn.Parameter(value, requires_grad=False))


def _load_int4_layers(
    root: nn.Module,
    tensors: dict[str, torch.Tensor],
    metadata: Mapping[str, str],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Swap each recorded Linear for an `HQQLinear` loaded from its packed tensors; return the
    remaining (plain) tensors."""
    from hqq.core.quantize import HQQLinear

    try:
        layers: dict[str, dict] = json.loads(metadata[_INT4_LAYERS_KEY])
    except (KeyError, json.JSONDecodeError) as error:
        raise ConfigError("int4 shard file lacks its layer table") from error
    rest = dict(tensors)
    for name, info in layers.items():
        try:
            packed = rest.pop(f"{name}.W_q")
            scale = rest.pop(f"{name}.scale")
            zero = rest.pop(f"{name}.zero")
        except KeyError as error:
            raise ConfigError(f"int4 shard file misses tensor {error.args[0]}") from error
        bias = rest.pop(f"{name}.bias", None)
        layer = HQQLinear(
            None,
            _hqq_quant_config(),
            compute_dtype=torch.float32,
            device=str(device),
            initialize=False,
        )
        state: dict[str, object] = {
            "W_q": packed.to(device),
            "scale": scale,
            "zero": zero,
            "shape": torch.Size(info["shape"]),
            "nbits": info["nbits"],
            "group_size": info["group_size"],
            "axis": info["axis"],
            "packing": info["packing"],
            "channel_wise": True,
            "optimize": False,
            "round_zero": False,
            "view_as_float": False,
            "quant_scale": False,
            "quant_zero": False,
            "offload_meta": False,
            "stores_quant_config": True,
        }
        if bias is not None:
            state["bias"] = bias
        layer.load_state_dict(state)  # hqq casts scale/zero to compute_dtype, moves to device
        try:
            _set_submodule(root, name, layer)
        except AttributeError as error:
            raise ConfigError(f"int4 shard names an unknown layer {name!r}") from error
    return {k: v.to(device) for k, v in rest.items()}
