"""An exit relay and a node behind NAT (node/relay/exit_addresses.py, node/relay/relay.py): when
the URL the onion names is not reached, the exit dials the other addresses the pinned node key
registered on the committee, in their order, each judged by the relay's address policy and
pinned to the key.

- which addresses a `/node` view gives (untrusted): the endpoint, then the rendezvous
  addresses, https:// only, canonical, distinct; none unless it is that key's routable (or
  graced) compute node;
- the committee is asked once per key and CACHE_S, misses and failures included;
- over loopback (a real relay, a TLS node pinned to its key): a path set up to the node's dead
  first address comes up at its registered second one, and the next path takes that link
  without waiting for the dead address again; a registered address the relay's
  policy refuses (private without --allow-private-next-hops, a host name) is never dialled and
  the path is destroyed by name; a relay without a committee does not fall back; another
  node's server at a registered address fails the pin.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.ports import ephemeral_port
from node.links import server_context
from node.relay.exit_addresses import ExitAddresses, registered_addresses
from node.relay.relay import Relay, create_app
from protocol.errors import RemoteError
from protocol.overlay import Cell, CellKind, Hop, build_onion

pytestmark = pytest.mark.unit

KEY = "ab" * 32
RELAY_A = "cd" * 32


def _view(**fields: Any) -> dict[str, Any]:
    view = {
        "key": KEY,
        "role": "compute",
        "routable": True,
        "grace": False,
        "endpoint": "https://203.0.113.7:44001",
        "rendezvous": [
            {"relay": RELAY_A, "endpoint": "https://203.0.113.7:44001"},
            {"relay": "ef" * 32, "endpoint": "https://198.51.100.9:44002"},
        ],
    }
    return view | fields


def test_registered_addresses_are_the_endpoint_then_the_rendezvous_ones() -> None:
    assert registered_addresses(_view(), KEY) == (
        "https://203.0.113.7:44001",
        "https://198.51.100.9:44002",
    )
    graced = _view(routable=False, grace=True)  # DOWN lately, otherwise routable: a fallback
    assert len(registered_addresses(graced, KEY)) == 2
    odd = _view(
        endpoint="HTTPS://203.0.113.7:44001/",  # canonical form compared
        rendezvous=[
            {"relay": RELAY_A, "endpoint": "http://198.51.100.9:44003"},  # not pinned: left out
            "https://198.51.100.9:44005",  # not an entry
            {"relay": RELAY_A, "endpoint": "https://198.51.100.9:44006"},
            {"relay": RELAY_A, "endpoint": "https://198.51.100.9:44007"},  # past the third
        ],
    )
    assert registered_addresses(odd, KEY) == (
        "https://203.0.113.7:44001",
        "https://198.51.100.9:44006",
    )
    bent = _view(rendezvous=[{"relay": RELAY_A, "endpoint": "https://198.51.100.9:044004"}])
    assert registered_addresses(bent, KEY) == ("https://203.0.113.7:44001",)  # not canonical


@pytest.mark.parametrize(
    "view",
    [
        None,
        "node",
        _view(key="ef" * 32),  # another key's registration
        _view(role="relay"),
        _view(role="verifier"),
        _view(routable=False),  # neither routable nor graced
        _view(routable="true"),
        _view(endpoint=None, rendezvous="https://198.51.100.9:44002"),
    ],
)
def test_no_addresses_from_a_view_that_is_not_the_keys_routable_compute_node(view: Any) -> None:
    assert registered_addresses(view, KEY) == ()


class Views:
    """A committee's `/node` answers, counted; `fail` raises as an unreachable RPC does."""

    def __init__(self, views: dict[str, Any], fail: bool = False) -> None:
        self.views = views
        self.fail = fail
        self.asked: list[str] = []

    async def node(self, key: str) -> dict[str, Any] | None:
        self.asked.append(key)
        if self.fail:
            raise RemoteError("committee", "unavailable", "down")
        return self.views.get(key)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_committee_is_asked_once_per_key_and_cache_time() -> None:
    views, clock = Views({KEY: _view()}), Clock()
    exits = ExitAddresses(views, cache_s=10.0, clock=clock)
    first = await exits.fallbacks("https://203.0.113.7:44001/", KEY)
    assert first == ("https://198.51.100.9:44002",)  # the named URL itself left out
    assert await exits.fallbacks("https://198.51.100.9:44002", KEY) == (
        "https://203.0.113.7:44001",
    )
    assert await exits.addresses("ef" * 32) == ()  # not registered: a miss, cached too
    assert await exits.addresses("ef" * 32) == ()
    assert await exits.addresses("not a key") == ()  # never asked
    assert views.asked == [KEY, "ef" * 32]
    clock.now += 10.5
    await exits.addresses(KEY)
    assert views.asked == [KEY, "ef" * 32, KEY] and exits.lookups == 3


async def test_a_committee_that_does_not_answer_gives_no_fallback() -> None:
    views = Views({KEY: _view()}, fail=True)
    exits = ExitAddresses(views, clock=Clock())
    assert await exits.fallbacks("https://203.0.113.7:44001", KEY) == ()
    assert await exits.fallbacks("https://203.0.113.7:44001", KEY) == ()  # cached for a while
    assert views.asked == [KEY]


# ------------------------------------------------------------------------------ over loopback
async def _serve(app: web.Application, ssl: Any = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = ephemeral_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl).start()
    return runner, port


def _node_app(reached: list[str]) -> web.Application:
    """A node's /v1/overlay door that only counts the exits that reached it."""

    async def door(request: web.Request) -> web.WebSocketResponse:
        reached.append(request.path)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get("/v1/overlay", door)
    return app


async def _setup(relay_url: str, relay_key: bytes, node_url: str, node_key: str) -> list[Cell]:
    """Send one path's SETUP to the relay (it is the path's exit) and return its answer."""
    onion, _ = build_onion([Hop(relay_url, relay_key)], node_url, node_key)
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{relay_url}/v1/relay") as ws:
        await ws.send_bytes(Cell(CellKind.SETUP, 7, onion).to_bytes())
        message = await ws.receive(timeout=30)
        return [Cell.from_bytes(message.data)]


async def test_the_exit_reaches_a_node_behind_nat_at_its_registered_second_address() -> None:
    node_key = SigningKey.generate()
    key = node_key.verify_key.encode().hex()
    reached: list[str] = []
    node, node_port = await _serve(_node_app(reached), server_context(node_key))
    impostor_key = SigningKey.generate()  # another node at an address the key registered
    impostor, impostor_port = await _serve(_node_app(reached), server_context(impostor_key))
    dead = f"https://127.0.0.1:{ephemeral_port()}"  # its first relay: down, the port refuses
    live = f"https://127.0.0.1:{node_port}"
    stray = f"https://127.0.0.1:{impostor_port}"
    views = Views(
        {
            key: _view(
                key=key,
                endpoint=dead,
                rendezvous=[
                    {"relay": RELAY_A, "endpoint": dead},
                    {"relay": RELAY_A, "endpoint": stray},
                    {"relay": RELAY_A, "endpoint": live},
                ],
            )
        }
    )
    runners = [node, impostor]
    try:
        private = PrivateKey.generate()
        relay = Relay(private, allow_private=True, exits=ExitAddresses(views))
        runner, port = await _serve(create_app(relay))
        runners.append(runner)
        url, public = f"http://127.0.0.1:{port}", bytes(private.public_key)
        assert await _setup(url, public, dead, key) == [Cell(CellKind.CREATED, 7)]
        assert relay.exit_fallbacks == 1 and views.asked == [key]
        # the impostor's handshake failed the pin before its door was reached; the node's did
        assert reached == ["/v1/overlay"]
        assert [link.url for link in relay.links.values()] == [f"{live}/v1/overlay"]
        # the next path to that node (its lookup fresh) takes the open link: no dial at all,
        # the dead first address not waited for again, the committee not asked again
        dials: list[str] = []
        relay_link = relay._link

        async def recorded(url_: str, suffix: str, key_: str | None) -> Any:
            dials.append(url_)
            return await relay_link(url_, suffix, key_)

        relay._link = recorded  # type: ignore[method-assign]
        assert await _setup(url, public, dead, key) == [Cell(CellKind.CREATED, 7)]
        assert dials == [] and relay.exit_fallbacks == 2 and views.asked == [key]

        # a relay without a committee dials the onion's URL only
        bare_private = PrivateKey.generate()
        bare = Relay(bare_private, allow_private=True)
        runner, port = await _serve(create_app(bare))
        runners.append(runner)
        bare_url = f"http://127.0.0.1:{port}"
        answer = await _setup(bare_url, bytes(bare_private.public_key), dead, key)
        assert answer == [Cell(CellKind.DESTROY, 7)] and bare.exit_fallbacks == 0

        # the relay's own policy judges each registered address: loopback without
        # --allow-private-next-hops is refused, nothing is dialled, the path destroyed
        strict_private = PrivateKey.generate()
        strict = Relay(strict_private, exits=ExitAddresses(views))
        runner, port = await _serve(create_app(strict))
        runners.append(runner)
        before = list(reached)
        public_dead = "https://192.0.2.1:9"  # the onion's URL: not reached (TEST-NET-1)
        strict.exits = ExitAddresses(
            Views(
                {
                    key: _view(
                        key=key,
                        endpoint=public_dead,
                        rendezvous=[
                            {"relay": RELAY_A, "endpoint": live},  # private: refused by the policy
                        ],
                    )
                }
            )
        )

        dialled: list[str] = []
        real_link = strict._link

        async def counted(url: str, suffix: str, key_: str | None) -> Any:
            dialled.append(url)
            if url == public_dead:
                raise aiohttp.ClientConnectionError("no route")
            return await real_link(url, suffix, key_)

        strict._link = counted  # type: ignore[method-assign]
        answer = await _setup(
            f"http://127.0.0.1:{port}", bytes(strict_private.public_key), public_dead, key
        )
        assert answer == [Cell(CellKind.DESTROY, 7)]
        assert dialled == [public_dead] and reached == before and strict.exit_fallbacks == 0
    finally:
        for runner in reversed(runners):  # the relays first: they close their links to the node
            await runner.cleanup()
