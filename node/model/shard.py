"""A compute node's part of the model: decoder layers [start, end) and nothing else.

`ShardModel` builds only its own layers (keeping their original `layer_idx`) plus the model's
rotary embedding, loads the shard file (checking its hash against the manifest first), and runs
them with a per-session transformers `DynamicCache`. transformers 5.23 specifics it handles:
positions travel as `position_ids` only (no `cache_position`); each layer gets
`position_embeddings=(cos, sin)` from `rotary_emb`; a decoder layer returns a Tensor; the
causal mask is sized with `layer_idx=<first layer of the shard>` because the shard's cache has
empty slots below it (without that, chunked prefill silently goes wrong under sdpa).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from node.model.batched import decode_step_batched, supports_batched_decode
from node.model.device import activation_dtype_for, resolve_device
from node.model.family import family_for, layer_types, load_config
from node.model.manifest import CONFIG_FILE, Manifest, manifest_path, verify_file
from node.model.quant import QUANT_NONE, file_quant, load_into, quantize_module
from protocol.errors import ConfigError, ProtocolError

log = logging.getLogger(__name__)

ACTIVATION_DTYPE = torch.float32  # what forward() returns (and takes) at its boundary


def layer_key_prefix(index: int) -> str:
    """State-dict prefix of decoder layer `index` (the same keys as in the full model)."""
    return f"model.layers.{index}."


def build_layers(
    config: Any, start: int, end: int, *, device: torch.device | str = "meta"
) -> nn.Module:
    """An (uninitialised) module whose state-dict keys are `model.layers.<i>.*` for i in
    [start, end), each layer built with its original `layer_idx`."""
    family = family_for(config)
    root = nn.Module()
    root.model = nn.Module()
    with torch.device(device):
        root.model.layers = nn.ModuleDict(
            {str(i): family.decoder_layer(config, i) for i in range(start, end)}
        )
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
        self._rotary = family_for(config).rotary(config=config).to(device).eval()
        types = layer_types(config)
        self._types = [types[i] for i in range(start, end)]
        self.batched_decode = supports_batched_decode(self._modules, self._types)
        # For each attention type, the first of our layers with it: sizes that type's mask.
        self._mask_layer: dict[str, int] = {}
        for i in range(start, end):
            self._mask_layer.setdefault(types[i], i)

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
    ) -> ShardModel:
        """Load shard `shard_id` of a prepared model; the file's hash is checked first
        (`IntegrityError` naming both hashes). `runtime`: see `quant.load_into`."""
        path = manifest_path(manifest)
        parsed = Manifest.load(path)
        entry = parsed.shard(shard_id)
        directory = path.parent
        shard_file = directory / entry.file
        if verify:
            verify_file(shard_file, entry.hash)
        config = load_config(directory)
        if config.num_hidden_layers != parsed.total_layers:
            raise ConfigError(
                f"{directory / CONFIG_FILE} has {config.num_hidden_layers} layers, "
                f"the manifest {parsed.total_layers}"
            )
        return cls.from_file(
            config,
            entry.layers,
            shard_file,
            device=device,
            runtime=runtime,
            activation_dtype=activation_dtype,
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
    ) -> ShardModel:
        """Load a shard file (no hash check) for layers [start, end)."""
        target = resolve_device(device)
        tensors, metadata = read_safetensors(shard_file)
        quant = file_quant(metadata)
        _check_keys_in_range(tensors, layers, shard_file)
        root = build_layers(config, *layers, device="meta")
        load_into(root, tensors, metadata, target, runtime=runtime)
        return cls(config, layers, root, target, quant, activation_dtype)

    @classmethod
    def from_state_dict(
        cls,
        config: Any,
        layers: tuple[int, int],
        state: Mapping[str, torch.Tensor],
        device: str | torch.device = "auto",
        quant: str = QUANT_NONE,
        activation_dtype: str = "auto",
    ) -> ShardModel:
        """Build from full-model weights (keys `model.layers.<i>.*`), quantizing if asked."""
        target = resolve_device(device)
        start, end = layers
        own = {
            key: value
            for key, value in state.items()
            if _layer_of(key) is not None and start <= _layer_of(key) < end  # type: ignore[operator]
        }
        root = build_layers(config, start, end, device="meta")
        try:
            root.load_state_dict(
                {k: v.detach().to(target, torch.float32) for k, v in own.items()},
                strict=True,
                assign=True,
            )
        except RuntimeError as error:
            raise ConfigError(f"weights do not fit layers [{start}, {end}): {error}") from error
        quantize_module(root, quant)
        return cls(config, layers, root, target, quant, activation_dtype)

    @property
    def module(self) -> nn.Module:
        """The layers' container (state-dict keys as in the full model)."""
        return self._root

    # ---- running -----------------------------------------------------------------------
    def new_cache(self) -> Any:
        """A fresh per-session KV cache (a transformers `DynamicCache`)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """Run our layers on `hidden` [1, T, H] at absolute `positions` [T] (int64), appending
        to `cache`; returns [1, T, H] float32 on CPU."""
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        if hidden.dim() != 3 or hidden.shape[0] != 1 or hidden.shape[2] != self.hidden_size:
            raise ProtocolError(
                f"hidden must be [1, T, {self.hidden_size}], got {list(hidden.shape)}"
            )
        if positions.dim() != 1 or positions.shape[0] != hidden.shape[1]:
            raise ProtocolError(
                f"positions must be [T={hidden.shape[1]}], got {list(positions.shape)}"
            )
        hidden = hidden.to(self.device, self.dtype)
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
    """Memory held by a session's KV cache, in bytes."""
    total = 0
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


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
