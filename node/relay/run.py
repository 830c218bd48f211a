"""`planet relay serve`'s process: load (or create) the relay's X25519 key, serve /v1/relay, and
(unless it runs unregistered) register on the committee chain and heartbeat there
(node/relay/registration.py). Credits users pay it with are kept in `<home>/relay-credits/`
(node/relay/earnings.py) and, when registered, redeemed every few seconds
(node/relay/redeem.py); an unregistered relay keeps them for `planet relay redeem`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from node.relay.admission import admit_any, committee_standing
from node.relay.earnings import SPOOL_DIR, Earnings
from node.relay.exit_addresses import ExitAddresses
from node.relay.fronting import LEASE_S, Fronting, install_fronting
from node.relay.redeem import keep_redeeming
from node.relay.registration import RelayIdentity, ensure_registered, keep_alive
from node.relay.relay import Relay, create_app
from protocol.errors import ConfigError

log = logging.getLogger(__name__)

KEY_FILE = "relay_key"


def load_or_create_key(home: Path) -> PrivateKey:
    """The relay's X25519 key: 32 random bytes as hex in `<home>/relay_key` (0600), made at
    first start. A file others can read, or one that is not a key, is refused."""
    path = home / KEY_FILE
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(os.urandom(32).hex() + "\n")
    if path.stat().st_mode & 0o077:
        raise ConfigError(
            f"{path} is readable by others", hint=f"chmod 600 {path} (it is the relay's key)"
        )
    text = path.read_text().strip()
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        raise ConfigError(f"{path} does not hold a relay key (64 hex digits)")
    return PrivateKey(seed)


@dataclass(frozen=True)
class Standing:
    """How a registered relay reaches the committee: validator RPCs, its committee key, and what
    it registers (its X25519 key is the one `serve` loads)."""

    committee_rpc: str
    committee_key: SigningKey
    identity: RelayIdentity


async def serve(
    home: Path,
    host: str,
    port: int,
    *,
    allow_private: bool,
    private: PrivateKey | None = None,
    standing: Standing | None = None,
    rendezvous: tuple[tuple[int, int], str] | None = None,
    admit_from: str | None = None,
    lease_s: float = LEASE_S,
    exits_from: str | None = None,
) -> int:
    """`rendezvous`: (the port range, the public host) to front nodes behind NAT on
    (node/relay/fronting.py); None: fronts none. `admit_from`: the committee RPC whose
    registry decides which node keys get a port (node/relay/admission.py); None: any key
    (`--rendezvous-admit any`). `lease_s`: how long a key not staked holds its port.
    `exits_from`: the committee RPC whose registry gives the exit a node's other addresses
    (node/relay/exit_addresses.py); None: the onion's URL only."""
    private = private or load_or_create_key(home)
    earnings = Earnings(home / SPOOL_DIR)
    readers: dict[str, Any] = {}  # committee RPC → one reader for admission and exits

    def reader(rpc: str) -> Any:
        if rpc not in readers:
            from node.chain.committee_link import CommitteeLink  # lazy: the RPC client

            readers[rpc] = CommitteeLink([rpc])
        return readers[rpc]

    exits = ExitAddresses(reader(exits_from)) if exits_from is not None else None
    relay = Relay(private, allow_private=allow_private, earnings=earnings, exits=exits)
    app = create_app(relay)
    if rendezvous is not None:
        ports, public_host = rendezvous
        look_up = admit_any
        if admit_from is not None:
            look_up = committee_standing(reader(admit_from))
        fronting = Fronting(
            private, ports, public_host, bind=host, home=home, look_up=look_up, lease_s=lease_s
        )
        install_fronting(app, fronting)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    key = bytes(private.public_key).hex()
    print(f"relay on http://{host}:{port} key {key}", flush=True)
    if rendezvous is not None:
        (first, last), public_host = rendezvous
        admits = "any key" if admit_from is None else f"staked nodes of {admit_from}"
        print(
            f"relay fronts nodes behind NAT at {public_host} ports {first}-{last} "
            f"(/v1/rendezvous; admits {admits})",
            flush=True,
        )
    log.info("relay serving on %s:%d key=%s", host, port, key)
    heartbeats: asyncio.Task[None] | None = None
    redeeming: asyncio.Task[None] | None = None
    stop = asyncio.Event()
    link = None
    try:
        if standing is not None:
            from node.chain.committee_link import CommitteeLink  # lazy: the RPC client

            link = CommitteeLink([standing.committee_rpc], standing.committee_key)
            view = await ensure_registered(link, standing.identity)
            print(registered_line(view), flush=True)
            heartbeats = asyncio.create_task(keep_alive(link, stop))
            redeeming = asyncio.create_task(keep_redeeming(link, earnings, stop))
        await asyncio.Event().wait()
    finally:
        stop.set()
        if redeeming is not None:
            redeeming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await redeeming
        if heartbeats is not None:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
        if link is not None:
            await link.close()
        await runner.cleanup()
        for reads in readers.values():
            await reads.close()
    return 0


def registered_line(view: dict) -> str:
    """The one line a registered relay prints: where it is registered and whether it is listed."""
    stake = view.get("stake")
    listed = "listed in /relays once the validators agree on its Relay stake"
    if stake is not None:
        listed = f"agreed stake {int(stake) / 10**18:g} ETH"
    return (
        f"registered relay {str(view.get('key'))[:16]}… on the committee at "
        f"{view.get('endpoint')} ({view.get('status')}; {listed})"
    )
