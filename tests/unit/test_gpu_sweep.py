"""bench/gpu_sweep.py runs end to end in --tiny mode on the CPU (the GPU figures need a GPU;
this proves the script a later session runs there works) and prints one BENCHMARKS.md JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_sweep.py"


def test_gpu_sweep_tiny_cpu_prints_one_json_with_the_issue_metrics(capsys):
    spec = importlib.util.spec_from_file_location("gpu_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--tiny", "--device", "cpu", "--sessions", "3", "--repeats", "1"]
    assert module.main([*args, "--new-tokens", "2", "--prompt-tokens", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bench"] == "gpu_sweep"
    assert result["config"]["device"] == "cpu" and result["config"]["shape"] == "tiny"
    assert result["config"]["command"].startswith(".venv/bin/python bench/gpu_sweep.py --tiny")
    metrics = result["metrics"]
    for quant in ("bf16", "int4"):
        assert metrics[f"decode_tok_s_monolithic_{quant}"] > 0
        assert metrics[f"decode_tok_s_pipeline_4_{quant}"] > 0
        assert metrics[f"decode_tok_s_sessions_3_{quant}"] > 0
    assert 0 < metrics["ratio_shard_bytes_int4_vs_bf16"] < 0.5
    assert set(result["targets"]) == {
        "ratio_pipeline_4_vs_monolithic_bf16",
        "ratio_aggregate_3_vs_1_bf16",
        "ratio_shard_bytes_int4_vs_bf16",
    }


def test_gpu_sweep_without_a_gpu_falls_back_to_the_tiny_shape(capsys):
    spec = importlib.util.spec_from_file_location("gpu_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--device", "cpu", "--quants", "bf16", "--sessions", "2", "--repeats", "1"]
    assert module.main([*args, "--new-tokens", "2", "--prompt-tokens", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["shape"] == "tiny" and result["config"]["device"] == "cpu"
    assert result["config"]["fell_back_to_tiny_without_gpu"] is True
    assert result["metrics"]["decode_tok_s_monolithic_bf16"] > 0
