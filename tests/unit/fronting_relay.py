"""A relay that fronts nodes behind NAT, served on loopback for a test (node/relay/)."""

from __future__ import annotations

from aiohttp import web
from nacl.public import PrivateKey

from harness.ports import ephemeral_port
from node.relay.fronting import Fronting, install_fronting
from node.relay.relay import Relay, create_app


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
