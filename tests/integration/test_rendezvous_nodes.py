"""Nodes behind NAT with real processes (docs/overlay.md, *NAT rendezvous*): a `planet relay serve`
with `--rendezvous-ports` fronts both nodes of a 2-shard TLS circuit (`planet node serve
--rendezvous RELAY_URL RELAY_KEY`); each node listens only on a loopback port the client is not
given, and links out to the relay.

- the client (CircuitClient, pinning each node key) reaches the first node only at its port on
  the relay, and the first node reaches the second (the previous hop) only at the second's port
  on the relay: the greedy tokens are those of the same nodes dialled directly;
- the relay carried every byte of it as streams of the nodes' links (its /info), and those
  bytes were TLS: the node keys' certificates pinned end to end;
- a node whose link drops (the relay restarted) comes back on the same port, and serves again.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.gateway_net import terminate
from harness.ports import ephemeral_port
from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.keys import PASSWORD_ENV, create_node_key
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.net import port_is_free
from node.server.launcher import NodeProcess, free_ports, start_node, stop_pid, wait_healthy

pytestmark = pytest.mark.integration

PORTS = (22100, 22200)  # this module's share of the test port range
PASSWORD = "rendezvous test"
NEW_TOKENS = 8
QUESTION = [{"role": "user", "content": "Name two rivers in Europe."}]
REACHABLE = re.compile(r"reachable at (https://127\.0\.0\.1:(\d+)) through relay")


class RelayProcess:
    """`planet relay serve --rendezvous-ports`, unregistered, on loopback."""

    def __init__(self, home: Path, port: int, ports: tuple[int, int]) -> None:
        self.home, self.port, self.ports = home, port, ports
        self.url = f"http://127.0.0.1:{port}"
        self.start()

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log = (self.home / "relay.log").open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "planet", "relay", "serve", "--home", str(self.home),
             "--port", str(self.port), "--allow-private-next-hops", "--no-register",
             "--rendezvous-admit", "any",
             "--rendezvous-ports", f"{self.ports[0]}-{self.ports[1]}"],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("relay on"), (line, (self.home / "relay.log").read_text()[-2000:])
        self.key = line.split(" key ", 1)[1].strip()
        assert "fronts nodes behind NAT" in self.process.stdout.readline()

    def info(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/info", timeout=5) as answer:
            return json.load(answer)

    def stop(self) -> None:
        terminate(self.process)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()


def _port_pair() -> tuple[int, int]:
    for first in range(PORTS[0] + 50, PORTS[1] - 1):
        if port_is_free(first) and port_is_free(first + 1):
            return first, first + 1
    raise RuntimeError("no two free ports in a row")


def _reachable(node: NodeProcess, after: int = 0, timeout_s: float = 60) -> str:
    """The URL the node printed once its relay fronted it (the `after`-th such line on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = REACHABLE.findall(node.log_path.read_text(errors="replace"))
        if len(found) > after:
            return found[after][0]
        time.sleep(0.2)
    raise AssertionError(node.log_path.read_text()[-3000:])


@pytest.fixture(scope="module")
def manifest() -> Path:
    from node.model.prepare import prepare

    return Path(prepare(parts=2, quant="none", progress=lambda _msg: None))


@pytest.fixture(scope="module")
def net(manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    run = tmp_path_factory.mktemp("rendezvous")
    relay = RelayProcess(run / "relay", ephemeral_port(), _port_pair())
    ports = free_ports(2, PORTS[0], PORTS[0] + 50)
    nodes: list[NodeProcess] = []
    try:
        for shard in range(2):
            key = run / f"node_key_{shard}.json"
            create_node_key(key, PASSWORD)
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=ports[shard],
                    run_dir=run / "nodes",
                    extra_args=("--next-hops", "any", "--rendezvous", relay.url, relay.key),
                    extra_env={PASSWORD_ENV: PASSWORD},
                    node_key=key,
                )
            )
        wait_healthy(nodes, timeout_s=240)
        fronted = [_reachable(node) for node in nodes]
        yield {"relay": relay, "nodes": nodes, "fronted": fronted}
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)
        relay.stop()


@pytest.fixture(scope="module")
def head(manifest: Path) -> ClientHead:
    return ClientHead.load(manifest, device="cpu")


async def _generate(head: ClientHead, hops: list[Hop], manifest: Path) -> list[int]:
    m = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:
        await check_circuit(http, hops, m.model_hash, m.total_layers)
        async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
            ids = head.chat_ids(QUESTION)
            return [t async for t in client.generate(head, ids, max_new_tokens=NEW_TOKENS)]


def _hops(nodes: list[NodeProcess], urls: list[str]) -> list[Hop]:
    return [Hop(url=url, shard=n.shard, key=n.key) for url, n in zip(urls, nodes, strict=True)]


def test_nodes_reached_only_through_the_relay_give_the_direct_tokens(net, head, manifest) -> None:
    nodes, relay = net["nodes"], net["relay"]
    direct = asyncio.run(_generate(head, _hops(nodes, [n.url for n in nodes]), manifest))
    assert len(direct) == NEW_TOKENS
    before = {n["key"]: n["streams_opened"] for n in relay.info()["rendezvous"]["nodes"]}
    # the fronted URLs are the relay's ports, never the nodes' own
    assert all(
        url.rsplit(":", 1)[1] != str(n.port) for url, n in zip(net["fronted"], nodes, strict=True)
    )
    through = asyncio.run(_generate(head, _hops(nodes, net["fronted"]), manifest))
    assert through == direct
    after = {n["key"]: n["streams_opened"] for n in relay.info()["rendezvous"]["nodes"]}
    # the client's link to the first node and the first node's link to the second both came
    # through their ports on the relay
    assert set(after) == {n.key for n in nodes}
    assert all(after[n.key] > before.get(n.key, 0) for n in nodes)


def test_node_comes_back_on_its_port_after_the_relay_restarts(net, head, manifest) -> None:
    nodes, relay = net["nodes"], net["relay"]
    relay.stop()
    relay.start()  # same home: the ports it gave are kept for their nodes
    again = [_reachable(node, after=1, timeout_s=90) for node in nodes]
    assert again == net["fronted"]
    direct = asyncio.run(_generate(head, _hops(nodes, [n.url for n in nodes]), manifest))
    assert asyncio.run(_generate(head, _hops(nodes, again), manifest)) == direct
