"""`planet relay serve`'s process: load (or create) the relay's X25519 key, serve /v1/relay."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from aiohttp import web
from nacl.public import PrivateKey

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


async def serve(home: Path, host: str, port: int, *, allow_private: bool) -> int:
    private = load_or_create_key(home)
    relay = Relay(private, allow_private=allow_private)
    runner = web.AppRunner(create_app(relay))
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    key = bytes(private.public_key).hex()
    print(f"relay on http://{host}:{port} key {key}", flush=True)
    log.info("relay serving on %s:%d key=%s", host, port, key)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
    return 0
