"""`planet local up` → `planet ask` → `planet local down`, exactly as a user types them.

Runs in its own PLANET_HOME (run dir, nodes file) whose models/ links to the real model cache,
so the prepared model is reused. The expected answer is transformers' greedy `generate` on the
whole model, decoded: the circuit of unquantized shards must print exactly that.

No chain at all (`planet local up`: nodes only), so not the shared devnet of conftest.py.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.server.launcher import pid_alive
from tests.e2e.devnet_session import planet

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"
MAX_TOKENS = 20
BASE_PORT = 18200  # busy ports are skipped by `planet local up`


def _planet(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return planet(env, *args, timeout=timeout)  # `planet local up` loads shards: a longer wait


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    from node.model.source import models_dir

    home = tmp_path_factory.mktemp("planet-home")
    real_models = models_dir()
    real_models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(real_models, target_is_directory=True)
    return {**os.environ, "PLANET_HOME": str(home), "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def reference() -> tuple[list[int], str]:
    """The whole model's greedy answer (transformers generate): its token ids and its text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from node.model.source import resolve_source

    directory = resolve_source("default").directory
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([list(ids)]), max_new_tokens=MAX_TOKENS, do_sample=False)
    new = [int(t) for t in out[0, len(ids) :]]
    return new, tokenizer.decode(new, skip_special_tokens=True)


@pytest.fixture(scope="module")
def expected_text(reference: tuple[list[int], str]) -> str:
    return reference[1]


@pytest.fixture(scope="module")
def expected_ids(reference: tuple[list[int], str]) -> list[int]:
    return reference[0]


@pytest.fixture(scope="module")
def local_up(env) -> Iterator[subprocess.CompletedProcess]:
    up = _planet(env, "local", "up", "--nodes", "3", "--base-port", str(BASE_PORT))
    try:
        yield up
    finally:
        _planet(env, "local", "down", timeout=60)


def _status(env: dict[str, str]) -> dict:
    status = _planet(env, "local", "status", "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def test_local_up_starts_three_healthy_node_processes(env, local_up):
    assert local_up.returncode == 0, local_up.stderr
    assert "shard 2" in local_up.stdout and "nodes file:" in local_up.stdout
    nodes = _status(env)["nodes"]
    assert sorted(n["shard"] for n in nodes) == [0, 1, 2]
    for node in nodes:
        assert node["healthy"] and pid_alive(node["pid"])
        os.kill(node["pid"], 0)  # kill -0: the process exists and is ours
    layers = sorted(tuple(n["layers"]) for n in nodes)
    assert layers[0][0] == 0 and layers[-1][1] == 30
    assert all(a[1] == b[0] for a, b in itertools.pairwise(layers))


def test_local_nodes_forward_to_each_other_in_a_circuit(env, local_up, expected_ids):
    """`planet local up` gives each node its circuit as --next-hops: node-to-node forwarding
    runs through them and gives the whole model's greedy tokens."""
    import asyncio
    import urllib.request

    from node.client.circuit import CircuitClient
    from node.client.nodesfile import NodesFile
    from node.client.types import Hop
    from node.model.head import ClientHead

    nodes = NodesFile.load(Path(env["PLANET_HOME"]) / "local" / "nodes.json")
    for node in nodes.nodes:
        with urllib.request.urlopen(f"{node.url}/info", timeout=10) as answer:
            assert json.load(answer)["next_hops"] == "list"
    head = ClientHead.load(nodes.manifest, device="cpu")
    ids = head.chat_ids([{"role": "user", "content": QUESTION}])
    hops = [Hop(url=n.url, shard=n.shard) for n in nodes.nodes]

    async def circuit() -> list[int]:
        async with CircuitClient(hops, hidden_size=head.hidden_size) as client:
            return [t async for t in client.generate(head, ids, max_new_tokens=8)]

    got = asyncio.run(circuit())
    assert got and got == expected_ids[: len(got)]


def test_ask_prints_the_monolithic_greedy_answer(env, local_up, expected_text):
    ask = _planet(env, "ask", QUESTION, "--max-tokens", str(MAX_TOKENS))
    assert ask.returncode == 0, ask.stderr
    assert ask.stdout.strip() and ask.stdout.strip() == expected_text.strip()
    assert all(pid_alive(n["pid"]) for n in _status(env)["nodes"])


def test_ask_json_reports_text_tokens_timings_circuit(env, local_up, expected_text, expected_ids):
    ask = _planet(env, "ask", QUESTION, "--max-tokens", str(MAX_TOKENS), "--json")
    assert ask.returncode == 0, ask.stderr
    body = json.loads(ask.stdout)
    assert body["text"].strip() == expected_text.strip()
    assert len(body["tokens"]) == body["timings"]["new_tokens"] > 0
    assert [hop["shard"] for hop in body["circuit"]] == [0, 1, 2]
    assert body["timings"]["prefill_ms"] > 0
    assert body["timings"]["wire_bytes_received"] > 0
    assert body["tokens"] == expected_ids[: len(body["tokens"])]
    assert body["speculation"] is None  # off unless asked for
    assert body["codec"] == "raw" and body["wire_dtype"] == "float16"  # the default wire


def test_ask_speculate_gives_the_plain_greedy_tokens_and_reports_its_passes(
    env, local_up, expected_ids
):
    ask = _planet(env, "ask", QUESTION, "--max-tokens", str(MAX_TOKENS), "--speculate", "--json")
    assert ask.returncode == 0, ask.stderr
    body = json.loads(ask.stdout)
    assert body["tokens"] == expected_ids[: len(body["tokens"])] and body["tokens"]
    passes = body["speculation"]
    assert passes["lookahead"] == 16 and passes["passes"] >= 1
    # every token after the first came from a pass: its first row or a kept guess
    chosen_after_first = passes["passes"] + passes["accepted"]
    assert len(body["tokens"]) - 1 <= chosen_after_first <= len(body["tokens"])


def test_local_up_twice_refuses_with_hint(env, local_up):
    again = _planet(env, "local", "up", "--nodes", "3", "--base-port", str(BASE_PORT))
    assert again.returncode != 0
    assert "already run" in again.stderr and "hint:" in again.stderr
    assert "Traceback" not in again.stderr


def test_ask_missing_nodes_file_one_line_error_with_hint(env, tmp_path):
    ask = _planet(env, "ask", "hello", "--nodes", str(tmp_path / "missing.json"), timeout=60)
    assert ask.returncode != 0 and ask.stdout == ""
    lines = ask.stderr.strip().splitlines()
    assert lines[0].startswith("error: no nodes file") and lines[1].startswith("hint:")
    assert "Traceback" not in ask.stderr


def test_ask_node_down_names_the_node(env, tmp_path, local_up):
    nodes_file = Path(env["PLANET_HOME"]) / "local" / "nodes.json"
    body = json.loads(nodes_file.read_text())
    body["nodes"][1]["url"] = "http://127.0.0.1:1"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(body))
    ask = _planet(env, "ask", "hello", "--nodes", str(broken), timeout=120)
    assert ask.returncode != 0
    assert "error: node http://127.0.0.1:1 (shard 1) is not reachable" in ask.stderr
    assert "Traceback" not in ask.stderr


def test_local_down_stops_every_node_and_is_idempotent(env, local_up):
    pids = [n["pid"] for n in _status(env)["nodes"]]
    down = _planet(env, "local", "down", timeout=60)
    assert down.returncode == 0 and "stopped 3" in down.stdout
    assert not any(pid_alive(pid) for pid in pids)
    again = _planet(env, "local", "down", timeout=60)
    assert again.returncode == 0 and "no local nodes" in again.stdout
    ask = _planet(env, "ask", "hello", timeout=60)
    assert ask.returncode != 0 and "planet local up" in ask.stderr
