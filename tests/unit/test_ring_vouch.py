"""Ring vouches (docs/overlay.md, *The ring*; protocol/ring_vouch.py): the last hop of a ring
session sends the client the digest of every row it produced, and the client checks each ring
token's row against it. Real tiny models on in-process nodes over loopback: an honest ring gives
the same tokens; a first node that fabricates a row AND the token that row gives is caught at
that token; a last hop that vouches falsely stops the session with both hops blamed; hostile
vouch messages are refused by name without stopping the node or the client's other sessions."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

import node.client.ring as client_ring
import node.server.ring_vouch as server_vouch
from node.client.circuit import CircuitClient
from node.client.ring import generate_ring, ring_tokens
from node.client.sampling import SamplingConfig
from node.model.head import ClientHead
from node.server.ring import RingLoop
from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.errors import FrameError
from protocol.ring import RingMismatchError
from protocol.ring_vouch import (
    MAX_VOUCHES,
    RING_VOUCH_KIND,
    VouchError,
    pack_ring_vouch,
    parse_ring_vouch,
    row_digest,
)
from tests.unit.ring_nodes import (
    greedy_tokens,
    hops_of,
    learn_features,
    start_nodes,
    tiny_ring_model,
)

pytestmark = pytest.mark.unit

PROMPT = "w1 w7 w3 w40 w5 w99 w12 w8 w9 w10 w11 w2"
STEPS = 10
H = 64
LIE_AT = 4  # the token (1-based) at which a node lies


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[int, Path]]:
    return tiny_ring_model(tmp_path_factory.mktemp("tiny-vouch"), H)


def _expected(model: Any, ids: list[int]) -> list[int]:
    return greedy_tokens(model, ids, STEPS)


async def _ring(client: CircuitClient, head: Any, ids: list[int], **kw: Any) -> list[int]:
    return [
        t
        async for t in generate_ring(
            client, head, ids, max_new_tokens=STEPS, stop_on_eos=False, timeout_s=10, **kw
        )
    ]


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions the client checked against a vouch, in order."""
    checked: list[int] = []
    real = client_ring.check_vouched

    async def counting(client: Any, sid: int, book: Any, position: int, row: bytes) -> None:
        await real(client, sid, book, position, row)
        checked.append(position)

    monkeypatch.setattr(client_ring, "check_vouched", counting)
    return checked


# ------------------------------------------------------------------------------ honest rings
@pytest.mark.parametrize("parts", [1, 2, 3])
async def test_ring_vouch_honest_ring_same_tokens_every_token_checked_but_k1(
    aiohttp_server, tiny, parts, monkeypatch
):
    model, manifests = tiny
    head = ClientHead.load(manifests[parts], device="cpu")
    ids = head.encode(PROMPT)
    shards = list(range(parts))
    servers = await start_nodes(aiohttp_server, manifests[parts], shards)
    checked = _count_checks(monkeypatch)
    async with CircuitClient(
        hops_of(servers, shards), hidden_size=H, dtype="float32", prefill_chunk=5
    ) as client:
        await learn_features(client)
        assert client.vouch_ready() == (parts > 1)  # one node: first and last are the same
        ring = await _ring(client, head, ids)
        assert not client.vouches  # closed with its session
    assert ring == _expected(model, ids)
    n = len(ids)
    assert checked == ([] if parts == 1 else list(range(n - 1, n - 1 + STEPS)))


async def test_ring_vouch_bytes_per_token_measured_on_the_last_hops_link(
    aiohttp_server, tiny, monkeypatch
):
    """The vouching adds what the client receives from the last hop: one small message per
    batch of its outputs, a vouch for each (printed for the report)."""
    import node.client.circuit as circuit

    model, manifests = tiny
    head = ClientHead.load(manifests[2], device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, manifests[2], [0, 1])
    sizes: list[int] = []
    real = circuit._Link._vouch

    def counting(self: Any, data: bytes) -> None:
        sizes.append(len(data))
        real(self, data)

    monkeypatch.setattr(circuit._Link, "_vouch", counting)
    async with CircuitClient(
        hops_of(servers, [0, 1]), hidden_size=H, dtype="float32", prefill_chunk=64
    ) as client:
        await learn_features(client)
        assert await _ring(client, head, ids) == _expected(model, ids)
        assert not client.blame
    # the prompt's one chunk and STEPS - 1 decode steps: STEPS rows vouched for, 8 bytes of
    # header a message and 12 a vouch
    assert sum(sizes) == 8 * len(sizes) + 12 * STEPS and 1 <= len(sizes) <= STEPS
    wire = sum(sizes) + 2 * len(sizes)  # a server's WebSocket frame: 2 bytes of header here
    print(f"ring vouch: {wire} bytes in {len(sizes)} messages for {STEPS} tokens")


# ------------------------------------------------------------------------------ liars
def _fabricating_choose(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The first node, at its LIE_AT-th token, relays a row of its own making (not the last
    hop's) and the token the honest head picks from THAT row: the client's own head check
    passes; only the last hop's vouch tells."""
    honest = RingLoop._choose
    seen = {"n": 0, "honest": -1, "told": -1}

    async def fabricating(self: RingLoop, header: Any, body: bytes) -> tuple[int, bytes]:
        token, row = await honest(self, header, body)
        seen["n"] += 1
        if seen["n"] != LIE_AT:
            return token, row
        real = decode_values(header.dtype, "raw", (1, 1, self.hidden_size), row)
        rng = np.random.default_rng(7)
        for _ in range(1000):
            fake = (real + rng.normal(0, 4.0, real.shape)).astype(np.float32)
            steered = int(np.argmax(self.head.logits_np(fake[0, -1])))
            if steered != token:
                seen["honest"], seen["told"] = token, steered
                return steered, bytes(encode_body(fake, header.dtype, "raw"))
        raise AssertionError("no fabricated row steers the tiny model")

    monkeypatch.setattr(RingLoop, "_choose", fabricating)
    return seen


@pytest.mark.parametrize("parts", [2, 3])
async def test_ring_vouch_first_node_fabricating_row_and_its_token_caught_at_that_token(
    aiohttp_server, tiny, parts, monkeypatch
):
    """Fails on the code before vouches: the fabricated row gives the fabricated token, so
    the client's head check accepts it and the answer is steered."""
    model, manifests = tiny
    head = ClientHead.load(manifests[parts], device="cpu")
    ids = head.encode(PROMPT)
    shards = list(range(parts))
    servers = await start_nodes(aiohttp_server, manifests[parts], shards)
    seen = _fabricating_choose(monkeypatch)
    tokens: list[int] = []
    async with CircuitClient(hops_of(servers, shards), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        with pytest.raises(RingMismatchError) as caught:
            async for token in generate_ring(
                client, head, ids, max_new_tokens=STEPS, stop_on_eos=False, timeout_s=10
            ):
                tokens.append(token)
        sid = max(client.blame)
        # the client cannot tell the first hop's lie from a false vouch (or, K = 3, a middle
        # hop's altered relay): every hop
        assert client.suspects(sid) == set(range(parts))
    assert caught.value.code == "ring_token_mismatch"
    assert seen["told"] != seen["honest"]  # the lie would have steered the answer
    assert tokens == _expected(model, ids)[: LIE_AT - 1]  # stopped before the lie


async def test_ring_vouch_last_hop_false_vouch_stops_session_every_hop_blamed(
    aiohttp_server, tiny, monkeypatch
):
    model, manifests = tiny
    head = ClientHead.load(manifests[3], device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, manifests[3], [0, 1, 2])
    lie_at = len(ids) - 1 + LIE_AT - 1  # the row of the LIE_AT-th token
    real_add = server_vouch.VouchWriter.add

    def add(self: Any, position: int, row: bytes) -> None:
        real_add(self, position, row + b"x" if position == lie_at else row)  # another digest

    monkeypatch.setattr(server_vouch.VouchWriter, "add", add)
    tokens: list[int] = []
    async with CircuitClient(hops_of(servers, [0, 1, 2]), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        with pytest.raises(RingMismatchError):
            async for token in generate_ring(
                client, head, ids, max_new_tokens=STEPS, stop_on_eos=False, timeout_s=10
            ):
                tokens.append(token)
        assert client.suspects(max(client.blame)) == {0, 1, 2}  # not the first hop alone
    assert tokens == _expected(model, ids)[: LIE_AT - 1]


async def test_ring_vouch_false_vouch_failover_replaces_both_hops_and_continues(
    aiohttp_server, tiny, monkeypatch
):
    """`generate(ring=True)`: the first circuit's last hop vouches falsely once; the failover
    replaces both its first and its last hop and the greedy answer is the model's."""
    from node.client.failover import FailoverPolicy, generate
    from node.client.replicas import ReplicaCircuits
    from node.client.types import Timings
    from node.model.manifest import Manifest

    model, manifests = tiny
    manifest = manifests[2]
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode(PROMPT)
    shards = [0, 1, 0, 1]
    servers = await start_nodes(aiohttp_server, manifest, shards)
    hops = hops_of(servers, shards)
    lies = {"left": 1}
    real_add = server_vouch.VouchWriter.add

    def add(self: Any, position: int, row: bytes) -> None:
        if position == len(ids) - 1 + LIE_AT - 1 and lies["left"]:
            lies["left"] -= 1
            row = row + b"x"  # a digest of other bytes
        real_add(self, position, row)

    monkeypatch.setattr(server_vouch.VouchWriter, "add", add)
    loaded = Manifest.load(manifest)
    expected = {s.shard_id: (loaded.model_hash, s.layers) for s in loaded.shards}
    timings = Timings()
    async with aiohttp.ClientSession() as http:
        source = ReplicaCircuits(http, hops, expected=expected, hidden_size=H, prefill_chunk=5)
        tokens = [
            t
            async for t in generate(
                source,
                head,
                ids,
                max_new_tokens=STEPS,
                stop_on_eos=False,
                timings=timings,
                policy=FailoverPolicy(backoff_s=0.01),
                ring=True,
            )
        ]
    assert tokens == _expected(model, ids)
    (failover,) = timings.failovers
    assert failover.code == "ring_token_mismatch" and failover.hops == (0, 1)


# ------------------------------------------------------------------------------ hostile vouches
@pytest.mark.parametrize(
    ("message", "code"),
    [
        (b"", "bad_header"),
        (bytes([RING_VOUCH_KIND, 1, 0, 0]), "bad_header"),
        (bytes([RING_VOUCH_KIND, 9, 0, 0, 0, 1, 0, 1]) + bytes(12), "bad_header"),
        (bytes([0x01, 1, 0, 0, 0, 1, 0, 1]) + bytes(12), "bad_header"),
        (bytes([RING_VOUCH_KIND, 1, 0, 0, 0, 1, 0, 0]), "too_large"),
        (bytes([RING_VOUCH_KIND, 1, 0, 0, 0, 1, 1, 1]) + bytes(12 * 257), "too_large"),
        (bytes([RING_VOUCH_KIND, 1, 0, 0, 0, 1, 0, 2]) + bytes(12), "bad_body"),
        (bytes([RING_VOUCH_KIND, 1, 0, 0, 0, 1, 0, 1]) + bytes(13), "bad_body"),
        (pack_ring_vouch(1, [(5, bytes(8)), (5, bytes(8))]), "bad_positions"),
        (pack_ring_vouch(1, [(6, bytes(8)), (5, bytes(8))]), "bad_positions"),
        (pack_ring_vouch(1, [(2**31, bytes(8))]), "bad_positions"),
        (b"\x03" + bytes(10**6), "too_large"),
    ],
)
def test_ring_vouch_parse_hostile_refused_by_name(message, code):
    with pytest.raises(FrameError) as refused:
        parse_ring_vouch(message)
    assert refused.value.code == code


def test_ring_vouch_pack_parse_round_trip():
    items = [(i * 3, row_digest(bytes([i]))) for i in range(MAX_VOUCHES)]
    vouch = parse_ring_vouch(pack_ring_vouch(7, items))
    assert vouch.sid == 7 and list(zip(vouch.positions, vouch.digests, strict=True)) == items


def test_ring_vouch_open_field_only_on_a_rings_last_hop():
    from protocol.errors import ProtocolError
    from protocol.stream import NextHop, open_message, parse_control

    cap, feed = "a" * 22, "b" * 22
    ok = parse_control(_json(open_message(1, cap, 1, feed, None, back=True, vouch=True)), {"open"})
    assert ok.vouch and ok.back
    nxt = NextHop(url="http://127.0.0.1:1", shard=2, feed=feed)
    for bad in (
        open_message(1, cap, 1, feed, None, vouch=True),  # not back
        open_message(1, cap, 1, feed, nxt, back=True, vouch=True),  # not the last hop
        {**open_message(1, cap, 1, feed, None, back=True), "vouch": 1},
    ):
        with pytest.raises(ProtocolError) as refused:
            parse_control(_json(bad), {"open"})
        assert refused.value.code == "bad_control"


def _json(message: dict[str, Any]) -> str:
    import json

    return json.dumps(message)


async def _tokens(
    client: CircuitClient, head: Any, ids: list[int], sid: int, hook: Any
) -> list[int]:
    """Ring `sid`'s tokens; `hook(n)` runs after the n-th."""
    sampling = SamplingConfig()
    out: list[int] = []
    tokens = ring_tokens(
        client,
        sid,
        head,
        ids,
        max_new=STEPS,
        stop=frozenset(),
        sampling=sampling,
        rng=sampling.rng(),
        timeout_s=10,
    )
    try:
        async with contextlib.aclosing(tokens):
            async for token, _ in tokens:
                out.append(token)
                hook(len(out))
    finally:
        await client.close(sid)
    return out


async def test_ring_vouch_hostile_messages_to_client_refused_other_sessions_run_on(
    aiohttp_server, tiny
):
    """On the client's link to the last hop: malformed, oversized, for a sid no ring asked to
    vouch, or on the first hop's link: dropped by name, the sessions run on; a vouch beyond
    its session's positions stops that session (`bad_vouch`, the last hop blamed), no other."""
    model, manifests = tiny
    head = ClientHead.load(manifests[2], device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, manifests[2], [0, 1])
    expected = _expected(model, ids)
    async with CircuitClient(hops_of(servers, [0, 1]), hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        first, last = client.links
        victim, other = 101, 102

        def beyond(n: int) -> None:
            if n == 2:
                last._data(pack_ring_vouch(victim, [(10**6, bytes(8))]))

        def junk(n: int) -> None:
            if n == 1:
                for hostile in (
                    b"\x03",
                    b"\x03" + bytes(10**5),
                    pack_ring_vouch(4242, [(1, bytes(8))]),  # no such ring
                ):
                    last._data(hostile)
                # a false vouch for both rings, on the first hop's link
                first._data(pack_ring_vouch(other, [(len(ids) + 8, bytes(8))]))
                first._data(pack_ring_vouch(victim, [(len(ids) + 8, bytes(8))]))

        results = await asyncio.gather(
            _tokens(client, head, ids, victim, beyond),
            _tokens(client, head, ids, other, junk),
            return_exceptions=True,
        )
        assert isinstance(results[0], VouchError) and results[0].code == "bad_vouch"
        assert results[1] == expected  # every hostile message but the victim's was dropped
        assert client.suspects(victim) == {1}  # the last hop alone
        assert client.suspects(other) == set()
        assert await _tokens(client, head, ids, 103, lambda n: None) == expected  # links go on


async def test_ring_vouch_message_sent_to_a_node_refused_by_name_node_serves_on(
    aiohttp_server, tiny
):
    model, manifests = tiny
    head = ClientHead.load(manifests[2], device="cpu")
    ids = head.encode(PROMPT)
    servers = await start_nodes(aiohttp_server, manifests[2], [0, 1])
    hops = hops_of(servers, [0, 1])
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{hops[1].url}/v1/stream") as ws:
        await ws.send_bytes(pack_ring_vouch(1, [(0, bytes(8))]))
        answer = await ws.receive_json(timeout=10)
    assert answer["op"] == "error" and answer["code"] == "bad_header"
    async with CircuitClient(hops, hidden_size=H, dtype="float32") as client:
        await learn_features(client)
        assert await _ring(client, head, ids) == _expected(model, ids)


async def test_ring_vouch_book_bounds_and_checks():
    """The client's book: positions within 0 … last and after those vouched before, rows below
    the first token's not kept; a row vouched past but never for is a mismatch at once."""
    from node.client.ring_vouch import VouchBook
    from protocol.ring_vouch import RingVouch

    book = VouchBook(first=10, last=20, wait_s=5)
    book.take(RingVouch(1, (4, 9, 10), (b"a" * 8, b"b" * 8, row_digest(b"row10"))))
    assert set(book._digests) == {10}  # the prompt's chunks are not kept
    for positions in ((10,), (9,), (21,), (12, 21)):
        with pytest.raises(VouchError):
            book.take(RingVouch(1, positions, tuple(bytes(8) for _ in positions)))
    await book.check(10, b"row10", "nodes")
    book.take(RingVouch(1, (12,), (row_digest(b"row12"),)))
    with pytest.raises(RingMismatchError):
        await book.check(11, b"row11", "nodes")  # vouched past 11, never for it
    with pytest.raises(RingMismatchError):
        await book.check(12, b"another", "nodes")
    quick = VouchBook(first=0, last=5, wait_s=0.05)
    with pytest.raises(RingMismatchError):
        await quick.check(0, b"row0", "nodes")  # no vouch came within wait_s
    quick.fail(VouchError("bad"))
    with pytest.raises(VouchError):
        await quick.check(1, b"row1", "nodes")
