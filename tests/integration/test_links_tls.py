"""Links bound to the node key, with real node processes (SmolLM2, 2 unquantized shards):

- a circuit over TLS (`planet node serve --node-key`, https://, pinned) gives the same greedy
  tokens as the same circuit over plaintext (`--plaintext-links`);
- a node that does not prove the key the client expects is refused by name
  (`node_key_mismatch`), on the client's own link and on a forwarding node's link to its next
  hop, and keeps serving;
- the bytes on the wire are not plaintext: a loopback TCP relay in front of every node records
  both directions of every link (client → A, client → B, A → B, B → client), and reads them as
  anyone on the path would (WebSocket frames unmasked); over TLS it finds no HTTP, control
  JSON, capabilities or prompt embedding rows, while the same relay in front of the plaintext
  circuit finds all four (so the check can fail);
- links to next hops are warm (node/server/link_pool.py): a plaintext first node has its link
  to the next shard's node open before any question; the TLS first node's link to B (through a
  relay) serves a second question with no new handshake (its /info `links.dialled` unchanged),
  and when the relay kills that link underneath, the node dials it again by itself and the next
  question gets the same tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from node.client.circuit import CircuitClient
from node.client.info import check_circuit
from node.client.types import Hop
from node.keys import PASSWORD_ENV, create_node_key
from node.links import link_ssl
from node.model.head import ClientHead
from node.model.manifest import Manifest
from node.server.launcher import (
    NodeProcess,
    free_ports,
    pid_alive,
    start_node,
    stop_pid,
    wait_healthy,
)
from protocol.links import NodeKeyMismatchError

pytestmark = pytest.mark.integration

PORTS = (21900, 22000)  # this module's share of the test port range
PASSWORD = "links test"
NEW_TOKENS = 16
QUESTION = [{"role": "user", "content": "Name three rivers in Europe and one fact each."}]


class Relay:
    """A loopback TCP relay that records every byte in both directions of every connection."""

    def __init__(self, port: int, target: int) -> None:
        self.port = port
        self.target = target
        self.streams: list[bytearray] = []  # one per connection and direction
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:  # the pipes read EOF and end
            writer.close()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def drop(self) -> None:
        """Kill every connection through the relay now (it keeps accepting new ones)."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        seen = bytearray()
        self.streams.append(seen)
        try:
            while data := await src.read(65536):
                seen += data
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()


def readable(stream: bytes) -> bytes:
    """What anyone on the path reads from one direction of a link: the bytes as they are, and,
    if they are plain HTTP + WebSocket, every frame's payload unmasked (a client masks its
    frames with a key it sends in the clear, RFC 6455 5.3)."""
    end = stream.find(b"\r\n\r\n")
    if end < 0:
        return stream
    payloads, at = [], end + 4
    while at + 2 <= len(stream):
        masked, size = stream[at + 1] & 0x80, stream[at + 1] & 0x7F
        at += 2
        if size >= 126:
            width = 2 if size == 126 else 8
            size = int.from_bytes(stream[at : at + width])
            at += width
        mask = stream[at : at + 4] if masked else b"\0\0\0\0"
        at += 4 if masked else 0
        body = np.frombuffer(stream[at : at + size], np.uint8)
        key = np.resize(np.frombuffer(mask, np.uint8), len(body))
        payloads.append((body ^ key).tobytes())
        at += size
    return stream + b"".join(payloads)


@pytest.fixture(scope="module")
def manifest() -> Path:
    from node.model.prepare import prepare

    return Path(prepare(parts=2, quant="none", progress=lambda _msg: None))


@pytest.fixture(scope="module")
def net(manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two circuits of the same 2 shards: TLS nodes (each with its own node key) and plaintext
    nodes; each first node may forward to its second node directly or through a relay port."""
    run = tmp_path_factory.mktemp("links")
    ports = free_ports(8, *PORTS)
    tls_ports, plain_ports, relay_ports = ports[:2], ports[2:4], ports[4:]
    keys = [run / f"node_key_{shard}.json" for shard in range(2)]
    for path in keys:
        create_node_key(path, PASSWORD)
    nodes: list[NodeProcess] = []
    try:
        for shard in range(2):
            hops = f"https://127.0.0.1:{tls_ports[1]},https://127.0.0.1:{relay_ports[1]}"
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=tls_ports[shard],
                    run_dir=run / "tls",
                    extra_args=("--next-hops", hops),
                    extra_env={PASSWORD_ENV: PASSWORD},
                    node_key=keys[shard],
                )
            )
        for shard in range(2):
            hops = f"http://127.0.0.1:{plain_ports[1]},http://127.0.0.1:{relay_ports[3]}"
            nodes.append(
                start_node(
                    manifest=manifest,
                    shard=shard,
                    port=plain_ports[shard],
                    run_dir=run / "plain",
                    extra_args=("--next-hops", hops),
                )
            )
        wait_healthy(nodes, timeout_s=240)
        yield {"tls": nodes[:2], "plain": nodes[2:], "relays": relay_ports}
    finally:
        for node in nodes:
            stop_pid(node.pid, grace_s=5)


@pytest.fixture(scope="module")
def head(manifest: Path) -> ClientHead:
    return ClientHead.load(manifest, device="cpu")


def _hops(nodes: list[NodeProcess], ports: list[int] | None = None) -> list[Hop]:
    """The circuit's hops (through `ports` instead of the nodes' own ports, when given)."""
    out = []
    for index, node in enumerate(nodes):
        url = node.url if ports is None else node.url.rsplit(":", 1)[0] + f":{ports[index]}"
        out.append(Hop(url=url, shard=node.shard, key=node.key))
    return out


async def _generate(
    head: ClientHead, hops: list[Hop], manifest: Path, new_tokens: int = NEW_TOKENS
) -> list[int]:
    m = Manifest.load(manifest)
    async with aiohttp.ClientSession() as http:
        await check_circuit(http, hops, m.model_hash, m.total_layers)
        async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
            ids = head.chat_ids(QUESTION)
            return [t async for t in client.generate(head, ids, max_new_tokens=new_tokens)]


def test_tls_circuit_gives_the_plaintext_circuits_greedy_tokens(net, head, manifest) -> None:
    tls_hops, plain_hops = _hops(net["tls"]), _hops(net["plain"])
    assert all(h.url.startswith("https://") and h.key for h in tls_hops)
    assert all(h.url.startswith("http://") and h.key is None for h in plain_hops)
    over_tls = asyncio.run(_generate(head, tls_hops, manifest))
    over_plain = asyncio.run(_generate(head, plain_hops, manifest))
    assert len(over_tls) == NEW_TOKENS
    assert over_tls == over_plain


def test_a_node_without_the_expected_key_is_refused_by_name_and_keeps_serving(
    net, head, manifest
) -> None:
    a, b = net["tls"]
    swapped = [Hop(a.url, 0, b.key), Hop(b.url, 1, b.key)]  # A cannot prove B's key
    with pytest.raises(NodeKeyMismatchError) as refused:
        asyncio.run(_generate(head, swapped, manifest))
    assert refused.value.code == "node_key_mismatch" and a.url in refused.value.message

    async def forward_to_a_liar() -> dict[str, Any]:
        # the client's open tells A that B holds A's key: A's own dial to B refuses it
        nxt = {"url": b.url, "shard": 1, "feed": "f" * 43, "key": a.key}
        body = {"op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None}
        pin = link_ssl(a.url, a.key, plaintext_ok=False)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"{a.url}/v1/stream", ssl=pin) as ws,
        ):
            await ws.send_json({**body, "next": nxt})
            return json.loads((await ws.receive(timeout=30)).data)

    answer = asyncio.run(forward_to_a_liar())
    assert answer["op"] == "error" and answer["code"] == "node_key_mismatch", answer
    assert all(pid_alive(n.pid) for n in net["tls"])
    assert len(asyncio.run(_generate(head, _hops(net["tls"]), manifest))) == NEW_TOKENS


def _leaks(recorded: bytes, head: ClientHead, capabilities: list[str]) -> dict[str, bool]:
    rows = head.embed_np(head.chat_ids(QUESTION))[0]
    # the prompt's rows as either wire dtype carries them (float16 by default, float32 on request)
    windows = [
        np.ascontiguousarray(rows[i]).astype(dtype).tobytes()[:64]
        for i in range(0, len(rows), 7)
        for dtype in ("<f4", "<f2")
    ]
    return {
        "http": b"/v1/stream" in recorded,
        "control_json": b'"op"' in recorded or b'"session"' in recorded,
        "capabilities": any(c.encode() in recorded for c in capabilities),
        "embeddings": any(w in recorded for w in windows),
    }


def test_wire_bytes_show_no_control_json_capabilities_or_activations_over_tls(
    net, head, manifest
) -> None:
    relay_ports = net["relays"]

    async def through_relays(nodes: list[NodeProcess], ports: list[int]) -> dict[str, bool]:
        relays = [Relay(port, node.port) for port, node in zip(ports, nodes, strict=True)]
        for relay in relays:
            await relay.start()
        try:
            hops = _hops(nodes, ports)
            m = Manifest.load(manifest)
            async with CircuitClient(hops, hidden_size=m.hidden_size) as client:
                secret = "s" * 43
                sid = await client.open(secret)
                ids = head.chat_ids(QUESTION)
                out = await client.prefill(sid, head.embed_np(ids))
                assert out.shape == (1, 1, m.hidden_size)
                await client.close(sid)
                capabilities = client.capabilities(secret) + client.feeds(secret)
            await asyncio.sleep(0.2)
        finally:
            for relay in relays:
                await relay.close()
        streams = [bytes(s) for relay in relays for s in relay.streams]
        # the prompt's activations went through (~95 kB in float16 frames, the default)
        assert sum(map(len, streams)) > 50_000
        return _leaks(b"".join(readable(s) for s in streams), head, capabilities)

    assert asyncio.run(through_relays(net["plain"], relay_ports[2:])) == {
        "http": True,
        "control_json": True,
        "capabilities": True,
        "embeddings": True,
    }  # the check finds them in clear
    assert asyncio.run(through_relays(net["tls"], relay_ports[:2])) == {
        "http": False,
        "control_json": False,
        "capabilities": False,
        "embeddings": False,
    }


async def _links(node: NodeProcess) -> dict[str, int]:
    """The node's next-hop link counters (/info `links`), over its pinned link."""
    pin = link_ssl(node.url, node.key, plaintext_ok=False)
    async with aiohttp.ClientSession() as http, http.get(f"{node.url}/info", ssl=pin) as answer:
        return (await answer.json())["links"]


async def _until(node: NodeProcess, ok: Any, timeout_s: float = 20.0) -> dict[str, int]:
    """The node's link counters once `ok(counters)` holds (AssertionError after timeout_s)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        links = await _links(node)
        if ok(links):
            return links
        assert asyncio.get_running_loop().time() < deadline, links
        await asyncio.sleep(0.1)


def test_next_hop_links_are_warm_shared_and_replaced_when_killed(net, head, manifest) -> None:
    async def run() -> None:
        # plaintext: A's link to B (its --next-hops node of shard 1, by /info) opens by itself
        plain = _hops(net["plain"])
        a = net["plain"][0]
        warm = await _until(a, lambda k: k["warm_targets"] >= 1 and k["open"] >= 1)
        first = await _generate(head, plain, manifest, new_tokens=4)
        assert len(first) == 4
        assert (await _links(a))["dialled"] == warm["dialled"]  # the question dialled nothing

        # TLS, B reached through a relay: a second question pays no TLS handshake at A
        b, a = net["tls"][1], net["tls"][0]
        relay = Relay(net["relays"][1], b.port)
        await relay.start()
        try:
            hops = _hops(net["tls"], [a.port, net["relays"][1]])
            before = (await _links(a))["dialled"]
            tokens = await _generate(head, hops, manifest, new_tokens=4)
            dialled = (await _links(a))["dialled"]
            assert dialled == before + 1  # A dialled B (through the relay) once
            assert await _generate(head, hops, manifest, new_tokens=4) == tokens
            assert (await _links(a))["dialled"] == dialled  # no new handshake
            relay.drop()  # A's pinned link to B dies underneath
            # A dials it again by itself, before any question
            await _until(a, lambda k: k["dialled"] == dialled + 1 and k["open"] >= 1)
            assert await _generate(head, hops, manifest, new_tokens=4) == tokens
            assert (await _links(a))["dialled"] == dialled + 1
        finally:
            await relay.close()

    asyncio.run(run())
