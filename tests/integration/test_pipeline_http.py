"""Distributed greedy decoding over real node processes (a circuit on loopback: the nodes
forward to each other over WebSockets) equals monolithic transformers `generate`, token for
token, with unquantized shards of the real SmolLM2.

Circuits: 2 and 5 even parts and 3 uneven ones (4/17/9 layers), the session's shared plaintext
circuits (tests/integration/conftest.py: each node with its circuit as --next-hops, as `planet
local up` starts them; the 2-part one may come from test_codec_http, the 3-part one stays for
test_speculation_nodes), and the prepared model cache is reused across runs.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.shard_cache import UNEVEN_SPLIT, prepared_manifest
from node.client.circuit import CircuitClient
from node.client.info import check_circuit, node_infos
from node.client.types import Hop, Timings
from node.model.head import ClientHead
from node.procs import run_captured
from node.server.launcher import (
    NodeProcess,
    free_ports,
    pid_alive,
)

pytestmark = pytest.mark.integration

MAX_NEW_TOKENS = 24
PORTS = (21600, 21700)  # this module's share of the test port range (conftest.py: 21100-21200)

LONG_TEXT = (
    "The river starts as snow high in the mountains. In spring the snow melts, and small "
    "streams run down the rocks, join each other and grow into a fast, cold river. It cuts a "
    "deep valley, turns mills in old villages, and slows down when it reaches the plain, where "
    "farmers use its water for their fields. Near the sea it splits into many arms, builds a "
    "delta of mud and sand, and finally disappears into the salt water. Birds rest in the "
    "delta on their long trips between the north and the south, and fishermen have lived "
    "there for thousands of years. "
) * 3
CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "short": [{"role": "user", "content": "What is the capital of France?"}],
    "long": [{"role": "user", "content": LONG_TEXT + "\nSummarize this text in two sentences."}],
    "multi_turn": [
        {"role": "user", "content": "Give me a name for a black cat."},
        {"role": "assistant", "content": "How about Midnight?"},
        {"role": "user", "content": "Nice. Now one for a white dog, and say why."},
    ],
}
# (id, parts, split): split = layers per shard, handed to node.model.prepare
# (3 even parts run in tests/e2e/test_local_cli.py through `planet local up` and `planet ask`)
CIRCUITS: list[tuple[str, int, list[int] | None]] = [
    ("2p", 2, None),
    ("3p-uneven", 3, list(UNEVEN_SPLIT)),
    ("5p", 5, None),
]


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[list[int], list[int]]]:
    """prompt ids and the greedy continuation from the whole model (transformers generate)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.model.source import resolve_source

    directory = resolve_source("default").directory
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    eos = set(
        model.generation_config.eos_token_id
        if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id]
    )
    out: dict[str, tuple[list[int], list[int]]] = {}
    for name, messages in CONVERSATIONS.items():
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        with torch.inference_mode():
            generated = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False
            )[0, len(ids) :].tolist()
        new: list[int] = []
        for token in generated:
            if token in eos:
                break
            new.append(int(token))
        out[name] = (ids, new)
    return out


# test_speculation_nodes runs on the uneven 3-part circuit next: kept for it (conftest.py)
KEPT = {(3, UNEVEN_SPLIT)}


@pytest.fixture(scope="module", params=CIRCUITS, ids=[c[0] for c in CIRCUITS])
def circuit(request, plain_circuits) -> Iterator[tuple[Path, list[NodeProcess]]]:
    _name, parts, split = request.param
    yield plain_circuits.get(parts, split)
    if (parts, None if split is None else tuple(split)) not in KEPT:
        plain_circuits.release(parts, split)


@pytest.fixture(scope="module")
def heads() -> dict[Path, ClientHead]:
    return {}


def _generate(
    manifest: Path, nodes: list[NodeProcess], head: ClientHead, ids: list[int], codec: str = "raw"
) -> tuple[list[int], Timings]:
    from node.model.manifest import Manifest

    m = Manifest.load(manifest)

    async def run() -> tuple[list[int], Timings]:
        hops = [Hop(url=n.url, shard=n.shard) for n in nodes]
        timings = Timings()
        async with aiohttp.ClientSession() as http:
            await check_circuit(http, hops, m.model_hash, m.total_layers)
            # float32 frames: token-for-token equality with generate is an fp32 property
            # (the default fp16 wire's agreement is measured: bench/wire_dtype.py)
            async with CircuitClient(
                hops, hidden_size=m.hidden_size, codec=codec, dtype="float32"
            ) as client:
                tokens = [
                    t
                    async for t in client.generate(
                        head, ids, max_new_tokens=MAX_NEW_TOKENS, timings=timings
                    )
                ]
            for _ in range(50):  # closing is one message to each hop: give it a moment
                infos = await node_infos(http, hops)
                if all(info["sessions"] == 0 for info in infos):
                    break
                await asyncio.sleep(0.05)
        assert all(info["sessions"] == 0 for info in infos), "sessions left open on a node"
        return tokens, timings

    return asyncio.run(run())


@pytest.mark.parametrize("prompt", list(CONVERSATIONS))
def test_pipeline_http_greedy_equals_transformers_generate(circuit, reference, heads, prompt):
    manifest, nodes = circuit
    head = heads.setdefault(manifest, ClientHead.load(manifest, device="cpu"))
    ids, expected = reference[prompt]
    assert head.chat_ids(CONVERSATIONS[prompt]) == ids  # the client's chat template
    tokens, timings = _generate(manifest, nodes, head, ids)
    assert tokens == expected
    assert timings.prompt_tokens == len(ids) and timings.new_tokens == len(expected)
    assert all(pid_alive(n.pid) for n in nodes)


def test_node_serve_corrupted_shard_refuses_to_start_naming_both_hashes(tmp_path):
    from node.model.manifest import Manifest

    manifest_path = prepared_manifest(parts=2, quant="none")
    source = manifest_path.parent
    target = tmp_path / "model"
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).symlink_to(item)
    entry = Manifest.load(manifest_path).shards[1]
    (target / entry.file).unlink()
    shutil.copyfile(source / entry.file, target / entry.file)
    with open(target / entry.file, "r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))
    (port,) = free_ports(1, *PORTS)
    done = run_captured(
        [
            sys.executable,
            "-m",
            "planet",
            "node",
            "serve",
            "--manifest",
            str(target / manifest_path.name),
            "--shard",
            "1",
            "--port",
            str(port),
            "--plaintext-links",
        ],
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert entry.hash in done.stderr  # the manifest's hash …
    assert done.stderr.count("sha256:") >= 2  # … and the file's actual one
    assert done.stderr.startswith("error:") or "\nerror:" in done.stderr
