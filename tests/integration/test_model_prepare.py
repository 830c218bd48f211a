"""The real SmolLM2-135M-Instruct: `planet model prepare` end to end, distributed greedy decoding
against monolithic `generate`, and hash-verified int8/int4 shards with their perplexity.

Uses the default fp32 cache under $PLANET_HOME (the one-time GGUF conversion, ~45 s, happens
here on a fresh machine); prepared outputs go to a temporary directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from node.model.evaluate import heldout_text, perplexity
from node.model.head import ClientHead
from node.model.manifest import Manifest, verify_directory
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.model.source import ensure_default_fp32
from node.procs import run_captured

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = [{"role": "user", "content": "Write a short poem about the sea and the wind."}]
STEPS = 20


@pytest.fixture(scope="module")
def fp32_dir() -> Path:
    return ensure_default_fp32()


@pytest.fixture(scope="module")
def fp32_manifest(tmp_path_factory: pytest.TempPathFactory, fp32_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "3p-none"
    result = run_captured(
        [sys.executable, "-m", "planet", "model", "prepare", "--parts", "3",
         "--quant", "none", "--out", str(out), "--json"],
        text=True, timeout=300, env={**os.environ}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert [s["layers"] for s in body["shards"]] == [[0, 10], [10, 20], [20, 30]]
    return Path(body["manifest"])


@pytest.fixture(scope="module")
def ppl_fp32(fp32_manifest: Path) -> float:
    head = ClientHead.load(fp32_manifest, device="cpu")
    shards = [ShardModel.load(fp32_manifest, k, device="cpu") for k in range(3)]
    return perplexity(head, shards, heldout_text())


def _greedy(head: ClientHead, shards: list[ShardModel], ids: list[int]) -> list[int]:
    caches = [s.new_cache() for s in shards]
    hidden = head.embed(ids)
    for shard, cache in zip(shards, caches, strict=True):
        hidden = shard.forward(hidden, torch.arange(len(ids)), cache)
    tokens = [int(head.logits(hidden).argmax())]
    while len(tokens) < STEPS and tokens[-1] not in head.eos_token_ids:
        hidden = head.embed([tokens[-1]])
        position = torch.tensor([len(ids) + len(tokens) - 1])
        for shard, cache in zip(shards, caches, strict=True):
            hidden = shard.forward(hidden, position, cache)
        tokens.append(int(head.logits(hidden).argmax()))
    return tokens


def test_model_prepare_three_fp32_shards_greedy_equals_generate(fp32_dir, fp32_manifest) -> None:
    from transformers import AutoModelForCausalLM

    head = ClientHead.load(fp32_manifest, device="cpu")
    shards = [ShardModel.load(fp32_manifest, k, device="cpu") for k in range(3)]
    ids = head.chat_ids(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(str(fp32_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False)[
            0, len(ids) :
        ].tolist()
    assert len(expected) == STEPS  # the prompt asks for more than 20 tokens
    assert _greedy(head, shards, ids) == expected


@pytest.mark.parametrize(
    ("quant", "max_size_ratio", "max_ppl_ratio"), [("int8", 0.30, 1.02), ("int4", 0.18, 1.10)]
)
def test_model_prepare_quantized_shards_hash_verified_small_and_accurate(
    tmp_path: Path,
    fp32_manifest: Path,
    ppl_fp32: float,
    quant: str,
    max_size_ratio: float,
    max_ppl_ratio: float,
) -> None:
    path = prepare("default", parts=3, quant=quant, out=tmp_path / quant, progress=lambda _: None)
    manifest = Manifest.load(path)
    verify_directory(manifest, path.parent)  # every hash re-derived from the files
    fp32 = Manifest.load(fp32_manifest)
    assert [s.quant for s in manifest.shards] == [quant] * 3
    assert manifest.client_hash == fp32.client_hash  # the client side is never quantized
    for shard, base in zip(manifest.shards, fp32.shards, strict=True):
        assert shard.size / base.size <= max_size_ratio
    text = heldout_text()
    head = ClientHead.load(path, device="cpu")
    ppl_q = perplexity(head, [ShardModel.load(path, k, device="cpu") for k in range(3)], text)
    assert ppl_q / ppl_fp32 <= max_ppl_ratio
