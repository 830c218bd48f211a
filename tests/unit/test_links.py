"""Links bound to the node key (node/links.py, protocol/links.py): the node's certificate, TLS
1.3 only, the dialer's pin (a node proving another key is refused by name before any HTTP byte
and keeps serving), the handshake's proof of possession, next hops pinned by the forwarding
node, the plaintext rule, and a circuit over TLS giving the same tokens as over plaintext."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from nacl.signing import SigningKey

from node.client.circuit import CircuitClient
from node.client.info import node_info
from node.client.nodesfile import NodesFile
from node.client.types import Hop
from node.links import (
    NodeKeyPin,
    certificate_key,
    link_ssl,
    node_certificate,
    probe_context,
    server_context,
)
from node.server.app import STATE_KEY, create_app
from node.server.config import ServerConfig
from node.server.next_hops import ForwardCommittee, registered_hops
from protocol.errors import ConfigError, UnavailableError
from protocol.links import (
    MissingNodeKeyError,
    NodeKeyMismatchError,
    PlaintextLinkError,
    check_link,
    is_loopback,
)
from protocol.stream import NextHop, NextHopNotAllowedError, parse_control
from protocol.urls import BadUrlError
from tests.doubles.fake_shard import FakeShard
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit

H = 8
SEED = bytes(range(32))


def _hex(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


# ------------------------------------------------------------------------------ certificate
def test_certificate_is_the_node_key_self_signed_and_the_same_every_start() -> None:
    key = SigningKey(SEED)
    cert = node_certificate(key)
    der = cert.public_bytes(serialization.Encoding.DER)
    assert certificate_key(der) == _hex(key)
    public = cert.public_key()
    assert isinstance(public, ed25519.Ed25519PublicKey)
    public.verify(cert.signature, cert.tbs_certificate_bytes)  # self-signed by the node key
    assert node_certificate(SigningKey(SEED)).public_bytes(serialization.Encoding.DER) == der
    assert cert.serial_number > 0
    other = node_certificate(SigningKey.generate())
    assert other.serial_number != cert.serial_number


def test_certificate_key_of_garbage_or_no_certificate_is_none() -> None:
    assert certificate_key(None) is None
    assert certificate_key(b"") is None
    assert certificate_key(b"\x30\x03\x02\x01\x01") is None


def _tls_echo_server(context: ssl.SSLContext) -> tuple[socket.socket, threading.Thread]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_server_context_speaks_only_tls13() -> None:
    listener, thread = _tls_echo_server(server_context(SigningKey(SEED)))
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(listener.getsockname()) as raw, pytest.raises(ssl.SSLError):
        old.wrap_socket(raw).recv(2)
    thread.join(5)
    listener.close()
    listener, thread = _tls_echo_server(server_context(SigningKey(SEED)))
    with (
        socket.create_connection(listener.getsockname()) as raw,
        probe_context().wrap_socket(raw) as tls,
    ):
        assert tls.version() == "TLSv1.3" and tls.recv(2) == b"ok"
        assert certificate_key(tls.getpeercert(binary_form=True)) == _hex(SigningKey(SEED))
    thread.join(5)
    listener.close()


def test_handshake_proves_the_key_a_server_with_the_certificate_but_not_the_key_fails() -> None:
    """CertificateVerify: a server presenting the victim's certificate, signing with another
    key, fails the client's handshake although chain verification is off. OpenSSL will not
    even load such a pair, so the impostor speaks TLS 1.3 through tlslite-ng."""
    tlslite = pytest.importorskip("tlslite.api")
    victim, impostor = SigningKey.generate(), SigningKey.generate()
    pem = node_certificate(victim).public_bytes(serialization.Encoding.PEM).decode()
    wrong = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(impostor))
    wrong_pem = wrong.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        settings = tlslite.HandshakeSettings()
        settings.minVersion = (3, 4)
        with contextlib.suppress(Exception):  # the client's alert ends it
            tlslite.TLSConnection(conn).handshakeServer(
                certChain=tlslite.X509CertChain([tlslite.X509().parse(pem)]),
                privateKey=tlslite.parsePEMKey(wrong_pem, private=True),
                settings=settings,
            )
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with (
        socket.create_connection(listener.getsockname()) as raw,
        pytest.raises(ssl.SSLError, match=r"BAD_SIGNATURE|bad signature"),
    ):
        probe_context().wrap_socket(raw)
    thread.join(5)
    listener.close()


# ------------------------------------------------------------------------------ the rule
def test_link_rule_https_needs_a_key_http_only_on_loopback_or_in_local_mode() -> None:
    key = "ab" * 32
    assert check_link("https://10.0.0.7:18100", key, plaintext_ok=False) == key
    assert check_link("HTTPS://10.0.0.7:18100", key, plaintext_ok=False) == key
    with pytest.raises(MissingNodeKeyError) as missing:
        check_link("https://10.0.0.7:18100", None, plaintext_ok=True)
    assert missing.value.code == "missing_node_key"
    assert check_link("http://127.0.0.1:18100", None, plaintext_ok=False) is None
    assert check_link("http://[::1]:18100", None, plaintext_ok=False) is None
    for url in ("http://10.0.0.7:18100", "http://localhost:18100", "http://8.8.8.8:80"):
        with pytest.raises(PlaintextLinkError) as plain:
            check_link(url, None, plaintext_ok=False)
        assert plain.value.code == "plaintext_link"
        assert check_link(url, None, plaintext_ok=True) is None
    with pytest.raises(BadUrlError):
        check_link("wss://10.0.0.7:18100", key, plaintext_ok=True)
    assert is_loopback("http://127.8.9.10:1") and not is_loopback("http://localhost:1")
    assert isinstance(link_ssl("https://h:1", key, plaintext_ok=False), NodeKeyPin)
    assert link_ssl("http://127.0.0.1:1", None, plaintext_ok=False) is True
    assert NodeKeyPin(key) == NodeKeyPin(key) and hash(NodeKeyPin(key)) == hash(NodeKeyPin(key))
    assert NodeKeyPin(key) != NodeKeyPin("cd" * 32)


def test_open_names_the_next_hops_key_and_https_needs_one() -> None:
    feed, key = "f" * 43, "ab" * 32
    base = {"op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None}
    nxt = {"url": "https://10.0.0.8:18101", "shard": 1, "feed": feed, "key": key}
    control = parse_control(json.dumps({**base, "next": nxt}), frozenset({"open"}))
    assert control.next == NextHop("https://10.0.0.8:18101", 1, feed, key)
    with pytest.raises(MissingNodeKeyError):
        parse_control(json.dumps({**base, "next": {**nxt, "key": None}}), frozenset({"open"}))
    without = {k: v for k, v in nxt.items() if k != "key"}
    with pytest.raises(MissingNodeKeyError):
        parse_control(json.dumps({**base, "next": without}), frozenset({"open"}))
    plain = {**without, "url": "http://127.0.0.1:18101"}
    assert parse_control(json.dumps({**base, "next": plain}), frozenset({"open"})).next.key is None
    for bad in ("AB" * 32, "ab" * 31, 7, "zz" * 32):
        with pytest.raises(Exception) as refused:
            parse_control(json.dumps({**base, "next": {**nxt, "key": bad}}), frozenset({"open"}))
        assert getattr(refused.value, "code", "") == "bad_control"


def test_nodes_file_https_node_needs_its_key(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    node = {"url": "https://10.0.0.7:18100", "shard": 0, "layers": [0, 30]}
    path.write_text(json.dumps({"manifest": "m.json", "nodes": [node]}))
    with pytest.raises(ConfigError, match="give its node key"):
        NodesFile.load(path)
    path.write_text(json.dumps({"manifest": "m.json", "nodes": [{**node, "key": "ab" * 32}]}))
    loaded = NodesFile.load(path)
    assert loaded.nodes[0].key == "ab" * 32
    assert loaded.to_json()["nodes"][0]["key"] == "ab" * 32


async def test_committee_policy_pins_only_the_key_registered_at_that_url() -> None:
    good, other, url = "ab" * 32, "cd" * 32, "https://10.0.0.8:18101"

    class Source:
        async def abci_query(self, path: str) -> Any:
            entry = {"key": good, "endpoint": url, "shards": [1], "routable": True}
            return {"nodes": [entry]}

    assert registered_hops(await Source().abci_query("")) == {url: {1: frozenset({good})}}
    policy = ForwardCommittee(0, Source(), "sha256:" + "0" * 64, public_only=False)
    await policy.check(NextHop(url, 1, "f" * 43, good))
    with pytest.raises(NextHopNotAllowedError, match="under node key"):
        await policy.check(NextHop(url, 1, "f" * 43, other))


# ------------------------------------------------------------------------------ in-process nodes
async def _tls_node(aiohttp_server: Any, key: SigningKey, shard: int = 0, **config: Any) -> Any:
    app = create_app(
        ServerConfig(Path("m"), shard, **config), FakeShard(shard_id=shard, hidden_size=H)
    )
    requests: list[str] = []

    async def seen(request: Any, response: Any) -> None:
        requests.append(request.path)

    app.on_response_prepare.append(seen)
    server = await aiohttp_server(app, ssl=server_context(key))
    server.requests = requests
    return server


def _hop(server: Any, key: SigningKey | str, shard: int = 0) -> Hop:
    hexed = key if isinstance(key, str) else _hex(key)
    return Hop(str(server.make_url("")).rstrip("/"), shard, hexed)


async def test_pinned_link_works_and_a_wrong_key_is_refused_before_any_http(aiohttp_server):
    key = SigningKey.generate()
    server = await _tls_node(aiohttp_server, key)
    async with aiohttp.ClientSession() as http:
        assert (await node_info(http, _hop(server, key)))["shard"] == 0
        assert server.requests == ["/info"]
        with pytest.raises(NodeKeyMismatchError) as refused:
            await node_info(http, _hop(server, SigningKey.generate()))
        assert refused.value.code == "node_key_mismatch"
        assert _hex(key)[:16] in refused.value.message
        with pytest.raises(NodeKeyMismatchError):
            async with CircuitClient([_hop(server, "ab" * 32)], hidden_size=H):
                pass
        assert server.requests == ["/info"]  # nothing reached HTTP for the wrong keys
        assert (await node_info(http, _hop(server, key)))["shard"] == 0  # still serving
    with pytest.raises(MissingNodeKeyError):
        async with CircuitClient([Hop(_hop(server, key).url, 0)], hidden_size=H):
            pass


async def test_plain_http_to_a_tls_node_gets_nothing(aiohttp_server):
    key = SigningKey.generate()
    server = await _tls_node(aiohttp_server, key)
    plain_url = _hop(server, key).url.replace("https://", "http://")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(UnavailableError):  # a TLS port does not answer plain HTTP
            await node_info(http, Hop(plain_url, 0))
    assert server.requests == []


async def test_forwarding_node_pins_the_next_hops_key_from_the_open(aiohttp_server):
    """A's open names B's URL with a key B does not hold: A refuses by name
    (node_key_mismatch) and B never saw an HTTP request (the attach never left A)."""
    key_a, key_b = SigningKey.generate(), SigningKey.generate()
    b = await _tls_node(aiohttp_server, key_b, shard=1)
    a = await _tls_node(aiohttp_server, key_a, shard=0, next_hops=_any())
    hop_b = _hop(b, key_b, 1)
    open_message = {
        "op": "open", "sid": 1, "session": "c" * 43, "shard": 0, "feed": None,
        "next": {"url": hop_b.url, "shard": 1, "feed": "f" * 43, "key": "ab" * 32},
    }  # fmt: skip
    pin_a = link_ssl(_hop(a, key_a).url, _hex(key_a), plaintext_ok=False)
    pin_b = link_ssl(hop_b.url, _hex(key_b), plaintext_ok=False)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{_hop(a, key_a).url}/v1/stream", ssl=pin_a) as ws,
        http.ws_connect(f"{hop_b.url}/v1/stream", ssl=pin_b) as ws_b,
    ):
        await ws.send_json(open_message)
        answer = json.loads((await ws.receive(timeout=10)).data)
        assert answer["op"] == "error" and answer["code"] == "node_key_mismatch", answer
        assert b.requests == ["/v1/stream"]  # ours only: A's dial stopped at the handshake
        assert len(a.app[STATE_KEY].store) == 0  # nothing held for the refused session
        # with B's real key the same open goes through
        await ws_b.send_json(
            {"op": "open", "sid": 1, "session": "e" * 43, "shard": 1, "feed": "f" * 43,
             "next": None}
        )  # fmt: skip
        assert json.loads((await ws_b.receive(timeout=10)).data)["op"] == "opened"
        right = {**open_message["next"], "key": _hex(key_b)}
        await ws.send_json({**open_message, "sid": 2, "session": "d" * 43, "next": right})
        answer = json.loads((await ws.receive(timeout=10)).data)
        assert answer == {"op": "opened", "sid": 2}
        assert b.requests == ["/v1/stream", "/v1/stream"]


def _any() -> Any:
    from node.server.next_hops import NextHopSpec

    return NextHopSpec("any")


async def test_circuit_over_tls_gives_the_plaintext_circuits_outputs(aiohttp_server):
    keys = [SigningKey.generate() for _ in range(3)]

    def nodes() -> list[tuple[ServerConfig, Any]]:
        return [
            (ServerConfig(Path("m"), shard), FakeShard(shard_id=shard, hidden_size=H))
            for shard in range(3)
        ]

    outputs = []
    for circuit_keys in (None, keys):
        _, hops = await serve_circuit(aiohttp_server, nodes(), circuit_keys)
        async with CircuitClient(hops, hidden_size=H) as client:
            sid = await client.open("s" * 43)
            hidden = np.arange(5 * H, dtype=np.float32).reshape(1, 5, H)
            out = await client.prefill(sid, hidden)
            await client.send(sid, 5, out)
            outputs.append((out, await client.receive(sid, 5, 1)))
    assert hops[0].url.startswith("https://")
    for got, want in zip(outputs[1], outputs[0], strict=True):
        np.testing.assert_array_equal(got, want)
    hidden = np.arange(5 * H, dtype=np.float32).reshape(1, 5, H)
    np.testing.assert_array_equal(outputs[1][0][0, -1], hidden[0, -1] + 6)  # +1 +2 +3


async def test_a_circuit_whose_middle_node_lies_about_its_key_fails_by_name(aiohttp_server):
    keys = [SigningKey.generate() for _ in range(2)]
    nodes = [
        (ServerConfig(Path("m"), shard), FakeShard(shard_id=shard, hidden_size=H))
        for shard in range(2)
    ]
    _, hops = await serve_circuit(aiohttp_server, nodes, keys)
    hops[1] = Hop(hops[1].url, 1, "ab" * 32)  # what a stale registry would say
    with pytest.raises(NodeKeyMismatchError):
        async with CircuitClient(hops, hidden_size=H):
            pass
    await asyncio.sleep(0)
