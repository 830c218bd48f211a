"""Nodes behind NAT with real processes (docs/overlay.md, *NAT rendezvous*): a `planet relay serve`
with `--rendezvous-ports` fronts both nodes of a 2-shard TLS circuit (`planet node serve
--rendezvous RELAY_URL RELAY_KEY`); each node listens only on a loopback port the client is not
given, and links out to the relay.

- the client (CircuitClient, pinning each node key) reaches the first node only at its port on
  the relay, and the first node reaches the second (the previous hop) only at the second's port
  on the relay: the greedy tokens are those of the same nodes dialled directly;
- the relay carried every byte of it as streams of the nodes' links (its /info), and those
  bytes were TLS: the node keys' certificates pinned end to end;
- a node whose link drops (the relay restarted) comes back on the same port, and serves again;
- each node links to a second relay too: with the first relay down, the client dials the first
  node at its port on the second (`Hop.alternates`, node.dial `first_reachable`) and the answer
  is the same; and the first node, told the second node's both addresses in the open
  (`next.alternates`: its /info advertises taking them), dials the second node at its port on
  the second relay: the same tokens as with both relays up;
- a relay admitting by a real committee (one CometBFT validator with the app,
  `--rendezvous-admit registered`): fresh keys get no more than its one lease and are refused
  `not_registered`, a registered and staked key still gets a port, and a lease that runs out
  frees its port.
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
from eth_utils import keccak
from nacl.signing import SigningKey

from harness.gateway_net import terminate
from harness.ports import ephemeral_port
from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.keys import PASSWORD_ENV, create_node_key
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.net import port_is_free
from node.procs import spawn_piped
from node.server.launcher import NodeProcess, free_ports, start_node, stop_pid, wait_healthy
from node.server.rendezvous import RendezvousRelay, claim_port
from protocol.committee.envelope import sign
from protocol.committee.registry import AttestStake, RegisterNode, sign_registration
from protocol.eip712 import address_of
from protocol.open_features import open_features_of
from protocol.rendezvous import RefuseCode, Refused

pytestmark = pytest.mark.integration

PORTS = (22100, 22200)  # this module's share of the test port range
PASSWORD = "rendezvous test"
NEW_TOKENS = 8
QUESTION = [{"role": "user", "content": "Name two rivers in Europe."}]
REACHABLE = re.compile(r"reachable at (https://127\.0\.0\.1:\d+) through relay (\S+) ")


class RelayProcess:
    """`planet relay serve --rendezvous-ports`, unregistered, on loopback; fronting any key, or
    with `admit` (extra arguments) as they say."""

    def __init__(
        self, home: Path, port: int, ports: tuple[int, int], admit: tuple[str, ...] = ()
    ) -> None:
        self.home, self.port, self.ports = home, port, ports
        self.admit = admit or ("--rendezvous-admit", "any")
        self.url = f"http://127.0.0.1:{port}"
        self.start()

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log = (self.home / "relay.log").open("a")
        self.process = spawn_piped(
            [sys.executable, "-m", "planet", "relay", "serve", "--home", str(self.home),
             "--port", str(self.port), "--allow-private-next-hops", "--no-register",
             *self.admit, "--rendezvous-ports", f"{self.ports[0]}-{self.ports[1]}"],
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


def _port_pair(start: int = PORTS[0] + 50) -> tuple[int, int]:
    for first in range(start, PORTS[1] - 1):
        if port_is_free(first) and port_is_free(first + 1):
            return first, first + 1
    raise RuntimeError("no two free ports in a row")


def _port_run(count: int) -> tuple[int, int]:
    for first in range(PORTS[0] + 60, PORTS[1] - count):
        if all(port_is_free(first + i) for i in range(count)):
            return first, first + count - 1
    raise RuntimeError(f"no {count} free ports in a row")


def _reachable(
    node: NodeProcess, relay: RelayProcess, after: int = 0, timeout_s: float = 60
) -> str:
    """The URL the node printed once `relay` fronted it (the `after`-th such line on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = REACHABLE.findall(node.log_path.read_text(errors="replace"))
        mine = [url for url, by in found if by == relay.url]
        if len(mine) > after:
            return mine[after]
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
    second = RelayProcess(run / "relay2", ephemeral_port(), _port_pair(relay.ports[1] + 1))
    ports = free_ports(2, PORTS[0], PORTS[0] + 50)
    nodes: list[NodeProcess] = []
    links = ("--rendezvous", relay.url, relay.key, "--rendezvous", second.url, second.key)
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
                    extra_args=("--next-hops", "any", *links),
                    extra_env={PASSWORD_ENV: PASSWORD},
                    node_key=key,
                )
            )
        wait_healthy(nodes, timeout_s=240)
        fronted = [_reachable(node, relay) for node in nodes]
        at_second = [_reachable(node, second) for node in nodes]
        yield {
            "relay": relay,
            "second": second,
            "nodes": nodes,
            "fronted": fronted,
            "at_second": at_second,
        }
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)
        relay.stop()
        second.stop()


@pytest.fixture(scope="module")
def head(manifest: Path) -> ClientHead:
    return ClientHead.load(manifest, device="cpu")


async def _generate(head: ClientHead, hops: list[Hop], manifest: Path) -> list[int]:
    m = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:
        infos = await check_circuit(http, hops, m.model_hash, m.total_layers)
        async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
            for hop, info in zip(hops, infos, strict=True):  # as the clients read them
                client.open_features[hop.url] = open_features_of(info)
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
    again = [_reachable(node, relay, after=1, timeout_s=90) for node in nodes]
    assert again == net["fronted"]
    direct = asyncio.run(_generate(head, _hops(nodes, [n.url for n in nodes]), manifest))
    assert asyncio.run(_generate(head, _hops(nodes, again), manifest)) == direct


def test_previous_hop_reaches_the_next_node_at_its_second_relay_when_the_first_is_down(
    net, head, manifest
) -> None:
    nodes, relay = net["nodes"], net["relay"]
    # both nodes as a client knows them from their registrations: the endpoint (the first
    # relay's port), then the address at the second relay; the open tells the first node the
    # second's both addresses (`next.alternates`)
    hops = [
        Hop(url, n.shard, n.key, alternates=(alternate,))
        for url, alternate, n in zip(net["fronted"], net["at_second"], nodes, strict=True)
    ]
    both_up = asyncio.run(_generate(head, hops, manifest))
    assert len(both_up) == NEW_TOKENS
    relay.stop()
    try:
        assert asyncio.run(_generate(head, hops, manifest)) == both_up
        # the first node dialled the second at its endpoint (down), then at the second relay
        # (no link to it there yet: this test runs before the next one names that address
        # as the second node's URL)
        log = nodes[0].log_path.read_text(errors="replace")
        assert (
            f"next hop {net['fronted'][1]} reached at {net['at_second'][1]}, its address 2 of 2"
            in log
        ), log[-3000:]
    finally:
        relay.start()


def test_client_reaches_the_node_at_its_second_relay_when_the_first_is_down(
    net, head, manifest
) -> None:
    nodes, relay, second = net["nodes"], net["relay"], net["second"]
    direct = asyncio.run(_generate(head, _hops(nodes, [n.url for n in nodes]), manifest))
    before = {n["key"]: n["streams_opened"] for n in second.info()["rendezvous"]["nodes"]}
    relay.stop()
    try:
        # the first node as a client knows it from the registration: its endpoint (the first
        # relay's port) and its address at the second relay; the first node is told the
        # second's address at the second relay as its URL (its alternates: the test below)
        hops = [
            Hop(net["fronted"][0], 0, nodes[0].key, alternates=(net["at_second"][0],)),
            Hop(net["at_second"][1], 1, nodes[1].key),
        ]
        assert asyncio.run(_generate(head, hops, manifest)) == direct
        after = {n["key"]: n["streams_opened"] for n in second.info()["rendezvous"]["nodes"]}
        assert after[nodes[0].key] > before[nodes[0].key]  # it came through the second relay
    finally:
        relay.start()


def _register(committee: Any, key: SigningKey, *, stake: bool) -> None:
    public = key.verify_key.encode().hex()
    evm_key = keccak(text=public)
    body = RegisterNode(
        evm_address=address_of(evm_key),
        evm_signature=sign_registration(evm_key, public),
        role="compute",
        model="sha256:" + "0" * 64,
        shards=(0,),
        endpoint="https://127.0.0.1:9",
        capacity=8,
    )
    committee.submit(sign(body, key, 1).encode())
    if stake:
        committee.submit(committee.validator_sign(AttestStake(public, 10**18)))


async def _claim(relay: RelayProcess, key: SigningKey) -> int | RefuseCode:
    target = RendezvousRelay(relay.url, bytes.fromhex(relay.key))
    async with aiohttp.ClientSession() as http:
        try:
            return (await claim_port(http, target, key)).port
        except Refused as error:
            return error.refusal


def test_relay_admitting_by_the_committee_bounds_fresh_keys_and_fronts_a_staked_node(
    tmp_path: Path,
) -> None:
    from harness.gateway_net import start_committee

    committee = start_committee(tmp_path, address_of(keccak(text="rendezvous operator")))
    relay = None
    try:
        relay = RelayProcess(
            tmp_path / "relay",
            ephemeral_port(),
            _port_run(4),  # 4 ports: 1 lease in all
            admit=("--committee-rpc", committee.rpc, "--rendezvous-lease", "2"),
        )
        flood = [asyncio.run(_claim(relay, SigningKey.generate())) for _ in range(4)]
        leased = [port for port in flood if not isinstance(port, RefuseCode)]
        assert len(leased) == 1, flood
        assert flood[1:] == [RefuseCode.NOT_REGISTERED] * 3, flood
        member = SigningKey.generate()
        _register(committee, member, stake=True)
        port = asyncio.run(_claim(relay, member))
        assert not isinstance(port, RefuseCode) and port != leased[0], port
        assert asyncio.run(_claim(relay, member)) == port  # one port per key, kept for it
        deadline = time.monotonic() + 60
        while relay.info()["rendezvous"]["leases"] and time.monotonic() < deadline:
            time.sleep(0.2)  # the lease runs out (2 s): the stranger is not registered
        assert relay.info()["rendezvous"]["leases"] == 0
        again = asyncio.run(_claim(relay, SigningKey.generate()))
        assert not isinstance(again, RefuseCode)  # the port is free again
        assert relay.info()["rendezvous"]["kept"] == 1
    finally:
        if relay is not None:
            relay.stop()
        committee.stop()
