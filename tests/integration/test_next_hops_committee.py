"""A node's next hops from a real committee (all real processes): one CometBFT validator with the
committee app, three `planet node serve` processes of a tiny model. Node 0 runs `--next-hops
committee --private-next-hops`; node 1 is registered, staked and SERVING for shard 1, so the
circuit through it gives the same greedy tokens as transformers `generate`; a URL that is not
registered, and one that is registered but not routable (no stake), are refused by name and
never dialled; node 2 (committee, public addresses only) refuses node 1's loopback address."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from eth_utils import keccak
from nacl.signing import SigningKey

from harness.gateway_net import (
    Committee,
    ephemeral_port,
    http_json,
    start_committee,
    wait_for,
)
from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.launcher import NodeProcess, start_node, stop_pid, wait_healthy
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake, Heartbeat, RegisterNode, sign_registration
from protocol.eip712 import address_of
from tests.doubles.tiny_model import make_tiny_model

pytestmark = pytest.mark.integration

STEPS = 8
PROMPT = "w1 w7 w3 w40 w5 w99"


class Canary:
    """A listening socket; counts the connections made to it (none may be)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


def _register(committee: Committee, url: str, shard: int, model: str, *, stake: bool) -> None:
    key, evm_key = SigningKey.generate(), keccak(text=url)
    public = key.verify_key.encode().hex()
    body = RegisterNode(
        evm_address=address_of(evm_key),
        evm_signature=sign_registration(evm_key, public),
        role="compute",
        model=model,
        shards=(shard,),
        endpoint=url,
        capacity=8,
    )
    committee.submit(sign(body, key, 1).encode())
    committee.submit(sign(Heartbeat(), key, 2).encode())
    if stake:
        committee.submit(committee.validator_sign(AttestStake(public, 10**18)))


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("next-hops")
    model = make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))
    model_hash = json.loads(manifest.read_text())["model_hash"]
    canaries = [Canary(), Canary()]
    nodes: list[NodeProcess] = []
    committee = None
    try:
        committee = start_committee(root, address_of(keccak(text="next-hops operator")))
        committee_args = ["--committee-rpc", committee.rpc, "--next-hops", "committee"]
        for shard, extra in (
            (0, [*committee_args, "--private-next-hops"]),  # loopback is this test's network
            (1, []),
            (0, committee_args),  # public addresses only, the default under `committee`
        ):
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=ephemeral_port(),
                    run_dir=root / "run",
                    extra_args=["--threads", "1", *extra],
                )
            )
        wait_healthy(nodes, timeout_s=120)
        _register(committee, nodes[1].url, 1, model_hash, stake=True)
        _register(committee, canaries[1].url, 1, model_hash, stake=False)  # not routable

        def routable() -> bool:
            listed = committee.nodes(model=model_hash, role="compute")
            return any(n["routable"] and n["endpoint"] == nodes[1].url for n in listed)

        wait_for(routable, 20, "node 1 did not become routable")

        def seen_by_node_0() -> bool:
            # node 0 reads the committee's view ahead (its warm next-hop links): until that view
            # holds node 1, an open naming node 1 is a miss, refreshed at most every 2 s
            links = http_json(f"{nodes[0].url}/info")["links"]
            return links is not None and links["warm_targets"] >= 1

        wait_for(seen_by_node_0, 30, "node 0 never saw node 1 in the committee's view")
        yield {"model": model, "manifest": manifest, "nodes": nodes, "canaries": canaries}
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)
        if committee is not None:
            committee.stop()
        for canary in canaries:
            canary.sock.close()


def test_committee_next_hop_registered_node_gives_generate_tokens(net) -> None:
    head = ClientHead.load(net["manifest"], device="cpu")
    ids = head.encode(PROMPT)
    hops = [Hop(url=n.url, shard=n.shard) for n in net["nodes"][:2]]

    async def run() -> list[int]:
        async with CircuitClient(hops, hidden_size=64, dtype="float32") as client:  # exact
            gen = client.generate(head, ids, max_new_tokens=STEPS, stop_on_eos=False)
            return [t async for t in gen]

    with torch.no_grad():
        out = net["model"].generate(
            torch.tensor([ids]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False
        )
    assert asyncio.run(run()) == out[0, len(ids) :].tolist()


async def _ask(node: NodeProcess, url: str) -> dict[str, Any]:
    nxt = {"url": url, "shard": 1, "feed": "f" * 43}
    body = {"op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None, "next": nxt}
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{node.url}/v1/stream") as ws:
        await ws.send_json(body)
        return json.loads((await ws.receive(timeout=10)).data)


def test_committee_next_hop_unregistered_or_unroutable_refused_and_never_dialled(net) -> None:
    for canary in net["canaries"]:  # [0]: never registered; [1]: registered, no stake
        answer = asyncio.run(_ask(net["nodes"][0], canary.url))
        assert answer["op"] == "error" and answer["code"] == "next_hop_not_allowed", answer
        assert "not a routable compute node of shard 1" in answer["message"]
    assert [c.connections() for c in net["canaries"]] == [0, 0]


def test_public_only_node_refuses_a_registered_routable_loopback_node(net) -> None:
    """Without --private-next-hops a node dials public addresses only: node 1 is registered,
    staked and routable, but at 127.0.0.1 (a stranger could register any internal address)."""
    answer = asyncio.run(_ask(net["nodes"][2], net["nodes"][1].url))
    assert answer["op"] == "error" and answer["code"] == "next_hop_not_allowed", answer
    assert "not a public address" in answer["message"]
