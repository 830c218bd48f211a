"""How a gateway's router reads a node's GET /info and asks whether it is healthy (issue 43):
directly over HTTP(S), pinned to the node key (`DirectInfo`, the hosted gateway and a personal
client without relays), or over the user's relay paths (`OverlayInfo`, the personal client with
`--relays`), so that no request of the client reaches a node from the user's address.

Over the overlay, /info is an INFO_ASK link message the node's `/v1/overlay` door answers with an
INFO (protocol/overlay.py): a fresh link of n paths per read, closed after it. The node's key is
pinned by the exits (the onion names it, docs/overlay.md), as `link_ssl` pins it directly; an
http:// node is read unpinned either way (loopback only: the router refuses it elsewhere). Health
over the overlay is an INFO answered in time: a node that answers /info serves.

`OverlayHopReader` is the same `OverlayInfo` as node/client/info.py's `NodeReader` (a hop in, a
JSON object or a named PlanetError out): `planet ask --relays` reads its circuit's /info and
health with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import aiohttp

from node.links import link_ssl
from protocol.errors import PlanetError, UnavailableError
from protocol.overlay import OverlayError


class InfoUnavailable(Exception):
    """A node's /info could not be read (unreachable, timed out, not 200, not JSON)."""


class InfoFetcher(Protocol):
    timeout_s: float  # how long one /info read may take
    observe_s: float  # how often a verified node's stats are read again (at most)

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        """The node's /info (any JSON value: the router checks it), or InfoUnavailable."""
        ...

    async def healthy(self, url: str, key: str, timeout_s: float) -> bool:
        """Whether the node answers within `timeout_s`."""
        ...


class DirectInfo:
    """GET /info and /health from this host (`ssl`: the router's pin)."""

    timeout_s = 3.0
    observe_s = 2.0  # node/client/costs.py STALE_S

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                async with self.http.get(f"{url}/info", ssl=ssl, allow_redirects=False) as answer:
                    if answer.status != 200:
                        raise InfoUnavailable(f"/info answered {answer.status}")
                    return await answer.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise InfoUnavailable(str(error) or type(error).__name__) from None

    async def healthy(self, url: str, key: str, timeout_s: float) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                # pinned to the node's key over https; a plaintext probe carries no data
                pin = link_ssl(url, key, plaintext_ok=True)
                async with self.http.get(f"{url}/health", allow_redirects=False, ssl=pin) as answer:
                    return answer.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError, PlanetError):
            return False


class OverlayInfo:
    """/info as an INFO over fresh relay paths (`route`: node/client/overlay.py
    `OverlayRoute`); nothing is sent to the node from this host."""

    # a read sets up n paths of l relays (node/client/overlay.py SETUP_TIMEOUT_S bounds one)
    timeout_s = 20.0
    # each read costs a link of n × l relays and its cloves: stats are read every 30 s, not 2
    observe_s = 30.0

    def __init__(self, route: Any, http: aiohttp.ClientSession) -> None:
        self.dial = route.dialer(http)  # an entered OverlayLink to a hop, on fresh paths

    async def info(self, url: str, key: str, ssl: Any, timeout_s: float) -> Any:
        link = None
        try:
            async with asyncio.timeout(timeout_s):
                link = await self.dial(_Node(url, key))
                return await link.info()
        except (OSError, TimeoutError, aiohttp.ClientError, PlanetError, OverlayError) as error:
            raise InfoUnavailable(str(error) or type(error).__name__) from None
        finally:
            if link is not None:
                with contextlib.suppress(Exception):
                    await link.close()

    async def healthy(self, url: str, key: str, timeout_s: float) -> bool:
        """An INFO answered within `timeout_s`, or `self.timeout_s` when longer (a direct probe's
        2 s does not set up n paths of relays)."""
        try:
            await self.info(url, key, None, max(timeout_s, self.timeout_s))
        except InfoUnavailable:
            return False
        return True


class OverlayHopReader:
    """`OverlayInfo` for a client of hops (node/client/info.py `NodeReader`): an /info that
    does not come back over the relays is an UnavailableError naming the node and why."""

    def __init__(self, route: Any, http: aiohttp.ClientSession) -> None:
        self.fetcher = OverlayInfo(route, http)
        self.timeout_s = self.fetcher.timeout_s

    async def info(self, hop: Any) -> dict[str, Any]:
        try:
            # the onion names an https:// node's key: the exit pins it (no ssl of this host's)
            info = await self.fetcher.info(hop.url, hop.key, None, self.timeout_s)
        except InfoUnavailable as error:
            raise UnavailableError(
                f"node {hop.url} (shard {hop.shard}) did not answer /info over the relays: {error}"[
                    :400
                ],
                hint="the relays are down or refuse the next hop (try other relays, or fewer "
                "per path with --overlay), or the node is down",
            ) from None
        return dict(info)

    async def healthy(self, hop: Any, timeout_s: float) -> bool:
        return await self.fetcher.healthy(hop.url, hop.key, timeout_s)


class _Node:
    """What `OverlayRoute.dialer` reads of a hop."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
