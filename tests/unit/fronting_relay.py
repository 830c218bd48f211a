"""A relay that fronts nodes behind NAT, served on loopback for a test (node/relay/)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from harness.ports import ephemeral_port
from node.relay.fronting import Fronting, install_fronting
from node.relay.relay import Relay, create_app
from node.server.rendezvous import RendezvousLink, RendezvousRelay


async def serve_fronting_relay(
    private: PrivateKey, fronting: Fronting
) -> tuple[web.AppRunner, str]:
    """The relay of `private` with `fronting` installed, listening on a free loopback port:
    (its runner, to clean up; its URL)."""
    app = create_app(Relay(private, allow_private=True))
    install_fronting(app, fronting)
    runner = web.AppRunner(app)
    await runner.setup()
    port = ephemeral_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def front_node(
    node_key: SigningKey, local: tuple[str, int], scheme: str = "http"
) -> tuple[web.AppRunner, Any, str]:
    """A relay fronting the node of `node_key` that listens at `local`, its rendezvous link up:
    (the relay's runner, the link's task, the node's `scheme`:// URL at the relay)."""
    private = PrivateKey.generate()
    port = ephemeral_port()
    runner, url = await serve_fronting_relay(private, Fronting(private, (port, port), "127.0.0.1"))
    up = asyncio.Event()
    link = RendezvousLink(
        RendezvousRelay(url, bytes(private.public_key)),
        node_key,
        local,
        reached=lambda _r, _w: up.set(),
    )
    http = aiohttp.ClientSession()
    task = asyncio.create_task(link.run(http))
    task.add_done_callback(lambda _t: asyncio.ensure_future(http.close()))
    async with asyncio.timeout(10):
        await up.wait()
    return runner, task, f"{scheme}://127.0.0.1:{port}"
