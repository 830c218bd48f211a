"""The ZK-checked operation's PyTorch module and the ezkl plumbing that needs no ezkl: the
module equals Llama's RMSNorm + a bias-free linear, the circuit's name follows its weights, and
a missing ezkl install is a named error with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.verifier.zk.circuit import NormSliceOp, OpSpec
from node.verifier.zk.engine import EzklMissing, run_step
from protocol.errors import UsageError


def test_norm_slice_op_equals_llama_rmsnorm_then_linear() -> None:
    # here, not at the top: transformers takes seconds to import, and every lane of
    # deploy/test.sh collects this module (issue 41)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(3)
    weight = torch.rand(576, generator=generator) + 0.5
    rows = torch.randn(64, 576, generator=generator) * 0.1
    x = torch.randn(1, 576, generator=generator) * 4
    norm = LlamaRMSNorm(576, eps=1e-5)
    norm.weight = torch.nn.Parameter(weight)
    expected = torch.nn.functional.linear(norm(x), rows)
    got = NormSliceOp(weight, rows, 1e-5)(x)
    assert got.shape == (1, 64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_norm_slice_op_mismatched_shapes_are_refused() -> None:
    with pytest.raises(UsageError, match="expected"):
        NormSliceOp(torch.ones(576), torch.ones(64, 512), 1e-5)


def test_op_spec_digest_names_weights_and_slot() -> None:
    spec = OpSpec(b"\x01" * 32, 1, 10, 0, 576, 64, "ab" * 32)
    assert spec.digest == OpSpec(b"\x01" * 32, 1, 10, 0, 576, 64, "ab" * 32).digest
    others = [
        OpSpec(b"\x01" * 32, 1, 10, 0, 576, 64, "cd" * 32),
        OpSpec(b"\x01" * 32, 1, 10, 1, 576, 64, "ab" * 32),
        OpSpec(b"\x02" * 32, 1, 10, 0, 576, 64, "ab" * 32),
        OpSpec(b"\x01" * 32, 2, 10, 0, 576, 64, "ab" * 32),
    ]
    assert len({spec.digest, *(o.digest for o in others)}) == 5


def test_engine_without_ezkl_venv_fails_with_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANET_EZKL_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(EzklMissing) as missing:
        run_step("witness", {})
    assert "setup.sh" in (missing.value.hint or "")
