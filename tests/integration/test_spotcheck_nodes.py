"""Spot checks on real node processes (real SmolLM2 shards, real links, sealed tickets).

Two compute node processes serve shard 1 (of 3): one noisy on purpose (fp32 weights, 10 % noise
on every 32nd position: one position per block, `tests/integration/spotcheck_node.py`), one
honest int8. A client drives one session through each the way users do (prompt prefill, then
one position per forward: 96 positions, 3 blocks). The verifier reads the node's block
commitments, asks for the tickets of selected blocks with a signed request, opens the sealed
answer and recomputes in one prefill on its own copy of the shard: the noisy node's tickets
fail (offence 3), the honest int8 node's pass, and a block the node never served ends in a
ticket timeout (offence 4).
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from nacl.signing import SigningKey

from harness.ports import ephemeral_port
from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.model.evaluate import heldout_text
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.model.shard import ShardModel
from node.procs import Child, spawn_piped
from node.verifier.calibration import load_calibration
from node.verifier.ticket_client import spot_check
from protocol.spotcheck import Outcome, Triple
from protocol.tickets import TicketRequest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NODE_MODULE = "tests.integration.spotcheck_node"  # run from REPO with -m: the zygote forks it
SEED = "0x" + hashlib.sha256(b"spot-check test epoch").hexdigest()
VERIFIER = SigningKey(hashlib.sha256(b"spot-check test verifier").digest())
NODE_SEEDS = {"noisy": b"\x21" * 32, "int8": b"\x22" * 32}
PROMPT, TOTAL = 32, 96


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def manifests() -> dict[str, Path]:
    quiet = {"progress": lambda _m: None}
    return {
        "none": prepare(parts=3, quant="none", **quiet),
        "int8": prepare(parts=3, quant="int8", **quiet),
    }


@pytest.fixture(scope="module")
def nodes(manifests: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    logs = tmp_path_factory.mktemp("spotcheck-nodes")
    specs = {"noisy": (manifests["none"], ["--noise-every", "32"]), "int8": (manifests["int8"], [])}
    procs: dict[str, tuple[Child, str]] = {}
    try:
        for name, (manifest, extra) in specs.items():
            port = ephemeral_port()
            cmd = [
                sys.executable,
                "-m",
                NODE_MODULE,
                "--manifest",
                str(manifest),
                "--shard",
                "1",
                "--port",
                str(port),
                "--node-key",
                NODE_SEEDS[name].hex(),
                "--seed",
                SEED,
                "--verifier",
                VERIFIER.verify_key.encode().hex(),
                *extra,
            ]
            log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            proc = spawn_piped(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, new_session=True
            )
            procs[name] = (proc, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        for name, (proc, url) in procs.items():
            while not _healthy(url):
                assert proc.poll() is None, (logs / f"{name}.log").read_text()[-2000:]
                assert time.monotonic() < deadline, f"{name} node not healthy"
                time.sleep(0.2)
        yield {name: url for name, (_, url) in procs.items()}
        for proc, _ in procs.values():  # every process is alive after the whole module
            assert proc.poll() is None
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def served_inputs(manifests: dict[str, Path]) -> torch.Tensor:
    """What shard 1 receives for 96 positions of natural text (from the fp32 shard 0)."""
    head = ClientHead.load(manifests["none"], device="cpu")
    first = ShardModel.load(manifests["none"], 0, device="cpu")
    ids = head.encode(heldout_text())[:TOTAL]
    with torch.inference_mode():
        return first.forward(head.embed(ids), torch.arange(TOTAL), first.new_cache())


async def _serve(url: str, inputs: torch.Tensor) -> str:
    """One session served like a user's: prefill, then one position per forward. Its tag."""
    from node.client.capabilities import new_session_id

    array = inputs.numpy()
    async with CircuitClient([Hop(url, 1)], hidden_size=int(array.shape[2])) as client:
        secret = new_session_id()
        sid = await client.open(secret)
        await client.send(sid, 0, array[:, :PROMPT])
        await client.receive(sid, PROMPT - 1, 1)
        for position in range(PROMPT, TOTAL):
            await client.send(sid, position, array[:, position : position + 1])
            await client.receive(sid, position, 1)
        await client.close(sid)  # tickets outlive the KV cache
        return client.session_tags(secret)[0]


async def _checks(url: str, node: str, shard: Any, quant: str, inputs: torch.Tensor) -> dict:
    tag = await _serve(url, inputs)
    tolerance = load_calibration().tolerance(quant)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/commitments/{tag}") as answer:
            listed = (await answer.json())["commitments"]
        assert [c["step"] for c in listed] == [0, 1, 2]
        results = {}
        for block in (0, 1, 2, 7):
            triple = Triple(node, "0x" + tag, block, 1)
            request = TicketRequest(triple, SEED, VERIFIER.verify_key.encode().hex())
            commitment = bytes.fromhex(listed[min(block, 2)]["commitment"][2:])
            results[block] = await spot_check(
                http,
                url,
                request.signed(VERIFIER),
                VERIFIER,
                shard=shard,
                commitment=commitment,
                tolerance=tolerance,
                deadline_s=20 if block < 3 else 1.5,
                retry_s=0.5,
            )
    return results


def _node(name: str) -> str:
    return SigningKey(NODE_SEEDS[name]).verify_key.encode().hex()


def test_spotcheck_noisy_node_fails_honest_int8_passes_on_real_nodes(
    nodes: dict[str, str], manifests: dict[str, Path], served_inputs: torch.Tensor
) -> None:
    verifier_fp32 = ShardModel.load(manifests["none"], 1, device="cpu")
    verifier_int8 = ShardModel.load(manifests["int8"], 1, device="cpu")
    noisy = asyncio.run(
        _checks(nodes["noisy"], _node("noisy"), verifier_fp32, "none", served_inputs)
    )
    honest = asyncio.run(
        _checks(nodes["int8"], _node("int8"), verifier_int8, "int8", served_inputs)
    )

    for block in (0, 1, 2):
        failed = noisy[block]
        assert failed.outcome is Outcome.FAILED, failed
        assert failed.outcome.offence == 3 and failed.evidence_hash is not None
        assert failed.bad_positions == (32 * block,)  # the one noisy position of the block
        passed = honest[block]
        assert passed.outcome is Outcome.PASSED, passed
        assert passed.evidence_hash is None and passed.verdict is not None
        assert passed.verdict.match_per_mille >= 900
    for results in (noisy, honest):  # never served: no ticket before the deadline
        assert results[7].outcome is Outcome.TIMEOUT and results[7].outcome.offence == 4
