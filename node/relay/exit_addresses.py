"""Where an exit relay may also reach a path's node: the addresses that node's key registered on
the committee chain (docs/overlay.md, *Exit relays and nodes behind NAT*).

The onion names one URL for the node and its key (protocol/overlay.py: a box holds one URL). A
node behind NAT is reachable at its port on each relay that fronts it; its registration names
them (`register_node` `endpoint` and `rendezvous[].endpoint`, each checked by the chain to be at
a registered relay's address). When the exit cannot reach the URL the onion names, it asks the
committee for the registration of the key the onion pins (`/node?key=`) and dials the other
addresses registered there, in their order.

Who chooses: the chain, never the client. The client names one URL per path as before; the
addresses the exit falls back to are the ones that key registered, and only while the
committee lists the key as a compute node that is routable or graced (DOWN lately, otherwise
routable: abci_app/liveness.py), exactly the nodes a previous hop's committee policy dials
(node/server/next_hops.py). Each is https:// (pinned to the key: a relay that gave the port to
another node fails the handshake, `node_key_mismatch`), and the relay's own address policy
(`Relay._check_next`: IP literals, public ones unless `--allow-private-next-hops`) judges each
before it is dialled. A relay without a committee (`--no-register` without `--committee-rpc`)
has no fallback: it dials the onion's URL only, as before.

What it costs the committee: one `/node` query per key and CACHE_S (answers and misses cached
alike, at most MAX_CACHED keys, LOOKUPS_AT_ONCE at a time, each within LOOKUP_TIMEOUT_S), and only
after a dial failed. What the validator answering learns: that this relay exits to that node
key (what the node itself sees of the relay anyway).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

from protocol.committee.registry import MAX_RENDEZVOUS
from protocol.errors import PlanetError
from protocol.urls import BadUrlError, canonical_url

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S: Final = 5.0
LOOKUPS_AT_ONCE: Final = 4
CACHE_S: Final = 10.0  # a key's registered addresses (or their absence) are asked again after
MAX_CACHED: Final = 1024
_KEY = re.compile(r"[0-9a-f]{64}\Z")


class NodeViews(Protocol):
    """What the exit reads of the committee (node/chain/committee_link.py `CommitteeLink`)."""

    async def node(self, key: str) -> dict[str, Any] | None: ...


def registered_addresses(view: Any, key: str) -> tuple[str, ...]:
    """The addresses a committee `/node` view (untrusted) registers for node `key`: its
    `endpoint`, then its `rendezvous[].endpoint`s (at most MAX_RENDEZVOUS), canonical, https://
    only, distinct, in that order; () unless the view is that key's compute node and routable
    or graced."""
    if not isinstance(view, dict) or view.get("key") != key or view.get("role") != "compute":
        return ()
    if view.get("routable") is not True and view.get("grace") is not True:
        return ()
    named: list[Any] = [view.get("endpoint")]
    entries = view.get("rendezvous")
    for entry in entries[:MAX_RENDEZVOUS] if isinstance(entries, list) else []:
        named.append(entry.get("endpoint") if isinstance(entry, dict) else None)
    out: list[str] = []
    for value in named:
        try:
            url = canonical_url(value)
        except BadUrlError:
            continue
        if url.startswith("https://") and url not in out:
            out.append(url)
    return tuple(out)


class ExitAddresses:
    """A node key's registered addresses for an exit relay (module docstring), cached."""

    def __init__(
        self,
        views: NodeViews,
        *,
        cache_s: float = CACHE_S,
        timeout_s: float = LOOKUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.views = views
        self.cache_s = cache_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.lookups = 0  # committee queries sent (tests)
        self._cache: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()
        self._limit = asyncio.Semaphore(LOOKUPS_AT_ONCE)

    async def addresses(self, key: str) -> tuple[str, ...]:
        """Every address node `key` registered (`registered_addresses`); () when it registered
        none, is not routable, or the committee did not answer (logged)."""
        if not _KEY.match(key):
            return ()
        cached = self._cache.get(key)
        if cached is not None and self.clock() - cached[0] < self.cache_s:
            return cached[1]
        async with self._limit:
            cached = self._cache.get(key)  # another lookup may have answered meanwhile
            if cached is not None and self.clock() - cached[0] < self.cache_s:
                return cached[1]
            self.lookups += 1
            try:
                async with asyncio.timeout(self.timeout_s):
                    view = await self.views.node(key)
            except (PlanetError, OSError, TimeoutError) as error:
                log.warning(
                    "exit: committee unread for node %s…: %s",
                    key[:16],
                    getattr(error, "message", None) or type(error).__name__,
                )
                found: tuple[str, ...] = ()
            else:
                found = registered_addresses(view, key)
            self._cache[key] = (self.clock(), found)
            self._cache.move_to_end(key)
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
            return found

    def known(self, key: str) -> tuple[str, ...]:
        """The addresses of `key` already looked up and still fresh (no query): () if none."""
        cached = self._cache.get(key)
        if cached is None or self.clock() - cached[0] >= self.cache_s:
            return ()
        return cached[1]

    async def fallbacks(self, url: str, key: str) -> tuple[str, ...]:
        """The addresses to try, in order, when the node with `key` is not reached at `url`
        (canonical): its registered ones other than `url`."""
        try:
            named = canonical_url(url)
        except BadUrlError:
            named = url
        return tuple(a for a in await self.addresses(key) if a != named)
