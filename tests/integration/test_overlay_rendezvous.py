"""The overlay and nodes behind NAT, all real processes (docs/overlay.md, *Exit relays and nodes
behind NAT*): one CometBFT validator with the committee app; two `planet relay serve
--rendezvous-ports` relays, registered as relays, fronting both nodes of a 2-shard TLS circuit
(tiny model), each node registered, staked and routable with its port at the first relay as its
endpoint and both ports as its `rendezvous`; four exit relays (`--committee-rpc`); and a node
of before (tests/doubles/old_open_node.py: no `open_features` in its /info, an open grammar
without `next.alternates`).

- with the first rendezvous relay stopped, a question over the overlay (4 paths of 1 relay,
  any 3 enough) gives the tokens it gives with both up: every exit, not reaching a node at
  the URL the onion names, dials the other address that node's key registered (its port at
  the second relay), and the first node reaches the second there too (`next.alternates`:
  the first node advertises taking them);
- a circuit whose first node is a node of before, second node behind NAT and known with its
  alternates: the client reads the previous hop's /info, sends it no `next.alternates` (that
  node would refuse them, `bad_control`), and the answer is the same tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_utils import keccak
from nacl.signing import SigningKey

from harness.gateway_net import Committee, ephemeral_port, start_committee, wait_for
from harness.relays import relays as started_relays
from node.client.overlay import OverlayRoute
from node.client.replicas import ReplicaCircuits
from node.client.types import Hop
from node.keys import PASSWORD_ENV, create_node_key, load_node_key
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.model.prepare import prepare
from node.net import port_is_free
from node.server.launcher import NodeProcess, start_node, stop_pid, wait_healthy
from protocol.committee.envelope import sign
from protocol.committee.registry import (
    AttestStake,
    Heartbeat,
    RegisterNode,
    Rendezvous,
    sign_registration,
)
from protocol.committee.relays import RegisterRelay
from protocol.eip712 import address_of
from tests.doubles import old_open_node
from tests.doubles.tiny_model import make_tiny_model
from tests.integration.test_rendezvous_nodes import RelayProcess, _reachable

pytestmark = pytest.mark.integration

PORTS = (22300, 22400)  # this module's share of the test port range (rendezvous ports)
PASSWORD = "overlay rendezvous test"
NEW_TOKENS = 6
PROMPT = "w1 w7 w3 w40 w5 w99"


def _port_pair(after: int = PORTS[0]) -> tuple[int, int]:
    for first in range(after, PORTS[1] - 1):
        if port_is_free(first) and port_is_free(first + 1):
            return first, first + 1
    raise RuntimeError("no two free ports in a row")


def _register_relay(committee: Committee, relay: RelayProcess) -> str:
    """Register `relay` (its URL, its X25519 key) as a relay under a fresh committee key."""
    key = SigningKey.generate()
    public = key.verify_key.encode().hex()
    evm_key = keccak(text=f"relay {public}")
    body = RegisterRelay(
        evm_address=address_of(evm_key),
        evm_signature=sign_registration(evm_key, public),
        endpoint=relay.url,
        relay_key=relay.key,
    )
    committee.submit(sign(body, key, 1).encode())
    return public


def _register_nat_node(
    committee: Committee,
    key: SigningKey,
    model: str,
    shard: int,
    addresses: list[tuple[str, str]],  # (relay committee key, the node's port there)
) -> None:
    """Register, heartbeat and stake a node behind NAT: its endpoint the first relay's port."""
    public = key.verify_key.encode().hex()
    evm_key = keccak(text=f"node {public}")
    body = RegisterNode(
        evm_address=address_of(evm_key),
        evm_signature=sign_registration(evm_key, public),
        role="compute",
        model=model,
        shards=(shard,),
        endpoint=addresses[0][1],
        capacity=8,
        rendezvous=tuple(Rendezvous(relay, url) for relay, url in addresses),
    )
    committee.submit(sign(body, key, 1).encode())
    committee.submit(sign(Heartbeat(), key, 2).encode())
    committee.submit(committee.validator_sign(AttestStake(public, 10**18)))


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("overlay-rendezvous")
    make_tiny_model(root / "src", layers=4, hidden=64, tied=False)
    manifest = Path(prepare(root / "src", parts=2, out=root / "p2", progress=lambda _: None))
    model_hash = json.loads(manifest.read_text())["model_hash"]
    committee = start_committee(root, address_of(keccak(text="overlay rendezvous operator")))
    fronts: list[RelayProcess] = []
    nodes: list[NodeProcess] = []
    exits_cm = None
    try:
        first_pair = _port_pair()
        fronts.append(RelayProcess(root / "front1", ephemeral_port(), first_pair))
        fronts.append(
            RelayProcess(root / "front2", ephemeral_port(), _port_pair(first_pair[1] + 1))
        )
        relay_keys = [_register_relay(committee, relay) for relay in fronts]
        links = [word for r in fronts for word in ("--rendezvous", r.url, r.key)]
        env = {PASSWORD_ENV: PASSWORD}
        keys = []
        for shard in range(2):
            path = root / f"nat{shard}.json"
            create_node_key(path, PASSWORD)
            keys.append(load_node_key(path, PASSWORD))
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=ephemeral_port(),
                    run_dir=root / "nat",
                    extra_args=("--threads", "1", "--next-hops", "any", *links),
                    extra_env=env,
                    node_key=path,
                )
            )
        old_key = root / "old.json"
        create_node_key(old_key, PASSWORD)
        nodes.append(
            start_node(
                manifest=manifest,
                shard=0,
                port=ephemeral_port(),
                run_dir=root / "old",
                extra_args=("--threads", "1", "--next-hops", "any"),
                extra_env=env,
                node_key=old_key,
                module=old_open_node.MODULE,
            )
        )
        wait_healthy(nodes, timeout_s=180)
        fronted = [[_reachable(node, relay) for relay in fronts] for node in nodes[:2]]
        for shard, key in enumerate(keys):
            addresses = list(zip(relay_keys, fronted[shard], strict=True))
            _register_nat_node(committee, key, model_hash, shard, addresses)

        def routable() -> bool:
            listed = committee.nodes(model=model_hash, role="compute")
            return sum(bool(n["routable"]) for n in listed) == 2

        wait_for(routable, 30, "the nodes behind NAT did not become routable")
        exits_cm = started_relays(4, root / "exits", ("--committee-rpc", committee.rpc))
        exits = exits_cm.__enter__()
        yield {
            "manifest": manifest,
            "committee": committee,
            "fronts": fronts,
            "nat": nodes[:2],
            "old": nodes[2],
            "fronted": fronted,
            "exits": exits,
        }
    finally:
        if exits_cm is not None:
            exits_cm.__exit__(None, None, None)
        for node in nodes:
            stop_pid(node.pid, grace_s=5, module=node.module)
        for relay in fronts:
            relay.stop()
        committee.stop()


def _nat_hop(net: dict[str, Any], shard: int) -> Hop:
    """A node behind NAT as a client knows it from its registration (node/gateway/router.py
    `alternates_of`): its endpoint (the first relay's port), then its port at the second."""
    first, second = net["fronted"][shard]
    return Hop(first, shard, net["nat"][shard].key, alternates=(second,))


async def _answer(net: dict[str, Any], hops: list[Hop], *, overlay: bool) -> list[int]:
    """A greedy answer through `hops` as the personal client and `planet ask` get one
    (node/client/replicas.py: the circuit's /info read first, then the circuit), its links
    over the exit relays (4 paths of 1 relay, any 3 enough) or direct."""
    manifest = Manifest.load(net["manifest"])
    head = ClientHead.load(net["manifest"], device="cpu")
    expected = {s.shard_id: (manifest.model_hash, s.layers) for s in manifest.shards}
    async with aiohttp.ClientSession() as http:
        route = OverlayRoute(tuple(r.hop for r in net["exits"]), paths=4, needed=3, length=1)
        source = ReplicaCircuits(
            http,
            hops,
            expected=expected,
            hidden_size=manifest.hidden_size,
            request_timeout_s=60,
            overlay=route.dialer(http) if overlay else None,
        )
        async with source.lease(frozenset()) as client:
            ids = head.encode(PROMPT)
            return [t async for t in client.generate(head, ids, max_new_tokens=NEW_TOKENS)]


def test_overlay_reaches_nodes_behind_nat_at_their_second_relay_when_the_first_is_down(
    net,
) -> None:
    hops = [_nat_hop(net, 0), _nat_hop(net, 1)]
    both_up = asyncio.run(_answer(net, hops, overlay=True))
    assert len(both_up) == NEW_TOKENS
    exits = net["exits"]
    before = sum(relay.info().get("exit_fallbacks", 0) for relay in exits)
    assert before == 0  # every exit reached the nodes at the URL the onion named
    first = net["fronts"][0]
    first.stop()
    try:
        assert asyncio.run(_answer(net, hops, overlay=True)) == both_up
        # the exits reached both nodes at their ports on the second relay (their keys'
        # registered addresses), at least k = 3 paths of each link
        assert sum(relay.info().get("exit_fallbacks", 0) for relay in exits) >= 2 * 3
        # and the first node reached the second there too (it takes next.alternates)
        log = net["nat"][0].log_path.read_text(errors="replace")
        assert f"reached at {net['fronted'][1][1]}, its address 2 of 2" in log, log[-3000:]
    finally:
        first.start()
        deadline = time.monotonic() + 90
        for node in net["nat"]:  # both back at the first relay before the next test
            _reachable(node, first, after=1, timeout_s=max(1.0, deadline - time.monotonic()))


def test_a_previous_hop_of_before_gets_no_alternates_and_the_circuit_answers(net) -> None:
    old = net["old"]
    nat = _nat_hop(net, 1)
    # the yardstick: the old node's next hop named without alternates, direct links
    bare = [Hop(old.url, 0, old.key), Hop(nat.url, 1, nat.key)]
    plain = asyncio.run(_answer(net, bare, overlay=False))
    assert len(plain) == NEW_TOKENS
    # the client knows the second node's other address, and that the first (its /info) does
    # not take next.alternates: none is sent, so the node of before opens the session
    hops = [Hop(old.url, 0, old.key), nat]
    assert asyncio.run(_answer(net, hops, overlay=False)) == plain
    assert asyncio.run(_answer(net, hops, overlay=True)) == plain
