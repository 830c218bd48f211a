"""Nothing a stranger names is dialled with redirects on: a registered endpoint (or a next hop)
that answers `302 → http://127.0.0.1:<canary>/admin` must never make a node, the gateway's
router, its circuits or a CLI client contact the canary (a real aiohttp server on loopback that
counts every request). And the gateway's router applies the nodes' public-address policy to
registered endpoints before it probes or dials them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node.client.circuit import CircuitClient
from node.client.types import Hop
from node.dial import RedirectRefused
from node.gateway.config import GatewayConfig
from node.gateway.errors import NoCircuit
from node.gateway.router import RoutableNode, Router, routable_by_shard
from node.gateway.run import node_session
from node.server.app import create_app as create_node_app
from node.server.config import ServerConfig
from node.server.next_hops import NextHopSpec
from node.server.state import STATE_KEY
from protocol.errors import UnavailableError
from protocol.stream import DownstreamError
from tests.doubles.fake_shard import FakeShard

pytestmark = pytest.mark.unit

MODEL_HASH = "sha256:" + "0" * 64


@pytest.fixture
async def canary(aiohttp_server) -> Any:
    """A loopback service no stranger may make us reach, and a redirector pointing at it."""
    hits: list[str] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(f"{request.method} {request.path}")
        return web.json_response({"model_hash": MODEL_HASH, "shard": 0, "layers": [0, 2]})

    target = web.Application()
    target.router.add_route("*", "/{tail:.*}", record)
    target_server = await aiohttp_server(target)
    location = str(target_server.make_url("/admin/flush"))

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(location)

    redirector = web.Application()
    redirector.router.add_route("*", "/{tail:.*}", redirect)
    redirector_server = await aiohttp_server(redirector)
    return str(redirector_server.make_url("")).rstrip("/"), hits


async def test_a_nodes_next_hop_link_never_follows_a_redirect(aiohttp_server, canary) -> None:
    redirector, hits = canary
    config = ServerConfig(manifest_path=Path("x"), shard_id=0, next_hops=NextHopSpec("any"))
    node = await aiohttp_server(create_node_app(config, FakeShard(shard_id=0, hidden_size=8)))
    links = node.app[STATE_KEY].links  # the DownLinks on the node's own client session
    with pytest.raises(DownstreamError):
        await links.get(redirector)
    assert hits == []


async def test_the_gateways_node_session_refuses_redirects(canary, tmp_path: Path) -> None:
    redirector, hits = canary
    config = GatewayConfig(
        evm_rpc="http://x",
        deployment=tmp_path / "d.json",
        committee_rpc="http://x",
        manifest=tmp_path / "m.json",
        wallet=tmp_path / "w.json",
        private_endpoints=True,  # loopback here; redirects are refused either way
    )
    http = node_session(config)
    try:
        with pytest.raises(RedirectRefused):
            await http.ws_connect(f"{redirector}/v1/stream")
        with pytest.raises(RedirectRefused):
            async with http.get(f"{redirector}/info"):
                pass
    finally:
        await http.close()
    assert hits == []


async def test_router_probes_never_follow_a_redirect(canary) -> None:
    redirector, hits = canary
    async with aiohttp.ClientSession() as http:  # even on a session that would follow them
        router = Router(
            _Source([]), model_hash=MODEL_HASH, shard_layers=[(0, 2)], http=http, public_only=False
        )
        node = RoutableNode("ab" * 32, redirector, 0)
        assert not await router._verify(node)
        router._cooldown.clear()
        await router.probe(_circuit(node))
    assert hits == []


async def test_a_cli_circuit_client_never_follows_a_redirect(canary) -> None:
    redirector, hits = canary
    with pytest.raises(UnavailableError):
        async with CircuitClient([Hop(redirector, 0)], hidden_size=8):
            pass
    assert hits == []


# --- the public-address policy on registered endpoints ------------------------------------------


def _entry(endpoint: str, key: str = "ab" * 32) -> dict[str, Any]:
    return {"key": key, "endpoint": endpoint, "shards": [0], "routable": True}


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:9000",
        "http://10.0.0.7:9000",
        "http://192.168.1.2:9000",
        "http://172.16.0.1:9000",
        "http://169.254.169.254:80",  # cloud metadata
        "http://100.64.0.1:9000",  # shared address space
        "http://0.0.0.0:9000",
        "http://[::1]:9000",
        "http://[::ffff:127.0.0.1]:9000",  # IPv4-mapped loopback
        "http://[fe80::1]:9000",
        "http://[fd00::1]:9000",
    ],
)
def test_router_skips_non_public_endpoints_by_default(endpoint: str) -> None:
    assert routable_by_shard([_entry(endpoint)], 1) == {0: []}
    assert len(routable_by_shard([_entry(endpoint)], 1, public_only=False)[0]) == 1


@pytest.mark.parametrize(
    "endpoint", ["http://8.8.8.8:9000", "https://node.example:443", "http://[2001:4860::8888]:80"]
)
def test_router_keeps_public_addresses_and_names(endpoint: str) -> None:
    """Names are checked when they resolve (PublicResolver on the gateway's connector)."""
    assert len(routable_by_shard([_entry(endpoint)], 1)[0]) == 1


async def test_a_router_on_the_default_policy_never_probes_a_loopback_registration() -> None:
    router = Router(
        _Source([_entry("http://127.0.0.1:9000")]),
        model_hash=MODEL_HASH,
        shard_layers=[(0, 2)],
        http=None,  # type: ignore[arg-type]
        refresh_s=0,
    )
    probed: list[RoutableNode] = []

    async def verify(node: RoutableNode) -> bool:
        probed.append(node)
        return True

    router._verify = verify  # type: ignore[method-assign]
    with pytest.raises(NoCircuit):
        await router.circuit()
    assert probed == []


class _Source:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    async def compute_nodes(self) -> list[dict[str, Any]]:
        return self.entries


def _circuit(node: RoutableNode) -> Any:
    from node.gateway.router import Circuit

    return Circuit((node,))
