"""Device selection: CPU is the default path; `auto` falls back to the CPU when CUDA is absent
or present but unusable; an explicit unusable `cuda` is a named ConfigError; activations are
float32 on the CPU and bfloat16 on CUDA."""

from __future__ import annotations

import pytest
import torch

from node.model import device as device_module
from node.model.device import activation_dtype_for, resolve_device
from protocol.errors import ConfigError

pytestmark = pytest.mark.unit


def test_auto_without_cuda_is_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_with_broken_cuda_falls_back_to_cpu_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available")

    monkeypatch.setattr(device_module.torch, "ones", broken)
    with caplog.at_level("WARNING"):
        assert resolve_device("auto") == torch.device("cpu")
    assert "falling back to the CPU" in caplog.text and "no kernel image" in caplog.text


def test_explicit_cuda_unusable_is_named_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as refused:
        resolve_device("cuda")
    assert "not usable" in refused.value.message and "auto" in (refused.value.hint or "")


def test_unknown_device_is_config_error():
    with pytest.raises(ConfigError):
        resolve_device("tpu:7")


def test_activation_dtype_float32_on_cpu_bfloat16_on_cuda():
    assert activation_dtype_for(torch.device("cpu")) == torch.float32
    assert activation_dtype_for(torch.device("cuda")) == torch.bfloat16
    assert activation_dtype_for(torch.device("cuda"), "float32") == torch.float32
    with pytest.raises(ConfigError):
        activation_dtype_for(torch.device("cpu"), "int3")


def test_shard_loaded_with_auto_runs_on_cpu_here(tmp_path, monkeypatch):
    from node.model.prepare import prepare
    from node.model.shard import ShardModel
    from tests.doubles.tiny_model import make_tiny_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    make_tiny_model(tmp_path / "src", layers=2, hidden=64)
    manifest = prepare(tmp_path / "src", parts=1, out=tmp_path / "p1", progress=lambda _: None)
    shard = ShardModel.load(manifest, 0, device="auto")
    assert shard.device == torch.device("cpu") and shard.dtype == torch.float32
    out = shard.forward(torch.zeros(1, 2, 64), torch.arange(2), shard.new_cache())
    assert out.shape == (1, 2, 64) and out.dtype == torch.float32
