"""A circuit's next hop behind NAT (docs/overlay.md, *NAT rendezvous*): an open's
`next.alternates` (protocol/stream.py) names its addresses at its other relays.

- the parser takes 1..3 distinct https:// alternates with a key, and refuses every other form
  by name (`bad_route` naming the entry, `missing_node_key`); an open without them is the
  single-address open of before;
- every next-hop policy judges every address (node/server/next_hops.py): an alternate the
  node would refuse as `next.url` refuses the open, naming it;
- the node's link pool dials the addresses in turn, each pinned to the one key, and keeps
  using the one it reached (node/server/link_pool.py `reach`);
- the client sends what it knows (`Hop.alternates`, node/client/circuit.py `next_hop`), only
  to a previous hop whose /info advertises taking them (protocol/open_features.py): a node of
  before (its open grammar without them) opens the circuit's session all the same;
- over loopback, two relays front the circuit's SECOND node; with the first relay down the
  first node reaches it at its port on the second, and the tokens are the same.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nacl.signing import SigningKey

import node.server.app as app_module
import protocol.stream as stream_module
from node.client.circuit import CircuitClient, next_hop
from node.client.info import node_info
from node.client.types import Hop
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from node.server.link_pool import LinkPool
from node.server.next_hops import ForwardAny, ForwardCommittee, ForwardList, ForwardNone
from node.server.state import STATE_KEY
from protocol.errors import RemoteError
from protocol.frames.errors import FrameError
from protocol.open_features import OLD_NODE, OpenFeatures, open_features_of
from protocol.stream import (
    MAX_NEXT_ALTERNATES,
    DownstreamError,
    NextHop,
    NextHopNotAllowedError,
    open_message,
    parse_control,
)
from tests.doubles.old_open_node import without_features
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.fronting_relay import front_node
from tests.unit.stream_circuit import serve_circuit
from tests.unit.test_link_pool import Dialer

pytestmark = pytest.mark.unit

KEY = "ab" * 32
OTHER_KEY = "cd" * 32
FEED = "f" * 43
URL = "https://10.0.0.7:18100"
ALT = ("https://10.0.0.8:18101", "https://10.0.0.9:18102")
OPEN = frozenset({"open"})
MODEL = "sha256:" + "ab" * 32


def _open(nxt: dict[str, Any]) -> str:
    return json.dumps(
        {"op": "open", "sid": 1, "session": "s" * 43, "shard": 0, "feed": None, "next": nxt}
    )


def _next(**fields: Any) -> dict[str, Any]:
    return {"url": URL, "shard": 1, "feed": FEED, "key": KEY, **fields}


def _refusal(nxt: dict[str, Any]) -> FrameError:
    with pytest.raises(FrameError) as refused:
        parse_control(_open(nxt), OPEN)
    return refused.value


# ------------------------------------------------------------------------------ the parser
def test_open_with_alternates_parses_and_round_trips() -> None:
    hop = parse_control(_open(_next(alternates=list(ALT))), OPEN).next
    assert hop == NextHop(URL, 1, FEED, KEY, ALT)
    assert hop.addresses == (URL, *ALT)
    again = parse_control(json.dumps(open_message(1, "s" * 43, 0, None, hop)), OPEN)
    assert again.next == hop


def test_an_open_without_alternates_is_the_single_address_open_of_before() -> None:
    hop = parse_control(_open(_next()), OPEN).next
    assert hop is not None and hop.alternates == () and hop.addresses == (URL,)
    assert "alternates" not in open_message(1, "s" * 43, 0, None, hop)["next"]


def test_alternates_are_canonical() -> None:
    hop = parse_control(_open(_next(alternates=["HTTPS://10.0.0.8:18101/"])), OPEN).next
    assert hop is not None and hop.alternates == (ALT[0],)


@pytest.mark.parametrize(
    ("alternates", "code", "says"),
    [
        ("https://10.0.0.8:18101", "bad_route", "a list of 1..3"),
        ([], "bad_route", "a list of 1..3"),
        (
            [f"https://10.0.0.{i}:18101" for i in range(10, 10 + MAX_NEXT_ALTERNATES + 1)],
            "bad_route",
            "a list of 1..3",
        ),
        ([ALT[0], 7], "bad_route", "next.alternates[1]"),
        ([ALT[0], "https://10.0.0.9:18102/v1/stream"], "bad_route", "next.alternates[1]"),
        (["https://user@10.0.0.9:18102"], "bad_route", "next.alternates[0]"),
        (["https://10.0.0.9:18102" + "0" * 200], "bad_route", "next.alternates[0]"),
        (["http://10.0.0.8:18101"], "bad_route", "next.alternates[0] must be https://"),
        ([ALT[0], ALT[0]], "bad_route", "next.alternates[1] repeats"),
        ([URL], "bad_route", "next.alternates[0] repeats"),
        ([[ALT[0]]], "bad_route", "next.alternates[0]: a URL must be a string"),
        ([[[ALT[0]]]], "bad_control", "depth <= 4"),  # nesting past the control grammar's
    ],
)
def test_bad_alternates_are_refused_by_name(alternates: Any, code: str, says: str) -> None:
    refused = _refusal(_next(alternates=alternates))
    assert refused.code == code and says in refused.message, refused.message


def test_alternates_come_only_with_the_key_that_pins_them() -> None:
    refused = _refusal({"url": "http://127.0.0.1:18100", "shard": 1, "feed": FEED,
                        "alternates": [ALT[0]]})  # fmt: skip
    assert refused.code == "bad_control"  # {url, shard, feed, alternates}: not a next's form
    refused = _refusal(_next(key=None, alternates=[ALT[0]]))
    assert refused.code == "missing_node_key" and URL in refused.message


# ------------------------------------------------------------------------------ the policies
def _hop(*alternates: str, url: str = URL, key: str | None = KEY) -> NextHop:
    return NextHop(url, 1, FEED, key, tuple(alternates))


async def _refused(policy: Any, hop: NextHop) -> str:
    with pytest.raises(NextHopNotAllowedError) as refused:
        await policy.check(hop)
    return refused.value.message


async def test_a_list_node_dials_only_alternates_on_its_list() -> None:
    policy = ForwardList(0, frozenset({URL, ALT[0]}))
    await policy.check(_hop(ALT[0]))
    message = await _refused(policy, _hop(ALT[0], ALT[1]))
    assert ALT[1] in message and "--next-hops list" in message
    assert "forwards to no next hop" in await _refused(ForwardNone(0), _hop(ALT[0]))
    await ForwardAny(0).check(_hop(*ALT))


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rpc:
    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes

    async def abci_query(self, path: str) -> Any:
        return {"nodes": self.nodes}


def _entry(endpoint: str, key: str, *rendezvous: str, shard: int = 1) -> dict[str, Any]:
    return {
        "key": key,
        "endpoint": endpoint,
        "shards": [shard],
        "routable": True,
        "rendezvous": [{"relay": f"{i:064x}", "endpoint": url} for i, url in enumerate(rendezvous)],
    }


PUBLIC = "https://93.184.216.7:18100"
PUBLIC_ALT = ("https://93.184.216.8:18101", "https://93.184.216.9:18102")


async def test_a_committee_node_dials_an_alternate_only_where_that_key_registered_it() -> None:
    rpc = Rpc(
        [
            _entry(PUBLIC, KEY, PUBLIC, PUBLIC_ALT[0]),
            _entry("https://93.184.216.20:18100", OTHER_KEY, PUBLIC_ALT[1]),
        ]
    )
    policy = ForwardCommittee(0, rpc, MODEL, clock=Clock())
    await policy.check(_hop(PUBLIC_ALT[0], url=PUBLIC))
    # another node's relay address: a client cannot make this node dial it under KEY
    message = await _refused(policy, _hop(PUBLIC_ALT[1], url=PUBLIC))
    assert PUBLIC_ALT[1] in message and "(next.alternates)" in message
    # an address nobody registered
    message = await _refused(policy, _hop("https://93.184.216.99:18100", url=PUBLIC))
    assert "93.184.216.99" in message
    # registered for shard 1 only: the same alternate under a shard-2 claim is refused
    wrong_shard = ForwardCommittee(1, rpc, MODEL, clock=Clock())
    assert "shard 2" in await _refused(wrong_shard, NextHop(PUBLIC, 2, FEED, KEY, PUBLIC_ALT[:1]))


async def test_a_committee_node_refuses_a_private_alternate_even_if_registered() -> None:
    private = "https://127.0.0.1:6379"
    rpc = Rpc([_entry(PUBLIC, KEY, PUBLIC, private)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=Clock())
    message = await _refused(policy, _hop(private, url=PUBLIC))
    assert private in message and "not a public address" in message
    ranges = (ipaddress.ip_network("10.77.0.0/24"),)
    ranged = ForwardCommittee(
        0, rpc, MODEL, public_only=False, private_ranges=ranges, clock=Clock()
    )
    message = await _refused(ranged, _hop(private, url=PUBLIC))
    assert private in message and "outside this node's private next-hop ranges" in message
    message = await _refused(ranged, _hop("https://relay.example:443", url=PUBLIC))
    assert "names a host" in message


# ------------------------------------------------------------------------------ the link pool
async def test_the_pool_reaches_a_next_hop_at_its_second_address_pinned_to_its_key() -> None:
    dial = Dialer(fail={(URL, KEY)})
    pool = LinkPool(dial)
    link = await pool.reach((URL, *ALT), KEY)
    assert link.url == ALT[0] and dial.dials == [(ALT[0], KEY)]
    again = await pool.reach((URL, *ALT), KEY)  # the open link first: no dial at the first
    assert again is link and dial.dials == [(ALT[0], KEY)]
    assert pool.stats.dial_failures == 1
    await pool.close()


async def test_the_pool_names_the_first_addresses_refusal_when_none_is_reached() -> None:
    pool = LinkPool(Dialer(fail={(URL, KEY), (ALT[0], KEY)}))
    with pytest.raises(DownstreamError) as refused:
        await pool.reach((URL, ALT[0]), KEY)
    assert URL in refused.value.message
    await pool.close()


async def test_a_silent_first_address_gets_the_bound_one_address_gets(monkeypatch) -> None:
    monkeypatch.setattr("node.server.link_pool.ATTACH_TIMEOUT_S", 0.05)
    dialled: list[str] = []

    async def dial(url: str, key: str | None) -> Any:
        dialled.append(url)
        if url == URL:
            await asyncio.sleep(3600)  # a blackholed relay
        return await Dialer()(url, key)

    pool = LinkPool(dial)
    link = await pool.reach((URL, ALT[0]), KEY)
    assert link.url == ALT[0] and dialled == [URL, ALT[0]]
    silent = LinkPool(dial)
    with pytest.raises(DownstreamError):  # a named refusal, never a bare TimeoutError
        await silent.reach((URL,), KEY)
    await pool.close()
    await silent.close()


# ------------------------------------------------------------------------------ the client
TAKES = OpenFeatures(next_alternates=True)  # a previous hop whose /info lists next_alternates


def test_the_client_names_the_alternates_it_knows() -> None:
    hop = Hop(URL, 1, KEY, alternates=(ALT[0], URL, ALT[0], "http://10.0.0.9:1", ALT[1]))
    assert next_hop(hop, FEED, TAKES) == NextHop(URL, 1, FEED, KEY, ALT)
    many = Hop(URL, 1, KEY, alternates=tuple(f"https://10.0.1.{i}:1" for i in range(9)))
    assert len(next_hop(many, FEED, TAKES).alternates) == MAX_NEXT_ALTERNATES
    plain = Hop("http://127.0.0.1:1", 1, None, alternates=ALT)
    assert next_hop(plain, FEED, TAKES).alternates == ()


def test_the_client_names_no_alternates_to_a_previous_hop_of_before() -> None:
    """A previous hop that does not advertise `next_alternates` (none, or an unknown /info)
    gets the single-address open of before: it would refuse the field (`bad_control`)."""
    hop = Hop(URL, 1, KEY, alternates=ALT)
    for previous in (OLD_NODE, open_features_of({}), open_features_of({"open_features": []})):
        assert next_hop(hop, FEED, previous) == NextHop(URL, 1, FEED, KEY)
    assert next_hop(hop, FEED) == NextHop(URL, 1, FEED, KEY)  # unknown: a node of before
    body = open_message(1, "c" * 43, 0, None, next_hop(hop, FEED, OLD_NODE))
    assert "alternates" not in body["next"]


# ------------------------------------------------------------------------------ over loopback
async def test_the_previous_hop_reaches_the_next_at_its_second_relay(
    aiohttp_server, tmp_path: Path
) -> None:
    make_tiny_model(tmp_path / "src", layers=4, hidden=64, tied=False)
    manifest = prepare(tmp_path / "src", parts=2, out=tmp_path / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode("w1 w7 w3 w40 w5")
    keys = [SigningKey.generate() for _ in range(2)]
    servers, hops = await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=manifest, shard_id=shard),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(2)
        ],
        keys,
    )

    async def answer(circuit: list[Hop]) -> list[int]:
        async with CircuitClient(circuit, hidden_size=64, request_timeout_s=20) as client:
            async with aiohttp.ClientSession() as http:  # the first node's /info, as clients do
                info = await node_info(http, circuit[0])
            client.open_features[circuit[0].url] = open_features_of(info)
            return [t async for t in client.generate(head, ids, max_new_tokens=6)]

    direct = await answer(hops)
    local = ("127.0.0.1", servers[1].port)
    first, first_link, at_first = await front_node(keys[1], local, "https")
    second, second_link, at_second = await front_node(keys[1], local, "https")
    state = servers[0].app[STATE_KEY]
    state.next_hops = ForwardList(0, frozenset({at_first, at_second}))
    fronted = Hop(at_first, 1, hops[1].key, alternates=(at_second,))
    try:
        assert await answer([hops[0], fronted]) == direct  # through the first relay
        first_link.cancel()
        await first.cleanup()  # the first relay is down: its port refuses
        assert await answer([hops[0], fronted]) == direct  # through the second
        assert state.links.link(at_second, hops[1].key) is not None
        # an alternate off the node's list refuses the open, nothing dialled there
        state.next_hops = ForwardList(0, frozenset({at_first}))
        with pytest.raises(RemoteError) as refused:
            await answer([hops[0], fronted])
        assert refused.value.code == "next_hop_not_allowed" and at_second in str(refused.value)
    finally:
        first_link.cancel()
        second_link.cancel()
        await second.cleanup()


async def test_a_previous_hop_of_before_gets_no_alternates_and_opens_the_circuit(
    aiohttp_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The first node is a node of before (its open grammar without `next.alternates`, its
    /info without `open_features`: tests/doubles/old_open_node.py); the second is fronted by a
    relay and known with an alternate. The client reads the first node's /info and names the
    second without alternates: the session opens and the answer is the direct one. Told that
    the first node takes them (a wrong advertisement), the open is refused `bad_control`:
    what the advertisement spares the circuit."""
    make_tiny_model(tmp_path / "src", layers=4, hidden=64, tied=False)
    manifest = prepare(tmp_path / "src", parts=2, out=tmp_path / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode("w1 w7 w3 w40 w5")
    keys = [SigningKey.generate() for _ in range(2)]
    servers, hops = await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=manifest, shard_id=shard),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(2)
        ],
        keys,
    )
    old_fields = tuple(f for f in stream_module._NEXT_FIELDS if "alternates" not in f)
    monkeypatch.setattr(stream_module, "_NEXT_FIELDS", old_fields)
    monkeypatch.setattr(app_module, "info_body", without_features(app_module.info_body))

    async def answer(circuit: list[Hop], told: OpenFeatures | None = None) -> list[int]:
        async with CircuitClient(circuit, hidden_size=64, request_timeout_s=20) as client:
            async with aiohttp.ClientSession() as http:
                info = await node_info(http, circuit[0])
            assert "open_features" not in info  # a node of before advertises nothing
            client.open_features[circuit[0].url] = told or open_features_of(info)
            return [t async for t in client.generate(head, ids, max_new_tokens=6)]

    direct = await answer(hops)
    local = ("127.0.0.1", servers[1].port)
    relay, relay_link, fronted_url = await front_node(keys[1], local, "https")
    state = servers[0].app[STATE_KEY]
    state.next_hops = ForwardList(0, frozenset({fronted_url, ALT[0]}))
    fronted = Hop(fronted_url, 1, hops[1].key, alternates=(ALT[0],))
    try:
        assert await answer([hops[0], fronted]) == direct
        caplog.clear()
        with pytest.raises(RemoteError):  # the open refused (its frames then unknown_stream)
            await answer([hops[0], fronted], told=OpenFeatures(next_alternates=True))
        assert "alternates]]} (bad_control)" in caplog.text
    finally:
        relay_link.cancel()
        await relay.cleanup()
