"""`dequantized_int8_state`: an int8 shard file's weights as plain fp32 tensors, without torchao.

An int8 shard file (node/model/quant.py) holds what torchao's `flatten_tensor_state_dict`
writes: for each quantized Linear weight `<module>.weight` the parts `<module>._weight_qdata`
(int8 [N, K]), `<module>._weight_scale` (fp32 [N, 1]) and `<module>._weight_zero_point`
(int8 [N, 1]), and in the safetensors header `tensor_names` (JSON list of the state-dict keys)
plus, under each key, `{"_type": "Int8Tensor", "_data": {"block_size": [1, K], ...},
"_tensor_data_names": [...]}` (plain tensors: `{"_type": "Tensor"}`).

On the CPU a node runs the int8 rows and scales with torch's int8 kernel (`int8_parts`, read by
`node.model.fast.load_int8_kernel`), or, opted out (`PLANET_INT8_KERNEL=0`), the de-quantized
fp32 weights (quant.load_into's "dequantized"). torchao
computes them as `(float(qdata) - float(zero_point)) * scale` in fp32, per row; this does the
same two fp32 operations in the same order, so every weight is bitwise what torchao gives
(tests/unit/test_int8_file.py), without importing torchao (~1.9 s of CPU, and torch._dynamo
with it). Only the per-row layout our `prepare` writes is read; anything else is a `ConfigError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from protocol.errors import ConfigError

INT8_TYPE = "Int8Tensor"
PLAIN_TYPES = frozenset({"Tensor", "torch.Tensor"})


def dequantized_int8_state(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> dict[str, torch.Tensor]:
    """The file's state dict with every `Int8Tensor` weight de-quantized to fp32 (CPU)."""
    plain, quantized = int8_parts(tensors, metadata)
    for name, (qdata, scale, zero) in quantized.items():
        plain[name] = _dequantize(qdata, scale, zero)
    return plain


def int8_parts(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]
) -> tuple[
    dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
]:
    """The file's plain tensors by state-dict key, and for each `Int8Tensor` weight key its
    (qdata int8 [N, K], scale fp32 [N, 1], zero_point int8 [N, 1] or None), checked; what the
    int8 kernel (`node.model.fast.load_int8_kernel`) and the de-quantization read."""
    try:
        names = json.loads(metadata["tensor_names"])
    except (KeyError, ValueError) as error:
        raise ConfigError("int8 shard file lacks its tensor_names header") from error
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError("int8 shard file: tensor_names is not a list of names")
    state: dict[str, torch.Tensor] = {}
    quantized: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
    used: set[str] = set()
    for name in names:
        info = _entry(metadata, name)
        kind = info.get("_type")
        if kind in PLAIN_TYPES:
            if name not in tensors:
                raise ConfigError(f"int8 shard file misses tensor {name!r}")
            state[name] = tensors[name]
            used.add(name)
        elif kind == INT8_TYPE:
            quantized[name] = _parts(name, info, tensors, used)
        else:
            raise ConfigError(f"int8 shard file: {name!r} has unsupported type {kind!r}")
    leftover = sorted(set(tensors) - used)
    if leftover:
        raise ConfigError(f"int8 shard has unexpected tensors: {leftover[:5]}")
    return state, quantized


def _entry(metadata: Mapping[str, str], name: str) -> dict[str, Any]:
    try:
        info = json.loads(metadata[name])
    except (KeyError, ValueError) as error:
        raise ConfigError(f"int8 shard file has no readable header entry for {name!r}") from error
    if not isinstance(info, dict):
        raise ConfigError(f"int8 shard file: header entry of {name!r} is not an object")
    return info


def _parts(
    name: str, info: dict[str, Any], tensors: Mapping[str, torch.Tensor], used: set[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    module, _, attribute = name.rpartition(".")
    prefix = f"{module}._{attribute}_"
    parts = info.get("_tensor_data_names")
    data = info.get("_data")
    if not isinstance(parts, list) or not {"qdata", "scale"} <= set(parts):
        raise ConfigError(f"int8 shard file: {name!r} does not list qdata and scale")
    if not isinstance(data, dict):
        raise ConfigError(f"int8 shard file: {name!r} has no _data")
    found = {}
    for part in parts:
        key = prefix + str(part)
        if key not in tensors:
            raise ConfigError(f"int8 shard file misses tensor {key!r}")
        found[part] = tensors[key]
        used.add(key)
    qdata, scale = found["qdata"], found["scale"]
    zero = found.get("zero_point")
    if qdata.dtype != torch.int8 or qdata.dim() != 2:
        raise ConfigError(f"int8 shard file: {prefix}qdata is not a 2-d int8 tensor")
    rows, columns = qdata.shape
    if data.get("block_size") != [1, columns] or data.get("act_quant_kwargs") is not None:
        raise ConfigError(
            f"int8 shard file: {name!r} is not per-row weight-only int8 "
            f"(block_size {data.get('block_size')!r})"
        )
    if scale.dtype != torch.float32 or scale.numel() != rows:
        raise ConfigError(f"int8 shard file: {prefix}scale is not {rows} fp32 row scales")
    if zero is not None and (zero.dtype != torch.int8 or zero.numel() != rows):
        raise ConfigError(f"int8 shard file: {prefix}zero_point is not {rows} int8 values")
    return qdata, scale, zero


def _dequantize(
    qdata: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None
) -> torch.Tensor:
    rows = qdata.shape[0]
    weight = qdata.to(torch.float32, copy=True)
    if zero is not None:
        weight = weight - zero.reshape(rows, 1).to(torch.float32)
    return (weight * scale.reshape(rows, 1)).contiguous()
