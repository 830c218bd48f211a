"""Which torch device a shard or client head runs on."""

from __future__ import annotations

import torch

from protocol.errors import ConfigError


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """`"auto"` -> cuda when available else cpu; anything else is parsed and checked."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"unknown device {device!r}", hint="use auto, cpu or cuda[:N]") from error
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {device!r} requested but CUDA is not available",
            hint="use --device auto or cpu",
        )
    return parsed
