"""int8 shards on the CPU fast path.

- The default, the int8 kernel (`Int8Linear`): every output row is bitwise the same whatever
  schedule served it — one prefill, a prefill then one position per forward, prefill chunks, a
  decode step batched with other sessions — so a node's served steps equal the verifiers'
  one-prefill recomputation and replay exactly (node/verifier/calibration.json, int8).
- The opt-out (`PLANET_INT8_KERNEL=0`), without torchao: node/model/int8_file.py de-quantizes
  an int8 shard file to exactly torchao's fp32 weights (every weight `torch.equal`, on int8
  shards made by our `prepare` and on the cached SmolLM2 int8 shards), and such a shard
  computes bitwise what the hf path computes over a prefill, decode steps and a rewind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.model.int8_file import dequantized_int8_state
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.model.quant import dequantize_int8
from node.model.shard import ShardModel, build_layers, read_safetensors
from node.model.shard_config import ShardConfig
from protocol.errors import ConfigError
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.unit

CACHED = Path.home() / ".cache" / "planet" / "models" / "smollm2-135m-3p-int8" / "manifest.json"


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_int8(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"int8-fast-{request.param}")
    make_tiny_model(root / "src", model_type=request.param, layers=4, hidden=64, tied=False)
    return prepare(root / "src", parts=2, quant="int8", out=root / "q", progress=lambda _: None)


def _manifests(tiny_int8: Path) -> list[Path]:
    return [tiny_int8, *([CACHED] if CACHED.is_file() else [])]


def _torchao_weights(manifest: Path, shard_id: int) -> dict[str, torch.Tensor]:
    """What `load_into(..., runtime="dequantized")` gave through torchao before."""
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    entry = Manifest.load(manifest).shard(shard_id)
    tensors, metadata = read_safetensors(manifest.parent / entry.file)
    state, leftover = unflatten_tensor_state_dict(tensors, metadata)
    assert not leftover
    root = build_layers(ShardConfig.load(manifest.parent), *entry.layers, path="fast")
    root.load_state_dict(state, strict=True, assign=True)
    dequantize_int8(root)
    return {k: v.detach() for k, v in root.state_dict().items()}


def test_our_dequantized_weights_are_torchaos(tiny_int8: Path) -> None:
    for manifest in _manifests(tiny_int8):
        for shard in Manifest.load(manifest).shards:
            tensors, metadata = read_safetensors(manifest.parent / shard.file)
            ours = dequantized_int8_state(tensors, metadata)
            theirs = _torchao_weights(manifest, shard.shard_id)
            assert ours.keys() == theirs.keys()
            for key, weight in theirs.items():
                assert ours[key].dtype == torch.float32
                assert torch.equal(ours[key], weight), (manifest, key)


def test_the_kernel_reads_torchaos_int8_rows_and_scales(tiny_int8: Path) -> None:
    """`load_int8_kernel` (no torchao) gives each `Int8Linear` exactly torchao's `Int8Tensor`
    qdata and row scales, for every quantized Linear of every shard."""
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    for manifest in _manifests(tiny_int8):
        for entry in Manifest.load(manifest).shards:
            shard = ShardModel.load(manifest, entry.shard_id, device="cpu", int8_kernel=True)
            tensors, metadata = read_safetensors(manifest.parent / entry.file)
            state, _ = unflatten_tensor_state_dict(tensors, metadata)
            packed = {
                name: module
                for name, module in shard.module.named_modules()
                if type(module).__name__ == "Int8Linear"
            }
            theirs = {k.removesuffix(".weight"): v for k, v in state.items() if hasattr(v, "qdata")}
            assert packed.keys() == theirs.keys() and packed
            for name, module in packed.items():
                assert torch.equal(module.qdata, theirs[name].qdata), (manifest, name)
                assert torch.equal(module.scale, theirs[name].scale.reshape(-1).float())


def test_malformed_int8_files_are_config_errors(tiny_int8: Path) -> None:
    tensors, metadata = read_safetensors(tiny_int8.parent / "shard-0.safetensors")
    name = next(k for k in tensors if k.endswith("._weight_scale"))
    with pytest.raises(ConfigError, match="misses tensor"):
        dequantized_int8_state({k: v for k, v in tensors.items() if k != name}, metadata)
    with pytest.raises(ConfigError, match="unexpected tensors"):
        dequantized_int8_state({**tensors, "extra": torch.zeros(1)}, metadata)
    with pytest.raises(ConfigError, match="fp32 row scales"):
        dequantized_int8_state({**tensors, name: tensors[name].double()}, metadata)
    with pytest.raises(ConfigError, match="tensor_names"):
        dequantized_int8_state(tensors, {k: v for k, v in metadata.items() if k != "tensor_names"})
    weight = name.replace("._weight_scale", ".weight")
    odd = {**metadata, weight: metadata[weight].replace('"block_size": [1,', '"block_size": [2,')}
    with pytest.raises(ConfigError, match="per-row"):
        dequantized_int8_state(tensors, odd)


def _run(shard: ShardModel, prompt: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Prefill, `steps` decode steps, a rewind of 3 and 3 steps again: every output."""
    cache = shard.new_cache()
    outs = [shard.forward(prompt, torch.arange(prompt.shape[1]), cache)]
    for _ in range(steps):
        position = shard.cache_length(cache)
        outs.append(shard.forward(outs[-1][:, -1:], torch.tensor([position]), cache))
    shard.rewind(cache, shard.cache_length(cache) - 3)
    for _ in range(3):
        position = shard.cache_length(cache)
        outs.append(shard.forward(outs[-1][:, -1:] * 0.5, torch.tensor([position]), cache))
    return outs


def test_int8_opted_out_path_is_bitwise_the_hf_path(tiny_int8: Path, monkeypatch) -> None:
    monkeypatch.delenv("PLANET_SHARD_PATH", raising=False)
    monkeypatch.setenv("PLANET_INT8_KERNEL", "0")
    for manifest in _manifests(tiny_int8):
        default = ShardModel.load(manifest, 0, device="cpu")
        hf = ShardModel.load(manifest, 0, device="cpu", path="hf")
        assert (default.path, default.quant, hf.path) == ("fast", "int8", "hf")
        assert "Int8Linear" not in {type(m).__name__ for m in default.module.modules()}
        generator = torch.Generator().manual_seed(5)
        prompt = torch.randn(1, 11, default.hidden_size, generator=generator)
        for step, (ours, theirs) in enumerate(
            zip(_run(default, prompt, 8), _run(hf, prompt, 8), strict=True)
        ):
            assert torch.equal(ours, theirs), (manifest, step)


def _schedules(shard: ShardModel, inputs: torch.Tensor, others: list[torch.Tensor]) -> dict:
    """Shard outputs for `inputs` [1, T, H] under each serving schedule, each from fresh caches:
    one prefill; a prefill of 5 then one position per forward; chunks of 4, 7 and the rest;
    the decode steps in `forward_batch` beside sessions of `others` (their prompts)."""
    total = inputs.shape[1]
    out: dict[str, torch.Tensor] = {}
    out["prefill"] = shard.forward(inputs, torch.arange(total), shard.new_cache())
    cache = shard.new_cache()
    rows = [shard.forward(inputs[:, :5], torch.arange(5), cache)]
    rows += [shard.forward(inputs[:, t : t + 1], torch.tensor([t]), cache) for t in range(5, total)]
    out["decode"] = torch.cat(rows, dim=1)
    cache = shard.new_cache()
    chunks = [(0, 4), (4, 11), (11, total)]
    rows = [shard.forward(inputs[:, a:b], torch.arange(a, b), cache) for a, b in chunks]
    out["chunks"] = torch.cat(rows, dim=1)
    caches = [shard.new_cache() for _ in range(len(others) + 1)]
    rows = [shard.forward(inputs[:, :5], torch.arange(5), caches[0])]
    for other, cache in zip(others, caches[1:], strict=True):
        shard.forward(other, torch.arange(other.shape[1]), cache)
    for t in range(5, total):
        step = torch.cat([inputs[:, t : t + 1], *(o[:, -1:] for o in others)])
        positions = torch.tensor([shard.cache_length(c) for c in caches])
        rows.append(shard.forward_batch(step, positions, caches)[:1])
    out["batched"] = torch.cat(rows, dim=1)
    return out


def test_int8_kernel_rows_do_not_depend_on_the_serving_schedule(
    tiny_int8: Path, monkeypatch
) -> None:
    """What lets the verifiers recompute an int8 node's steps in one prefill (spot checks) and
    replay its sampled answers: the default int8 shard (the kernel) gives every position the same
    bits however it was served. (An fp32 shard does not: torch's fp32 matmul rounds a one-row
    call differently from a many-row one; its fingerprints agree within the fp16 rounding.)"""
    monkeypatch.delenv("PLANET_SHARD_PATH", raising=False)
    monkeypatch.delenv("PLANET_INT8_KERNEL", raising=False)
    generator = torch.Generator().manual_seed(11)
    for manifest in _manifests(tiny_int8):
        shard = ShardModel.load(manifest, 0, device="cpu")
        assert "Int8Linear" in {type(m).__name__ for m in shard.module.modules()}
        width = shard.hidden_size
        inputs = torch.randn(1, 24, width, generator=generator)
        others = [torch.randn(1, n, width, generator=generator) for n in (3, 9)]
        with torch.inference_mode():
            outs = _schedules(shard, inputs, others)
        for name, out in outs.items():
            assert torch.equal(out, outs["prefill"]), (manifest, name)
