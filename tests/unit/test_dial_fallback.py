"""A node behind NAT reached at its next relay when the first is down (node/dial.py
`first_reachable`; its addresses from register_node `rendezvous`: node/gateway/router.py
`alternates_of`): the tries in order within one time bound, the first address's error when none
answers, a named refusal ending the tries; the router's /info and /health reads and the circuit
client's dial falling over; and, in one process over loopback, a tiny model's greedy tokens
through the second of two rendezvous relays fronting the first node while the first relay is
down."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nacl.signing import SigningKey

from node.client.circuit import CircuitClient
from node.client.info import node_info
from node.client.types import Hop
from node.dial import first_reachable
from node.gateway.node_info import InfoUnavailable
from node.gateway.router import (
    Circuit,
    RoutableNode,
    Router,
    alternates_of,
    routable_by_shard,
)
from node.model.head import ClientHead
from node.model.prepare import prepare
from node.server.backend import ModelShardBackend
from node.server.config import ServerConfig
from protocol.errors import UnavailableError
from tests.doubles.tiny_model import make_tiny_model
from tests.unit.fronting_relay import front_node
from tests.unit.stream_circuit import serve_circuit

pytestmark = pytest.mark.unit

KEY = "ab" * 32


async def test_first_reachable_uses_the_next_address_when_the_first_refuses(caplog) -> None:
    tried: list[str] = []

    async def attempt(url: str) -> str:
        tried.append(url)
        if url == "https://1.1.1.1:9200":
            raise ConnectionRefusedError("refused")
        return f"link to {url}"

    urls = ["https://1.1.1.1:9200", "https://2.2.2.2:9201", "https://3.3.3.3:9202"]
    with caplog.at_level(logging.INFO, logger="node.dial"):
        used = await first_reachable(urls, attempt, total_s=5.0)
    assert used == ("https://2.2.2.2:9201", "link to https://2.2.2.2:9201")
    assert tried == urls[:2]
    assert "reached at https://2.2.2.2:9201, its address 2 of 3" in caplog.text


async def test_first_reachable_leaves_a_silent_address_within_the_bound() -> None:
    async def attempt(url: str) -> str:
        if url.endswith(":1"):
            await asyncio.Event().wait()  # a relay that never answers
        return url

    assert await first_reachable(["http://a:1", "http://b:2"], attempt, total_s=0.5) == (
        "http://b:2",
        "http://b:2",
    )


async def test_first_reachable_raises_the_first_addresses_error_when_none_answers() -> None:
    errors = {"http://a:1": ConnectionRefusedError("a"), "http://b:2": ConnectionResetError("b")}

    async def attempt(url: str) -> str:
        raise errors[url]

    with pytest.raises(ConnectionRefusedError) as raised:
        await first_reachable(list(errors), attempt, total_s=1.0)
    assert raised.value is errors["http://a:1"]


async def test_first_reachable_stops_at_an_error_it_is_not_told_to_fall_over() -> None:
    tried: list[str] = []

    async def attempt(url: str) -> str:
        tried.append(url)
        raise UnavailableError("a named refusal the caller raises itself")

    with pytest.raises(UnavailableError):
        await first_reachable(["http://a:1", "http://b:2"], attempt, total_s=1.0)
    assert tried == ["http://a:1"]


@pytest.mark.parametrize(
    ("rendezvous", "expected"),
    [
        (
            [
                {"relay": "aa" * 32, "endpoint": "https://93.184.216.1:9200"},
                {"relay": "bb" * 32, "endpoint": "https://93.184.216.2:9201"},
                {"relay": "cc" * 32, "endpoint": "https://93.184.216.3:9202"},
            ],
            ("https://93.184.216.2:9201", "https://93.184.216.3:9202"),
        ),
        ([{"endpoint": "http://93.184.216.2:9201"}], ()),  # plaintext: no key pin holds
        ([{"endpoint": "https://93.184.216.2:9201/x"}], ()),
        ([{"endpoint": "https://10.0.0.2:9201"}], ()),  # not public
        ([{"endpoint": 9201}, "https://93.184.216.2:9201", None], ()),
        ([{"endpoint": "https://93.184.216.2:9201"}] * 2, ("https://93.184.216.2:9201",)),
        ("https://93.184.216.2:9201", ()),
        ([{"endpoint": f"https://93.184.216.{i}:9201"} for i in range(2, 9)],  # 3 read at most
         tuple(f"https://93.184.216.{i}:9201" for i in (2, 3, 4))),
    ],
)  # fmt: skip
def test_alternates_are_the_other_clean_public_https_relay_addresses(
    rendezvous: Any, expected: tuple[str, ...]
) -> None:
    entry = {"endpoint": "https://93.184.216.1:9200", "rendezvous": rendezvous}
    assert alternates_of(entry, "https://93.184.216.1:9200", public_only=True) == expected


def test_routable_node_carries_its_alternates() -> None:
    entry = {
        "key": KEY,
        "endpoint": "https://93.184.216.1:9200",
        "shards": [0],
        "routable": True,
        "rendezvous": [
            {"relay": "aa" * 32, "endpoint": "https://93.184.216.1:9200"},
            {"relay": "bb" * 32, "endpoint": "https://93.184.216.2:9201"},
        ],
    }
    (node,) = routable_by_shard([entry], 1)[0]
    assert node.addresses == ("https://93.184.216.1:9200", "https://93.184.216.2:9201")


class Reader:
    """The router's /info and /health reader, answering only at `live`."""

    timeout_s = 3.0
    observe_s = 2.0

    def __init__(self, live: str) -> None:
        self.live = live
        self.asked: list[str] = []

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        self.asked.append(url)
        if url != self.live:
            raise InfoUnavailable("connection refused")
        return {"model_hash": "m", "shard": 0, "layers": [0, 4]}

    async def healthy(self, url: str, key: str, timeout_s: float) -> bool:
        self.asked.append(url)
        return url == self.live


def _router(reader: Reader) -> Router:
    """A router that reads nodes only through `reader` (no committee, no HTTP)."""
    return Router(
        None,  # type: ignore[arg-type]
        model_hash="m",
        shard_layers=[(0, 4)],
        http=None,  # type: ignore[arg-type]
        info=reader,  # type: ignore[arg-type]
    )


async def test_router_reads_info_and_health_at_the_next_relay() -> None:
    reader = Reader("https://93.184.216.2:9201")
    router = _router(reader)
    node = RoutableNode(
        KEY, "https://93.184.216.1:9200", 0, alternates=("https://93.184.216.2:9201",)
    )
    assert (await router.read_info(node, True))["shard"] == 0
    assert await router.healthy(node, 2.0)
    assert reader.asked == [*node.addresses, *node.addresses]
    alone = RoutableNode(KEY, "https://93.184.216.1:9200", 0)
    with pytest.raises(InfoUnavailable):
        await router.read_info(alone, True)
    assert not await router.healthy(alone, 2.0)


class SlowFirst(Reader):
    """A reader whose first address answers, but only after `delay_s` (a NAT node over slow
    links, its relay and TLS in between); the second never does."""

    timeout_s = 0.4

    def __init__(self, live: str, delay_s: float) -> None:
        super().__init__(live)
        self.delay_s = delay_s

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        if url == self.live:
            await asyncio.sleep(self.delay_s)
        return await super().info(url, key, ssl, timeout_s)

    async def healthy(self, url: str, key: str, timeout_s: float) -> bool:
        if url == self.live:
            await asyncio.sleep(self.delay_s)
        return await super().healthy(url, key, timeout_s)


async def test_a_node_behind_nat_gets_at_its_first_address_the_time_one_address_gets() -> None:
    """The failover probe and the /info read give a node's first address the whole bound a
    node with one address gets, then try its next relay: splitting the bound between its
    addresses made a healthy NAT node over 50 ms links fail the probe after another hop's
    failure, and the gateway swapped it out of the circuit (test_devnet_hosts' failover)."""
    first = "https://93.184.216.1:9200"
    reader = SlowFirst(first, delay_s=0.3)  # within the 0.4 s bound, over half of it
    router = _router(reader)
    node = RoutableNode(KEY, first, 0, alternates=("https://93.184.216.2:9201",))
    assert await router.healthy(node, 0.4)
    assert (await router.read_info(node, True))["shard"] == 0
    assert reader.asked == [first, first]  # answered at the first: the next never asked


class Frozen(Reader):
    """A reader whose node at `frozen` takes the connection and never answers (SIGSTOPped)."""

    timeout_s = 0.2

    def __init__(self, live: str, frozen: str) -> None:
        super().__init__(live)
        self.frozen = frozen

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        if url == self.frozen:
            self.asked.append(url)
            await asyncio.Event().wait()  # until the caller's bound cancels it
        return await super().info(url, key, ssl, timeout_s)


async def test_a_node_that_never_answers_its_info_is_unavailable_and_the_route_goes_on() -> None:
    """A replica frozen mid-failover (test_gateway_payments_network's hang-up test, flaky under
    load): the dial's bound ran out first and its TimeoutError escaped the router's /info read,
    so the replacement's verification ended the question with aiohttp's 504. Now the frozen
    node is unavailable like any other: cooled, and the failed hop tried again."""
    live, frozen = "https://93.184.216.1:9200", "https://93.184.216.2:9200"
    reader = Frozen(live, frozen)
    router = _router(reader)
    stuck = RoutableNode("cd" * 32, frozen, 0)
    with pytest.raises(InfoUnavailable):
        await router.read_info(stuck, True)

    class Source:
        async def compute_nodes(self) -> list[dict[str, Any]]:
            return [
                {"key": KEY, "endpoint": live, "shards": [0], "routable": True},
                {"key": "cd" * 32, "endpoint": frozen, "shards": [0], "routable": True},
            ]

    router.source = Source()  # type: ignore[assignment]
    router.public_only = False
    router.refresh_s = 0
    failed = Circuit((RoutableNode(KEY, live, 0),))
    replaced = await router.replace(failed, [0])  # its shard's other node is the frozen one
    assert frozen in reader.asked  # verified, found unavailable
    assert replaced.keys == (KEY,)  # the failed hop's node again, after the caller's backoff
    assert router._cooling(stuck)


async def test_node_info_at_addresses_that_never_answer_is_a_named_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NAT node's every address takes the connection and says nothing: `node_info` names it
    unavailable (its contract), where the dial's TimeoutError escaped to `planet ask`."""
    import node.client.info as info_module

    monkeypatch.setattr(info_module, "INFO_FALLBACK_S", 0.4)
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    servers = [await asyncio.start_server(silent, "127.0.0.1", 0) for _ in range(2)]
    urls = [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(UnavailableError, match="no /info answer"):
                await node_info(http, Hop(urls[0], 0, alternates=(urls[1],)), plaintext_links=True)
    finally:
        for writer in held:
            writer.close()
        for server in servers:
            server.close()
            await server.wait_closed()


# -- over loopback: two relays front the first node; the first goes down ------------------------


async def test_answer_comes_through_the_second_relay_when_the_first_is_down(
    aiohttp_server, tmp_path: Path
) -> None:
    make_tiny_model(tmp_path / "src", layers=4, hidden=64, tied=False)
    manifest = prepare(tmp_path / "src", parts=2, out=tmp_path / "p2", progress=lambda _: None)
    head = ClientHead.load(manifest, device="cpu")
    ids = head.encode("w1 w7 w3 w40 w5")
    servers, hops = await serve_circuit(
        aiohttp_server,
        [
            (
                ServerConfig(manifest_path=manifest, shard_id=shard),
                ModelShardBackend(manifest, shard, device="cpu"),
            )
            for shard in range(2)
        ],
    )

    async def answer(circuit: list[Hop]) -> list[int]:
        async with CircuitClient(circuit, hidden_size=64, request_timeout_s=20) as client:
            return [t async for t in client.generate(head, ids, max_new_tokens=6)]

    direct = await answer(hops)
    local = ("127.0.0.1", servers[0].port)
    node_key = SigningKey.generate()
    first, first_link, at_first = await front_node(node_key, local)
    second, second_link, at_second = await front_node(node_key, local)
    try:
        fronted = Hop(at_first, 0, alternates=(at_second,))
        assert await answer([fronted, hops[1]]) == direct  # through the first relay
        first_link.cancel()
        await first.cleanup()  # the first relay is down: its port refuses
        async with aiohttp.ClientSession() as http:
            assert (await node_info(http, fronted))["shard"] == 0
        assert await answer([fronted, hops[1]]) == direct
        with pytest.raises(UnavailableError):  # without the second address: not reached
            await answer([Hop(at_first, 0), hops[1]])
    finally:
        first_link.cancel()
        second_link.cancel()
        await second.cleanup()
