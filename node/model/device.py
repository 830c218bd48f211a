"""Which torch device a shard or client head runs on, and the activation dtype there.

CPU is the default path everywhere (CI has no GPU). `"auto"` picks CUDA only when CUDA is
available *and* a small allocation plus a matmul there succeed; anything that fails on the way
(no driver, a broken or busy device, out of memory) falls back to the CPU with one warning, so
`--device auto` never keeps a node from starting. An explicit `"cuda"` that cannot be used is a
`ConfigError` (the operator asked for it by name).
"""

from __future__ import annotations

import logging

import torch

from protocol.errors import ConfigError

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cuda_usable(index: int = 0) -> tuple[bool, str]:
    """(usable, why not): CUDA present, and a tiny bf16 matmul on device `index` works."""
    try:
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        if index >= torch.cuda.device_count():
            return False, f"no CUDA device {index} ({torch.cuda.device_count()} present)"
        probe = torch.ones((8, 8), device=f"cuda:{index}", dtype=torch.bfloat16)
        float((probe @ probe).sum().item())
        return True, ""
    except Exception as error:  # any driver/runtime failure means "not usable"
        return False, f"{type(error).__name__}: {error}"[:200]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """`"auto"` -> cuda when usable else cpu (with a warning naming why); anything else is
    parsed and checked."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        usable, why = cuda_usable()
        if usable:
            return torch.device("cuda")
        if torch.cuda.is_available():  # present but broken: say so, then run on the CPU
            log.warning("CUDA present but not usable (%s); falling back to the CPU", why)
        return torch.device("cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"unknown device {device!r}", hint="use auto, cpu or cuda[:N]") from error
    if parsed.type == "cuda":
        usable, why = cuda_usable(parsed.index or 0)
        if not usable:
            raise ConfigError(
                f"device {device!r} requested but not usable: {why}",
                hint="use --device auto (falls back to the CPU) or cpu",
            )
    return parsed


def activation_dtype_for(
    device: torch.device, requested: str | torch.dtype = "auto"
) -> torch.dtype:
    """Activations inside a shard: float32 on CPU, bfloat16 on CUDA, unless asked otherwise."""
    if isinstance(requested, torch.dtype):
        return requested
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if requested not in _DTYPES:
        raise ConfigError(
            f"unknown activation dtype {requested!r}", hint=f"use auto or one of {sorted(_DTYPES)}"
        )
    return _DTYPES[requested]
