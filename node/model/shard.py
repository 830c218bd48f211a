"""A compute node's part of the model: decoder layers [start, end) and nothing else.

`ShardModel` builds only its own layers (keeping their original `layer_idx`) plus the model's
rotary embedding, loads the shard file (checking its hash against the manifest first), and runs
them one of two ways (`path`):
- "fast" (the default on CPU for full-attention Llama/Qwen2 shards, node/model/fast.py):
  our own decoder step over the same weights with a static, pooled per-session KV cache,
  bitwise what the hf path computes on the same fp32 weights. Its config is a `ShardConfig`
  (config.json read as JSON, node/model/shard_config.py), so a fast-path node never imports
  transformers. An int8 shard keeps its int8 weights and multiplies with torch's packed int8
  kernel (`Int8Linear`, bf16 activations); the verifiers' reference loads the same way, and the
  kernel's rows do not depend on how many rows a call carries, so a served step and a one-prefill
  recomputation agree as the calibration requires (docs/compute.md, "int8 kernel").
  `PLANET_INT8_KERNEL=0` opts out: the weights are de-quantized to fp32 at load
  (node/model/int8_file.py, torchao's values without torchao), bitwise the hf path's;
- "hf" (the default elsewhere, and selectable with `path="hf"` or `PLANET_SHARD_PATH=hf`):
  transformers' decoder layers with a per-session `DynamicCache`, on transformers' config
  (`node.model.family.load_config`; also for any rope type other than the default).
transformers 5.23 specifics the hf path handles:
positions travel as `position_ids` only (no `cache_position`); each layer gets
`position_embeddings=(cos, sin)` from `rotary_emb`; a decoder layer returns a Tensor; the
causal mask is sized with `layer_idx=<first layer of the shard>` because the shard's cache has
empty slots below it (without that, chunked prefill silently goes wrong under sdpa).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from node.model.batched import decode_step_batched, supports_batched_decode
from node.model.device import activation_dtype_for, resolve_device
from node.model.family import family_for, layer_types, load_config
from node.model.fast import (
    FastDecoder,
    Int8Linear,
    StaticKV,
    fast_supported,
    load_int8_kernel,
)
from node.model.layers import decoder_layer as fast_decoder_layer
from node.model.manifest import CONFIG_FILE, Manifest, manifest_path, verify_file
from node.model.quant import QUANT_INT8, QUANT_NONE, file_quant, load_into, quantize_module
from node.model.shard_config import ShardConfig
from protocol.errors import ConfigError, ProtocolError

log = logging.getLogger(__name__)

ACTIVATION_DTYPE = torch.float32  # what forward() returns (and takes) at its boundary
PATHS: tuple[str, ...] = ("auto", "fast", "hf")
PATH_ENV = "PLANET_SHARD_PATH"  # overrides path="auto" (bench and comparison runs)


def resolve_path(path: str, config: Any, layers: tuple[int, int], device: torch.device) -> str:
    """The path to run, "fast" or "hf". "auto": the `PLANET_SHARD_PATH` environment variable
    if set, else fast on CPU when every layer is full attention, else hf. An explicit "fast"
    on layers it cannot run is a `ConfigError`."""
    if path not in PATHS:
        raise ConfigError(f"unknown shard path {path!r}", hint=f"use one of: {', '.join(PATHS)}")
    if path == "auto":
        chosen = os.environ.get(PATH_ENV, "").strip().lower()
        if chosen and chosen not in PATHS:
            raise ConfigError(f"{PATH_ENV}={chosen!r} is not a shard path", hint="use fast or hf")
        path = chosen or "auto"
    types = layer_types(config)[layers[0] : layers[1]]
    full = all(kind == "full_attention" for kind in types)
    if path == "auto":
        return "fast" if device.type == "cpu" and full else "hf"
    if path == "fast" and not full:
        raise ConfigError("the fast shard path runs full-attention layers only", hint="use hf")
    return path


INT8_KERNEL_ENV = "PLANET_INT8_KERNEL"  # "0": int8 shards de-quantized to fp32 on CPU


def int8_kernel_enabled() -> bool:
    """Whether an int8 shard on the CPU fast path keeps its int8 weights (torch's packed int8
    kernel, `Int8Linear`): yes unless `PLANET_INT8_KERNEL=0` (then its weights are de-quantized
    to fp32 at load, bitwise the hf path; an int8 node spot-checked by the verifiers' kernel
    reference should not run that way). Any other value than unset, "0" or "1" is a
    `ConfigError`."""
    value = os.environ.get(INT8_KERNEL_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(
            f"{INT8_KERNEL_ENV}={value!r} is not 0 or 1",
            hint=f"unset it (the int8 kernel) or set {INT8_KERNEL_ENV}=0 (de-quantized fp32)",
        )
    return value != "0"


def layer_key_prefix(index: int) -> str:
    """State-dict prefix of decoder layer `index` (the same keys as in the full model)."""
    return f"model.layers.{index}."


def build_layers(
    config: Any, start: int, end: int, *, device: torch.device | str = "meta", path: str = "hf"
) -> nn.Module:
    """An (uninitialised) module whose state-dict keys are `model.layers.<i>.*` for i in
    [start, end), each layer built with its original `layer_idx`: transformers' decoder layers
    (`path="hf"`) or the fast path's weight containers (node/model/layers.py, same keys)."""
    make = fast_decoder_layer if path == "fast" else family_for(config).decoder_layer
    root = nn.Module()
    root.model = nn.Module()
    with torch.device(device):
        root.model.layers = nn.ModuleDict({str(i): make(config, i) for i in range(start, end)})
    return root


class ShardModel:
    """Decoder layers [start, end) of one model, ready for prefill and decode steps."""

    def __init__(
        self,
        config: Any,
        layers: tuple[int, int],
        root: nn.Module,
        device: torch.device,
        quant: str = QUANT_NONE,
        activation_dtype: str | torch.dtype = "auto",
        path: str = "auto",
    ) -> None:
        start, end = layers
        if not 0 <= start < end <= config.num_hidden_layers:
            raise ConfigError(
                f"layers [{start}, {end}) outside the model's {config.num_hidden_layers}"
            )
        self.config = config
        self.layers = (start, end)
        self.device = device
        self.quant = quant
        # activations inside the shard: float32 on CPU, bfloat16 on CUDA ("auto")
        self.dtype = activation_dtype_for(device, activation_dtype)
        self.hidden_size: int = config.hidden_size
        self._root = root.eval()
        if self.dtype != torch.float32:
            _cast_plain_floats(self._root, self.dtype)
        self._modules = [root.model.layers[str(i)] for i in range(start, end)]
        self.path = resolve_path(path, config, self.layers, device)
        self._rotary: Any = None  # the hf path's rotary embedding (transformers' modeling)
        if self.path == "hf":
            self._rotary = family_for(config).rotary(config=config).to(device).eval()
        types = layer_types(config)
        self._types = [types[i] for i in range(start, end)]
        self.batched_decode = supports_batched_decode(self._modules, self._types)
        # For each attention type, the first of our layers with it: sizes that type's mask.
        self._mask_layer: dict[str, int] = {}
        for i in range(start, end):
            self._mask_layer.setdefault(types[i], i)
        self._fast: FastDecoder | None = None
        if self.path == "fast":
            if not fast_supported(self._modules, self._types):
                raise ConfigError("these layers are not Llama/Qwen2 decoder layers", hint="hf")
            self._fast = FastDecoder(config, end - start, device, self.dtype)
            self._fast.rowwise = any(isinstance(m, Int8Linear) for m in root.modules())

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        manifest: str | Path,
        shard_id: int,
        device: str | torch.device = "auto",
        *,
        verify: bool = True,
        runtime: str = "auto",
        activation_dtype: str = "auto",
        path: str = "auto",
        int8_kernel: bool | None = None,
    ) -> ShardModel:
        """Load shard `shard_id` of a prepared model; the file's hash is checked first
        (`IntegrityError` naming both hashes). `runtime`: see `quant.load_into`; `path`: see
        `resolve_path`; `int8_kernel`: see `from_file`."""
        where = manifest_path(manifest)
        parsed = Manifest.load(where)
        entry = parsed.shard(shard_id)
        directory = where.parent
        shard_file = directory / entry.file
        if verify:
            verify_file(shard_file, entry.hash)
        target = resolve_device(device)
        config = _config_for(directory, entry.layers, target, path)
        if config.num_hidden_layers != parsed.total_layers:
            raise ConfigError(
                f"{directory / CONFIG_FILE} has {config.num_hidden_layers} layers, "
                f"the manifest {parsed.total_layers}"
            )
        return cls.from_file(
            config,
            entry.layers,
            shard_file,
            device=target,
            runtime=runtime,
            activation_dtype=activation_dtype,
            path=path,
            int8_kernel=int8_kernel,
        )

    @classmethod
    def from_file(
        cls,
        config: Any,
        layers: tuple[int, int],
        shard_file: Path,
        device: str | torch.device = "auto",
        runtime: str = "auto",
        activation_dtype: str = "auto",
        path: str = "auto",
        int8_kernel: bool | None = None,
    ) -> ShardModel:
        """Load a shard file (no hash check) for layers [start, end). An int8 file on the CPU
        fast path (`runtime="auto"`) stays int8 in memory and runs torch's int8 kernel unless
        `int8_kernel` is False (None: `int8_kernel_enabled()`, the environment); elsewhere on
        CPU it is de-quantized to fp32 at load. `config`:
        transformers' or a `ShardConfig` (replaced by transformers' if the hf path is chosen)."""
        target = resolve_device(device)
        tensors, metadata = read_safetensors(shard_file)
        quant = file_quant(metadata)
        _check_keys_in_range(tensors, layers, shard_file)
        chosen = resolve_path(path, config, layers, target)
        if chosen == "hf" and isinstance(config, ShardConfig):
            config = load_config(config.directory)  # transformers' layers take its config
        root = build_layers(config, *layers, device="meta", path=chosen)
        # An int8 file on the CPU fast path stays int8 (the kernel: what nodes serve and the
        # verifiers' reference recomputes, node/verifier/calibration.json) unless
        # `int8_kernel` is False (None: `PLANET_INT8_KERNEL`); then it runs its de-quantized
        # fp32 weights, bitwise what the hf path computes (tests/unit/test_int8_fast.py).
        if int8_kernel is None:
            int8_kernel = int8_kernel_enabled()
            if not int8_kernel and quant == QUANT_INT8 and target.type == "cpu":
                log.warning(
                    "%s=0: int8 shard %s runs de-quantized fp32 weights; the verifiers' int8 "
                    "reference runs the int8 kernel, so this node's spot checks fail",
                    INT8_KERNEL_ENV,
                    shard_file.name,
                )
        keep_int8 = quant == QUANT_INT8 and runtime == "auto" and target.type == "cpu"
        keep_int8 = keep_int8 and chosen == "fast" and int8_kernel
        if keep_int8:  # the file's int8 rows into `Int8Linear`s, without torchao
            load_int8_kernel(root, tensors, metadata, target)
        else:
            load_into(root, tensors, metadata, target, runtime=runtime)
        return cls(config, layers, root, target, quant, activation_dtype, chosen)

    @classmethod
    def from_state_dict(
        cls,
        config: Any,
        layers: tuple[int, int],
        state: Mapping[str, torch.Tensor],
        device: str | torch.device = "auto",
        quant: str = QUANT_NONE,
        activation_dtype: str = "auto",
        path: str = "auto",
    ) -> ShardModel:
        """Build from full-model weights (keys `model.layers.<i>.*`), quantizing if asked."""
        target = resolve_device(device)
        start, end = layers
        own = {
            key: value
            for key, value in state.items()
            if _layer_of(key) is not None and start <= _layer_of(key) < end  # type: ignore[operator]
        }
        chosen = resolve_path(path, config, layers, target)
        if chosen == "hf" and isinstance(config, ShardConfig):
            config = load_config(config.directory)  # transformers' layers take its config
        root = build_layers(config, start, end, device="meta", path=chosen)
        try:
            root.load_state_dict(
                {k: v.detach().to(target, torch.float32) for k, v in own.items()},
                strict=True,
                assign=True,
            )
        except RuntimeError as error:
            raise ConfigError(f"weights do not fit layers [{start}, {end}): {error}") from error
        quantize_module(root, quant)
        return cls(config, layers, root, target, quant, activation_dtype, chosen)

    @property
    def full_attention(self) -> bool:
        """Every one of our layers attends to all earlier positions (no sliding window)."""
        return all(kind == "full_attention" for kind in self._types)

    @property
    def module(self) -> nn.Module:
        """The layers' container (state-dict keys as in the full model)."""
        return self._root

    # ---- running -----------------------------------------------------------------------
    def new_cache(self) -> Any:
        """A fresh per-session KV cache: a pooled `StaticKV` slot on the fast path, a
        transformers `DynamicCache` on the hf path."""
        if self._fast is not None:
            return self._fast.new_cache()
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """Run our layers on `hidden` [1, T, H] at absolute `positions` [T] (int64), appending
        to `cache`; returns [1, T, H] float32 on CPU."""
        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != self.hidden_size:
            raise ProtocolError(
                f"hidden must be [1, T, {self.hidden_size}], got {list(hidden.shape)}"
            )
        if positions.dim() != 1 or positions.shape[0] != hidden.shape[1]:
            raise ProtocolError(
                f"positions must be [T={hidden.shape[1]}], got {list(positions.shape)}"
            )
        hidden = hidden.to(self.device, self.dtype)
        if self._fast is not None:
            start = _contiguous_start(positions, cache)
            out = self._fast.forward(self._modules, hidden, start, cache)
            return out.to("cpu", ACTIVATION_DTYPE)
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        position_ids = positions.to(self.device, torch.long).unsqueeze(0)  # [1, T]
        cos_sin = self._rotary(hidden, position_ids)
        masks: dict[str, Any] = {}
        for kind, first in self._mask_layer.items():
            build = (
                create_sliding_window_causal_mask
                if kind == "sliding_attention"
                else create_causal_mask
            )
            masks[kind] = build(
                config=self.config,
                inputs_embeds=hidden,
                attention_mask=None,
                past_key_values=cache,
                position_ids=position_ids,
                layer_idx=first,
            )
        for layer, kind in zip(self._modules, self._types, strict=True):
            hidden = layer(
                hidden,
                attention_mask=masks[kind],
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                position_embeddings=cos_sin,
            )
        return hidden.to("cpu", ACTIVATION_DTYPE)

    __call__ = forward

    @torch.inference_mode()
    def forward_batch(
        self, hidden: torch.Tensor, positions: torch.Tensor, caches: list[Any]
    ) -> torch.Tensor:
        """One decode step of B sessions at once: hidden [B, 1, H], positions [B] (each
        session's next position), one cache per session → [B, 1, H] float32 CPU. Batched in
        one forward where the layers allow it (node/model/batched.py), else one by one."""
        batch = hidden.shape[0]
        if hidden.dim() != 3 or hidden.shape[1] != 1 or hidden.shape[2] != self.hidden_size:
            raise ProtocolError(
                f"hidden must be [B, 1, {self.hidden_size}], got {list(hidden.shape)}"
            )
        if positions.shape != (batch,) or len(caches) != batch:
            raise ProtocolError("one position and one cache per session")
        if self._fast is not None and batch > 1:
            starts = [_contiguous_start(positions[b : b + 1], c) for b, c in enumerate(caches)]
            out = self._fast.forward_batch(
                self._modules, hidden.to(self.device, self.dtype), starts, caches
            )
            return out.to("cpu", ACTIVATION_DTYPE)
        if batch == 1 or not self.batched_decode:
            rows = [
                self.forward(hidden[b : b + 1], positions[b : b + 1], caches[b])
                for b in range(batch)
            ]
            return torch.cat(rows)
        out = decode_step_batched(
            self._modules,
            self._rotary,
            hidden.to(self.device, self.dtype),
            positions.to(self.device, torch.long),
            caches,
        )
        return out.to("cpu", ACTIVATION_DTYPE)

    def rewind(self, cache: Any, length: int) -> None:
        """Drop every cached position >= `length` (speculative decoding: the positions the
        client did not accept), so the next forward continues at `length`. Only full-attention
        layers can rewind: a sliding-window layer past its window no longer holds what it
        dropped (`ProtocolError`)."""
        held = self.cache_length(cache)
        if not 0 <= length <= held:
            raise ProtocolError(f"cannot rewind to {length}: the cache holds {held} positions")
        if length == held:
            return
        if isinstance(cache, StaticKV):
            cache.length = length  # positions beyond are never read, and overwritten next
            return
        if any(kind != "full_attention" for kind in self._types):
            raise ProtocolError("this shard's sliding-window layers cannot rewind")
        start, end = self.layers
        for index in range(start, end):
            cache.layers[index].crop(length - held)  # negative: positions to remove

    @torch.inference_mode()
    def export_kv(self, cache: Any, start: int, end: int) -> Any:
        """A copy of the keys and values `cache` holds for positions [start, end) of all our
        layers (the prefix cache's block, node/server/prefix_cache.py), whichever path made it;
        `import_kv` appends it to a cache that holds exactly `start` positions."""
        held = self.cache_length(cache)
        if not 0 <= start < end <= held:
            raise ProtocolError(f"cannot export [{start}, {end}): the cache holds {held}")
        if isinstance(cache, StaticKV):
            return (
                cache.keys[:, :, start:end].clone(),
                cache.values[:, :, start:end].clone(),
            )
        first, last = self.layers
        return tuple(
            (
                cache.layers[i].keys[:, :, start:end].clone(),
                cache.layers[i].values[:, :, start:end].clone(),
            )
            for i in range(first, last)
        )

    @torch.inference_mode()  # a cache grown by a forward holds inference tensors
    def import_kv(self, cache: Any, block: Any) -> None:
        """Append a block `export_kv` made (on this shard, same path) to `cache`: the cache
        then holds those positions as if it had computed them."""
        if isinstance(cache, StaticKV):
            if self._fast is None:
                raise ProtocolError("a fast-path cache on an hf-path shard")
            keys, values = block
            start, count = cache.length, int(keys.shape[2])
            self._fast.reserve(cache, start + count)
            cache.keys[:, :, start : start + count] = keys
            cache.values[:, :, start : start + count] = values
            cache.length = start + count
            return
        for index, (keys, values) in zip(range(*self.layers), block, strict=True):
            cache.update(keys, values, index)

    def cache_kv(self, cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [1, kv_heads, length, head_dim] that `cache` holds for model layer
        `layer` (one of ours), whichever path made it (tests and inspection)."""
        if isinstance(cache, StaticKV):
            index = layer - self.layers[0]
            return (
                cache.keys[index, :, : cache.length].unsqueeze(0),
                cache.values[index, :, : cache.length].unsqueeze(0),
            )
        return cache.layers[layer].keys, cache.layers[layer].values

    def cache_bytes_per_position(self) -> int:
        """KV bytes one position costs in a session's cache (keys and values, all our layers)."""
        config = self.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * (self.layers[1] - self.layers[0]) * kv_heads * head_dim * element

    def cache_length(self, cache: Any) -> int:
        """Tokens held in `cache` for our layers."""
        if isinstance(cache, StaticKV):
            return cache.length
        return int(cache.get_seq_length(self.layers[0]))

    def parameter_bytes(self) -> int:
        """Bytes of weights held in memory (packed sizes for quantized layers)."""
        total = 0
        for tensor in list(self._root.parameters()) + list(self._root.buffers()):
            total += _tensor_bytes(tensor)
        for module in self._root.modules():  # hqq keeps scale/zero in a plain dict
            meta = getattr(module, "meta", None)
            if isinstance(meta, dict):
                total += sum(_tensor_bytes(v) for v in meta.values() if torch.is_tensor(v))
        return total


def cache_bytes(cache: Any) -> int:
    """Memory a session's KV cache holds, in bytes (for a `StaticKV`: of the positions it
    holds, not of its preallocated capacity, so that admission accounts per position)."""
    if isinstance(cache, StaticKV):
        layers, kv_heads, _, head_dim = cache.keys.shape
        return 2 * layers * kv_heads * cache.length * head_dim * cache.keys.element_size()
    total = 0
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


def _config_for(directory: Path, layers: tuple[int, int], device: torch.device, path: str) -> Any:
    """The model's config: a `ShardConfig` (config.json read as JSON, no transformers) when
    it models this config and the shard runs on the fast path, else transformers' config."""
    config = ShardConfig.load(directory)
    if config is not None and resolve_path(path, config, layers, device) == "fast":
        return config
    return load_config(directory)


def _contiguous_start(positions: torch.Tensor, cache: StaticKV) -> int:
    """The first of `positions`, which must continue `cache` exactly (`ProtocolError`)."""
    if not isinstance(cache, StaticKV):
        raise ProtocolError("this cache does not belong to a fast-path shard")
    steps = int(positions.shape[0])
    start = int(positions[0])
    if start != cache.length or (steps > 1 and int(positions[-1]) != start + steps - 1):
        raise ProtocolError(
            f"positions must continue the cache at {cache.length}, got {start}..+{steps}"
        )
    return start


def _cast_plain_floats(root: nn.Module, dtype: torch.dtype) -> None:
    """Cast plain float parameters and buffers (not packed quantized tensors) to `dtype`."""
    for module in root.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if type(param.data) is torch.Tensor and param.is_floating_point():
                module._parameters[name] = nn.Parameter(param.data.to(dtype), requires_grad=False)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if type(buffer) is torch.Tensor and buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors (CPU) and the header metadata of a safetensors file."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except FileNotFoundError as error:
        raise ConfigError(f"missing shard file {path}") from error
    except Exception as error:  # safetensors raises its own SafetensorError for bad bytes
        raise ConfigError(f"{path} is not a readable safetensors file: {error}") from error
    return tensors, metadata


def _layer_of(key: str) -> int | None:
    parts = key.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2])
    return None


def _check_keys_in_range(
    tensors: Mapping[str, torch.Tensor], layers: tuple[int, int], path: Path
) -> None:
    start, end = layers
    for key in tensors:
        index = _layer_of(key)
        if index is None or not start <= index < end:
            raise ConfigError(f"{path}: tensor {key!r} is not part of layers [{start}, {end})")


def _tensor_bytes(tensor: torch.Tensor) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:  # a torchao wrapper subclass (any version): count its packed parts
        inner, _ = flatten()
        return sum(
            _tensor_bytes(getattr(tensor, name))
            for name in inner
            if getattr(tensor, name, None) is not None
        )
    return tensor.numel() * tensor.element_size()
