"""The fast shard forward: our own Llama/Qwen2 decoder step over a static, pooled KV cache.

`ShardModel` runs this path by default on CPU (`path="fast"`; `path="hf"` keeps transformers'
decoder layers with a `DynamicCache`, for comparison). It computes what transformers' layers
compute (RMSNorm in fp32, rotary on q/k, grouped-query sdpa attention, SwiGLU MLP, the same
Linear weights read from the same modules) without their per-call machinery: no mask objects,
no cache classes, no keyword plumbing. Its outputs are bitwise the hf path's on the same fp32
weights (fp32 shards and int8 shards opted out of the kernel: tests/unit/test_int8_fast.py,
tests/unit/test_fast_shard.py). It reads its config values from a `ShardConfig`
(node/model/shard_config.py) or transformers' config alike.

KV cache (`StaticKV`): one preallocated tensor per session for keys and one for values, shape
[layers, kv_heads, capacity, head_dim]; a step writes its positions in place and attends to
`[:length]`. Capacity is a multiple of `BLOCK` positions and doubles when a prefill needs more
(the only allocation after the first). Buffers of a dropped session return to the shard's pool
(`weakref.finalize`; at most `POOL_SLOTS` kept, none larger than `POOL_MAX_CAPACITY`
positions) and the next session reuses them: it starts at length 0 and never reads beyond
what it wrote, so nothing leaks between sessions.

int8 shards (the CPU default; `PLANET_INT8_KERNEL=0` runs de-quantized fp32 weights instead):
each Linear keeps the file's int8 rows and fp32 per-row scales (`Int8Linear`, loaded by
`load_int8_kernel` without torchao) and multiplies with torch's packed int8 kernel
`torch._weight_int8pack_mm` (bf16 activations in, bf16 out; the fp32 per-row scale applied
afterwards). Measured on this machine's 2 cores (docs/compute.md): the fp32 activation variant
of that kernel is ~10x slower than fp32 `F.linear` and de-quantizing per call ~50x, so bf16
activations it is. The kernel computes each row alike however many rows a call carries; with
attention one query row per call (`FastDecoder.rowwise`, computed by `fixed_order_attention`
in an order that does not depend on torch's thread count) every position of an int8 shard gets
the same bits in a prefill, a chunk, a decode step or a batched step, at 1 thread or several,
which is what lets the verifiers recompute and replay an int8 node exactly
(docs/verification.md).

Supported: full-attention layers of the families in node/model/family.py; anything else
(sliding window) stays on the hf path (`fast_supported`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from node.model.int8_file import int8_parts
from protocol.errors import ConfigError

BLOCK = 256  # cache capacity grows in multiples of this many positions
POOL_SLOTS = 8  # freed session buffers kept for reuse, per shard
POOL_MAX_CAPACITY = 4 * BLOCK  # larger (grown) buffers are freed, not kept idle
COMPILE_ENV = "PLANET_SHARD_COMPILE"  # "1": torch.compile the one-position decode step


def compile_requested() -> bool:
    """Opt-in: compiling costs ~2 minutes on the first decode step of every process (measured
    on 2 shared cores), far too slow for node start in tests; see docs/compute.md."""
    return os.environ.get(COMPILE_ENV, "").strip() == "1"


class Int8Linear(nn.Module):
    """A Linear whose weight stays int8 (per-row symmetric, torchao's `Int8Tensor` layout)."""

    def __init__(self, qdata: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = int(qdata.shape[1])
        self.out_features = int(qdata.shape[0])
        # A fresh (64-byte aligned) copy: the kernel crashes on rows read straight from a
        # safetensors buffer at an unaligned offset.
        self.register_buffer("qdata", qdata.clone(memory_format=torch.contiguous_format))
        self.register_buffer("scale", scale.reshape(-1).float().contiguous())  # [out] fp32
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self._ones = torch.ones(self.out_features, dtype=torch.bfloat16, device=qdata.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(rows, self.qdata, self._ones).float() * self.scale
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)


def load_int8_kernel(
    root: nn.Module,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None,
    device: torch.device,
) -> int:
    """Load an int8 shard file into `root` (built on the meta device) without torchao: every
    symmetric per-row int8 Linear weight becomes an `Int8Linear` over the file's rows and scales
    (torchao's `Int8Tensor` qdata and scale, bit for bit), an asymmetric one its de-quantized
    fp32 weight, the rest as stored. Returns how many Linears run the kernel; keys missing or
    left over are a `ConfigError` (a wrong file never runs)."""
    plain, quantized = int8_parts(tensors, metadata or {})
    state = {key: value.to(device) for key, value in plain.items()}
    owned: set[str] = set()
    for name, (qdata, scale, zero) in quantized.items():
        module_name = name.removesuffix(".weight")
        try:
            module = root.get_submodule(module_name)
        except AttributeError as error:
            raise ConfigError(f"shard file does not fit the model: no module {name!r}") from error
        if not isinstance(module, nn.Linear) or name == module_name:
            raise ConfigError(f"shard file does not fit the model: {name!r} is not a Linear weight")
        if zero is not None and bool(torch.any(zero != 0)):
            state[name] = ((qdata.float() - zero.float()) * scale).to(device)
            continue
        bias = state.pop(f"{module_name}.bias", None)
        packed = Int8Linear(qdata.to(device), scale.to(device), bias)
        parent_name, _, child = module_name.rpartition(".")
        setattr(root.get_submodule(parent_name) if parent_name else root, child, packed)
        owned.update(f"{module_name}.{buffer}" for buffer in ("qdata", "scale", "bias"))
    try:
        missing, unexpected = root.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as error:  # wrong shapes
        raise ConfigError(f"shard file does not fit the model: {error}") from error
    missing = [key for key in missing if key not in owned]
    if missing or unexpected:
        raise ConfigError(
            f"shard file does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return sum(isinstance(module, Int8Linear) for module in root.modules())


def fast_supported(modules: Sequence[nn.Module], types: Sequence[str]) -> bool:
    """True if every layer is a full-attention Llama/Qwen2-style decoder layer."""
    if any(kind != "full_attention" for kind in types):
        return False
    for layer in modules:
        attn = getattr(layer, "self_attn", None)
        mlp = getattr(layer, "mlp", None)
        if attn is None or mlp is None or getattr(attn, "sliding_window", None):
            return False
        if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return False
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return False
    return True


class Rotary:
    """cos/sin tables for absolute positions, as transformers' rotary embedding computes them
    (fp32 frequencies × position, then cos/sin, times the rope type's attention scaling)."""

    def __init__(self, config: Any, device: torch.device) -> None:
        params = getattr(config, "rope_parameters", None) or {}
        rope_type = params.get("rope_type", "default")
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        if rope_type == "default":
            base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
            inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            scaling = 1.0
        else:  # llama3 / yarn / ...: transformers' own initialiser (config only, no modeling)
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float)
        self.scaling = float(scaling)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """positions [B, T] int64 → cos, sin [B, 1, T, head_dim] in `dtype`."""
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scaling).to(dtype).unsqueeze(1)
        sin = (emb.sin() * self.scaling).to(dtype).unsqueeze(1)
        return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


class StaticKV:
    """One session's KV cache on a fast shard (opaque to callers: use the shard's methods)."""

    __slots__ = ("__weakref__", "holder", "keys", "length", "values")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys  # [layers, kv_heads, capacity, head_dim]
        self.values = values
        self.length = 0
        # What the pool gets back when the session is dropped (its finalizer holds this list,
        # never the cache itself); updated when the buffers grow.
        self.holder = [(keys, values)]

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[2])


class _Pool:
    """Freed cache buffers of one shard, reused by later sessions (most recent first)."""

    def __init__(self) -> None:
        self.free: list[tuple[torch.Tensor, torch.Tensor]] = []

    def give(self, buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not buffers or len(self.free) >= POOL_SLOTS:
            return
        if buffers[0][0].shape[2] <= POOL_MAX_CAPACITY:
            self.free.append(buffers[0])


class FastDecoder:
    """Runs a shard's decoder layers (the modules' own weights) over `StaticKV` caches."""

    def __init__(self, config: Any, n_layers: int, device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        heads = config.num_attention_heads
        self.heads = heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.scaling = self.head_dim**-0.5
        self.n_layers = n_layers
        self.rotary = Rotary(config, device)
        self._pool = _Pool()
        self._compiled: Callable[..., torch.Tensor] | None = None
        self.compile = compile_requested()
        # One query row per attention call, in a prefill as in a decode step (see `_attend`):
        # set for int8-kernel shards, whose bf16 casts turn the last-bit differences between a
        # causal prefill and a one-row step into fingerprint mismatches. fp32 shards keep the
        # one-call prefill (bitwise the hf path).
        self.rowwise = False

    # ---- caches ------------------------------------------------------------------------
    def _alloc(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.n_layers, self.kv_heads, capacity, self.head_dim)
        return (
            torch.empty(shape, dtype=self.dtype, device=self.device),
            torch.empty(shape, dtype=self.dtype, device=self.device),
        )

    def new_cache(self) -> StaticKV:
        """A session slot: pooled buffers if any are free, else a fresh `BLOCK` positions."""
        keys, values = self._pool.free.pop() if self._pool.free else self._alloc(BLOCK)
        cache = StaticKV(keys, values)
        weakref.finalize(cache, self._pool.give, cache.holder)
        return cache

    def reserve(self, cache: StaticKV, needed: int) -> None:
        """Grow `cache` (keeping what it holds) to hold at least `needed` positions."""
        if needed <= cache.capacity:
            return
        capacity = cache.capacity
        while capacity < needed:
            capacity *= 2
        keys, values = self._alloc(capacity)
        held = cache.length
        keys[:, :, :held] = cache.keys[:, :, :held]
        values[:, :, :held] = cache.values[:, :, :held]
        cache.keys, cache.values = keys, values
        cache.holder[0] = (keys, values)

    def cache_bytes(self, cache: StaticKV) -> int:
        """Bytes of the positions the session holds (what admission accounts per position)."""
        element = cache.keys.element_size()
        return 2 * self.n_layers * self.kv_heads * cache.length * self.head_dim * element

    # ---- one session: prefill or decode --------------------------------------------------
    def forward(
        self, modules: Sequence[nn.Module], hidden: torch.Tensor, start: int, cache: StaticKV
    ) -> torch.Tensor:
        """hidden [1, T, H] at positions start..start+T-1, with `cache` holding exactly
        `start` positions → [1, T, H]; the cache then holds start+T. With `compile`, a
        one-position step runs `torch.compile`d (dynamic shapes: one graph for every start
        and capacity; compiled on the first such step)."""
        if self.compile and hidden.shape[1] == 1:
            self.reserve(cache, start + 1)
            if self._compiled is None:
                self._compiled = torch.compile(self._step, dynamic=True)
            return self._compiled(list(modules), hidden, start, cache)
        return self._step(modules, hidden, start, cache)

    def _step(
        self, modules: Sequence[nn.Module], hidden: torch.Tensor, start: int, cache: StaticKV
    ) -> torch.Tensor:
        steps = hidden.shape[1]
        end = start + steps
        self.reserve(cache, end)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        cos, sin = self.rotary(positions, hidden.dtype)
        mask = None
        if steps > 1 and start > 0:  # causal over the cached prefix plus the new rows
            mask = torch.ones(steps, end, dtype=torch.bool, device=self.device).tril(start)
        causal = steps > 1 and start == 0
        for index, layer in enumerate(modules):
            attn = layer.self_attn
            residual = hidden
            x = _rms_norm(layer.input_layernorm, hidden)
            q = attn.q_proj(x).view(1, steps, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, steps, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.keys[index, :, start:end] = k[0]
            cache.values[index, :, start:end] = v[0]
            if self.rowwise:
                rows = [
                    self._attend(q[:, :, t : t + 1], cache, index, start + t + 1)
                    for t in range(steps)
                ]
                out = rows[0] if steps == 1 else torch.cat(rows, dim=2)
            else:
                out = F.scaled_dot_product_attention(
                    q,
                    cache.keys[index, :, :end].unsqueeze(0),
                    cache.values[index, :, :end].unsqueeze(0),
                    attn_mask=mask,
                    is_causal=causal,
                    scale=self.scaling,
                    enable_gqa=self.heads != self.kv_heads,
                )
            hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(1, steps, -1))
            hidden = hidden + _mlp(layer.mlp, _rms_norm(layer.post_attention_layernorm, hidden))
        cache.length = end
        return hidden

    def _attend(self, q: torch.Tensor, cache: StaticKV, index: int, length: int) -> torch.Tensor:
        """Attention of ONE query row q [1, heads, 1, head_dim] (a fresh contiguous copy, so its
        strides never depend on the call) to the first `length` cached positions of layer
        `index`: the same call for a row of a prefill, of a chunk, of a decode step or of a
        batched step, so each row's output does not depend on the schedule it was served in.
        Computed by `fixed_order_attention`, not sdpa: torch's CPU flash attention gives a query
        row other last bits at 2 threads than at 1, so an honest node and a verifier running
        different thread counts disagreed (docs/verification.md, Limits)."""
        return fixed_order_attention(
            q, cache.keys[index, :, :length], cache.values[index, :, :length], self.scaling
        )

    # ---- B sessions, one new position each ------------------------------------------------
    def forward_batch(
        self,
        modules: Sequence[nn.Module],
        hidden: torch.Tensor,
        starts: Sequence[int],
        caches: Sequence[StaticKV],
    ) -> torch.Tensor:
        """hidden [B, 1, H]; session b at position starts[b] with caches[b] holding exactly
        starts[b] positions → [B, 1, H]. Projections and MLP run on all rows at once (the
        weights are read once); attention runs per session on its own cache."""
        batch = hidden.shape[0]
        for cache, start in zip(caches, starts, strict=True):
            self.reserve(cache, start + 1)
        positions = torch.tensor(list(starts), device=self.device).view(batch, 1)
        cos, sin = self.rotary(positions, hidden.dtype)
        gqa = self.heads != self.kv_heads
        for index, layer in enumerate(modules):
            attn = layer.self_attn
            residual = hidden
            x = _rms_norm(layer.input_layernorm, hidden)
            q = attn.q_proj(x).view(batch, 1, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(batch, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(batch, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            outs = []
            for b, (cache, start) in enumerate(zip(caches, starts, strict=True)):
                cache.keys[index, :, start : start + 1] = k[b]
                cache.values[index, :, start : start + 1] = v[b]
                if self.rowwise:
                    outs.append(self._attend(q[b : b + 1], cache, index, start + 1))
                    continue
                outs.append(
                    F.scaled_dot_product_attention(
                        q[b : b + 1],
                        cache.keys[index, :, : start + 1].unsqueeze(0),
                        cache.values[index, :, : start + 1].unsqueeze(0),
                        scale=self.scaling,
                        enable_gqa=gqa,
                    )
                )
            attended = torch.cat(outs).transpose(1, 2).reshape(batch, 1, -1)
            hidden = residual + attn.o_proj(attended)
            hidden = hidden + _mlp(layer.mlp, _rms_norm(layer.post_attention_layernorm, hidden))
        for cache, start in zip(caches, starts, strict=True):
            cache.length = start + 1
        return hidden


def fixed_order_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of one query row q [1, heads, 1, head_dim] to keys, values [kv_heads, L,
    head_dim] (grouped: heads is a multiple of kv_heads) → [1, heads, 1, head_dim], in an order
    that does not depend on torch's thread count: every reduction (q·k over head_dim, softmax
    over L, p·v over L) runs over the innermost dimension of a freshly allocated contiguous
    tensor, which torch reduces the same way in one thread or split across several by output
    (tests/unit/test_fixed_attention.py checks 1, 2 and 4 threads bitwise)."""
    heads, dim = q.shape[1], q.shape[3]
    kv_heads = keys.shape[0]
    grouped = q.reshape(kv_heads, heads // kv_heads, 1, dim)  # [kv, group, 1, D]
    scores = (grouped * keys.unsqueeze(1)).sum(-1) * scale  # [kv, group, L]
    weights = torch.softmax(scores, dim=-1)
    out = (weights.unsqueeze(-2) * values.transpose(-1, -2).unsqueeze(1)).sum(-1)  # [kv, group, D]
    return out.reshape(1, heads, 1, dim)


def _mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
