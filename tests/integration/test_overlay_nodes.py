"""The overlay with real processes: eight `planet relay serve` relays in front of the shared
2-node fp32 circuit (`plain_circuits`), the client reaching each node over 4 paths of 2 relays
as (4, 3) S-IDA cloves (docs/overlay.md).

- the greedy answer over the overlay is token for token the answer over direct links;
- the nodes' sessions were opened by overlay links (callers `overlay:<link id>`), never by a
  direct connection of the client;
- a relay killed mid-answer changes nothing in the answer (n − k = 1 path may fail);
- a relay that drops every clove changes nothing in the answer either, is named by the client
  (its path stayed silent) and left out of later draws;
- hostile cells (garbage, wrong sizes, forged layers, an onion not sealed to the relay, a
  next hop at a refused address) are refused by name and stop neither a relay nor a node;
- the ring (docs/overlay.md, *The ring*): the first node runs the decode loop, its tokens come
  back batched over the same relay paths, token for token the direct answer; a relay killed
  mid-ring changes nothing either;
- `planet ask --relays FILE` (its own process, every socket connect recorded) answers as the
  direct path does and never connects to a node's port, /info reads included, where a plain
  `planet ask` connects to both nodes (issue 43).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from nacl.public import PrivateKey

from harness.connect_log import connect_logging, connected_ports
from harness.gateway_net import wait_for
from harness.ports import ephemeral_port
from harness.relays import RelayProcess, write_relays_file
from harness.relays import relays as started_relays
from node.client.circuit import CircuitClient
from node.client.nodesfile import NodeRef, NodesFile
from node.client.overlay import OverlayLink, OverlayRoute, choose_paths
from node.client.ring import generate_ring
from node.client.types import Hop as NodeHop
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.procs import run_captured
from node.relay.relay import Relay, create_app
from protocol import sida
from protocol.open_features import open_features_of
from protocol.overlay import SETUP_BYTES, Cell, CellKind, Hop, build_onion

pytestmark = pytest.mark.integration

RELAYS = 8
NEW_TOKENS = 8
QUESTION = [{"role": "user", "content": "Name two rivers in Europe."}]


@pytest.fixture(scope="module")
def relays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RelayProcess]]:
    with started_relays(RELAYS, tmp_path_factory.mktemp("relays")) as started:
        yield started


@pytest.fixture(scope="module")
def circuit(plain_circuits) -> tuple[Path, list[NodeHop]]:
    manifest, nodes = plain_circuits.get(2)
    return manifest, [NodeHop(url=n.url, shard=i) for i, n in enumerate(nodes)]


@pytest.fixture(scope="module")
def direct(circuit) -> list[int]:
    """The greedy answer over direct links, the yardstick."""
    answer, _ = asyncio.run(_answer(*circuit, None))
    assert len(answer) == NEW_TOKENS
    return answer


_HEADS: dict[Path, ClientHead] = {}


async def _answer(
    manifest: Path,
    hops: list[NodeHop],
    relays: list[RelayProcess] | None,
    kill=None,
    ring: bool = False,
) -> tuple[list[int], list[OverlayLink]]:
    m = Manifest.load(manifest)
    if manifest not in _HEADS:
        _HEADS[manifest] = ClientHead.load(manifest, device="cpu")
    head = _HEADS[manifest]
    ids = head.chat_ids(QUESTION)
    links: list[OverlayLink] = []
    async with aiohttp.ClientSession() as http:

        async def through_relays(hop: NodeHop) -> OverlayLink:
            paths = choose_paths([r.hop for r in relays or []], n=4, length=2)
            link = await OverlayLink(http, paths, hop.url, k=3).__aenter__()
            links.append(link)
            return link

        overlay = through_relays if relays else None
        async with CircuitClient(hops, hidden_size=m.hidden_size, overlay=overlay) as client:
            tokens = []
            if ring:  # each node's /info read over its own overlay link (INFO_ASK)
                for link in client.links:
                    info = await asyncio.wait_for(link.ws.info(), 20)
                    client.open_features[link.hop.url] = open_features_of(info)
                assert client.ring_ready()
                # K > 1: the last hop vouches for its rows over its own overlay link
                assert client.vouch_ready() == (len(hops) > 1)
                answer = generate_ring(client, head, ids, max_new_tokens=NEW_TOKENS)
            else:
                answer = client.generate(head, ids, max_new_tokens=NEW_TOKENS)
            async for token in answer:
                tokens.append(token)
                if kill is not None and len(tokens) == 3:
                    kill()
    return tokens, links


def test_the_overlay_answers_like_direct_links(circuit, direct, relays) -> None:
    manifest, hops = circuit
    overlaid, links = asyncio.run(_answer(manifest, hops, relays))
    assert overlaid == direct
    assert all(link.failed_paths == 0 for link in links)
    assert all(link.cells_sent >= 4 for link in links)  # one cell per path per message at least
    for relay in relays:  # every relay carried cells and holds no path any more
        info = relay.info()
        assert info["cells_forwarded"] > 0, info
        # a path goes when the link's close reaches the relay, after the answer: under the
        # lanes' load one relay still held its path when read at once
        wait_for(lambda r=relay: r.info()["paths"] == 0, 15, f"{relay.url} still holds a path")


def test_a_relay_killed_mid_answer_changes_nothing(circuit, direct, relays, tmp_path) -> None:
    manifest, hops = circuit
    spare = RelayProcess(tmp_path / "spare")  # the module's relays stay whole for the others
    try:
        pool = [*relays[:7], spare]

        def kill() -> None:
            os.kill(spare.process.pid, signal.SIGKILL)

        answer, links = asyncio.run(_answer(manifest, hops, pool, kill))
    finally:
        spare.stop()
    assert answer == direct
    # the killed relay was on one path of each link (8 relays, 4 paths of 2: all are used)
    assert sum(link.failed_paths for link in links) >= 1


def test_the_ring_over_the_overlay_answers_like_direct_links(circuit, direct, relays) -> None:
    """The first node chooses the tokens (its client head, the client's sampler), the second
    node's outputs come back to it over their link, and the tokens reach the client in ring
    tokens messages over the relay paths: the direct answer, every token checked by the client
    against its own head."""
    manifest, hops = circuit
    overlaid, links = asyncio.run(_answer(manifest, hops, relays, ring=True))
    assert overlaid == direct
    assert all(link.failed_paths == 0 for link in links)
    # the outputs and tokens came back on the first hop's link, not on the last hop's (the
    # client-driven loop reads them there)
    assert links[1].bytes_received < links[0].bytes_received


def test_a_relay_killed_mid_ring_changes_nothing(circuit, direct, relays, tmp_path) -> None:
    manifest, hops = circuit
    spare = RelayProcess(tmp_path / "spare")
    try:
        pool = [*relays[:7], spare]

        def kill() -> None:
            os.kill(spare.process.pid, signal.SIGKILL)

        answer, links = asyncio.run(_answer(manifest, hops, pool, kill, ring=True))
    finally:
        spare.stop()
    assert answer == direct
    assert sum(link.failed_paths for link in links) >= 1


def test_planet_ask_ring_over_relays_answers_and_connects_to_no_node(
    circuit, direct, relays, tmp_path
) -> None:
    """`planet ask --relays FILE --ring` in its own process: the first node ran the loop (its
    /info counts the session), the answer is the direct one, no node's port was connected."""
    manifest, hops = circuit
    node_ports = {int(hop.url.rsplit(":", 1)[1]) for hop in hops}
    before = asyncio.run(_get_json(f"{hops[0].url}/info"))["ring_sessions"]
    listed = write_relays_file(tmp_path / "relays.txt", relays)
    overlaid, seen = _ask_process(
        manifest, hops, tmp_path, "ring", "--relays", str(listed), "--overlay", "4,3,2", "--ring"
    )
    assert overlaid["tokens"] == direct
    assert seen and not seen & node_ports, sorted(seen & node_ports)
    assert asyncio.run(_get_json(f"{hops[0].url}/info"))["ring_sessions"] == before + 1


class DroppingRelay(Relay):
    """A relay that sets paths up like any other, then drops every clove sent forward."""

    async def inbound(self, ws, cell: Cell) -> None:
        if cell.kind is not CellKind.DATA:
            await super().inbound(ws, cell)


def test_a_relay_that_drops_cloves_is_seen_and_avoided(circuit, direct, relays) -> None:
    manifest, hops = circuit
    m = Manifest.load(manifest)
    head = _HEADS[manifest]

    async def scenario() -> tuple[list[int], OverlayRoute]:
        bad = DroppingRelay(PrivateKey.generate(), allow_private=True)
        runner = web.AppRunner(create_app(bad))
        await runner.setup()
        port = ephemeral_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        bad_hop = Hop(f"http://127.0.0.1:{port}", bytes(bad.private.public_key))
        # 4 paths of one relay from exactly 4 relays: the dropping one is on a path of each link
        route = OverlayRoute((*[r.hop for r in relays[:3]], bad_hop), paths=4, needed=3, length=1)
        try:
            async with aiohttp.ClientSession() as http:
                overlay = route.dialer(http)
                async with CircuitClient(hops, hidden_size=m.hidden_size, overlay=overlay) as c:
                    ids = head.chat_ids(QUESTION)
                    tokens = [t async for t in c.generate(head, ids, max_new_tokens=NEW_TOKENS)]
        finally:
            await runner.cleanup()
        return tokens, route

    answer, route = asyncio.run(scenario())
    assert answer == direct  # 3 of 4 paths carried every message
    [bad_url] = [hop.url for hop in route.relays if hop.url not in {r.url for r in relays}]
    assert route.avoided == {bad_url}  # only the silent path's relay is suspected
    later = OverlayRoute((*[r.hop for r in relays], *route.relays[3:]), 4, 3, 1, route.avoided)
    assert all(bad_url not in {p[0].url for p in later.draw()} for _ in range(50))


async def _get_json(url: str) -> dict:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return await response.json()


async def _raw(url: str, cells: list[bytes], wait_s: float = 1.0) -> list[Cell]:
    answers = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        for cell in cells:
            await ws.send_bytes(cell)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                message = await ws.receive(timeout=max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                break
            if message.type != aiohttp.WSMsgType.BINARY:
                break
            answers.append(Cell.from_bytes(message.data))
    return answers


def test_hostile_cells_are_refused_and_stop_nothing(circuit, direct, relays) -> None:
    manifest, hops = circuit
    relay = relays[0]
    other = relays[1].hop
    not_ours = build_onion([other], hops[0].url)[0]  # sealed to another relay
    hostile = [
        b"",
        b"\x09" + bytes(8),  # unknown kind
        Cell(CellKind.SETUP, 1, b"short").to_bytes()[:20],
        bytes([CellKind.SETUP]) + bytes(8) + bytes(SETUP_BYTES - 1),
        Cell(CellKind.SETUP, 2, not_ours).to_bytes(),
        Cell(CellKind.DATA, 3, bytes(64)).to_bytes(),  # a path never set up
        Cell(CellKind.CREATED, 4).to_bytes(),  # not a forward cell
        os.urandom(5000),
    ]
    answers = asyncio.run(_raw(f"{relay.url}/v1/relay", hostile, wait_s=0.5))
    assert answers == []  # nothing to answer: each was dropped or refused in the log
    # a next hop on a refused address: the path is destroyed back to the sender, by name
    answers = asyncio.run(_raw(f"{relays[2].url}/v1/relay", [
        Cell(CellKind.SETUP, 7, build_onion([relays[2].hop], "http://10.255.255.1:9")[0]).to_bytes()
    ]))  # fmt: skip
    assert answers == [Cell(CellKind.DESTROY, 7)]
    # the node's door: junk, a malformed clove, a clove of nobody's message
    cloves = sida.disperse(b"not a link message", 4, 3)
    junk = [os.urandom(100), Cell(CellKind.DATA, 9, os.urandom(300)).to_bytes()]
    junk += [Cell(CellKind.DATA, 9, c.to_bytes()).to_bytes() for c in cloves[:3]]
    assert asyncio.run(_raw(f"{hops[0].url}/v1/overlay", junk, wait_s=0.5)) == []
    text = relay.log_path.read_text()
    assert "cell_malformed" in text and "onion_invalid" in text
    assert "next hop" in relays[2].log_path.read_text()
    # after all of it, both kinds of process still serve a whole answer over the overlay
    assert asyncio.run(_answer(manifest, hops, relays))[0] == direct
    assert json.loads(json.dumps(asyncio.run(_get_json(f"{relay.url}/health")))) == {"ok": True}


def _ask_process(
    manifest: Path, hops: list[NodeHop], root: Path, name: str, *extra: str
) -> tuple[dict, set[int]]:
    """`planet ask QUESTION --json` in its own process over a nodes file of `hops`: its answer
    and the ports of every socket it connected to (harness/connect_log.py)."""
    m = Manifest.load(manifest)
    nodes_file = root / "nodes.json"
    refs = tuple(NodeRef(hop.url, hop.shard, tuple(m.shards[hop.shard].layers)) for hop in hops)
    NodesFile(manifest, refs).save(nodes_file)
    connects = root / f"connects-{name}.txt"
    env = {**os.environ, "PLANET_HOME": str(root / f"home-{name}")}
    env = connect_logging(env, root / "connect-hook", connects)
    command = [sys.executable, "-m", "planet", "ask", QUESTION[0]["content"], "--json"]
    command += ["--nodes", str(nodes_file), "--max-tokens", str(NEW_TOKENS), *extra]
    done = run_captured(command, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), set(connected_ports(connects))


def test_planet_ask_over_relays_answers_and_connects_to_no_node(
    circuit, direct, relays, tmp_path
) -> None:
    manifest, hops = circuit
    node_ports = {int(hop.url.rsplit(":", 1)[1]) for hop in hops}
    relay_ports = {relay.port for relay in relays}
    plain, seen = _ask_process(manifest, hops, tmp_path, "direct")
    assert plain["tokens"] == direct and plain["relays"] is None
    assert node_ports <= seen  # asked directly, the asker connects to every node itself
    listed = write_relays_file(tmp_path / "relays.txt", relays)
    overlaid, seen = _ask_process(
        manifest, hops, tmp_path, "relays", "--relays", str(listed), "--overlay", "4,3,2"
    )
    assert seen and not seen & node_ports, sorted(seen & node_ports)  # /info reads included
    assert seen <= relay_ports  # the first relays of its paths, nothing else
    assert overlaid["tokens"] == direct and overlaid["text"] == plain["text"]
    assert overlaid["relays"] == {"paths": 4, "needed": 3, "length": 2, "credits_spent": None}
