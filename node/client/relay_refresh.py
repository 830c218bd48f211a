"""The personal client's relay list kept fresh: `/relays` read again while the client runs.

`planet gateway serve --personal --relays chain` reads the committee's relays at start; a relay
that leaves, goes down or loses its stake after that, or one that joins, would otherwise stay
(or stay missing) for the client's whole life. `RelayRefresh` re-reads every page of `/relays`
(node/client/relay_registry.py):

- every `interval_s` (default 60 s), each wait drawn within ±`jitter` of it, so clients started
  together do not ask the committee together;
- at once (but not within `MIN_GAP_S` of the last read) when a link's path did not come up
  because a relay was unreachable (`OverlayRoute.on_unreachable`).

A fresh list replaces the route's (`OverlayRoute.replace`): paths for new questions are drawn
from it, links already open keep their paths, and the guards are kept while they remain listed
(node/client/relay_guards.py). A read that fails (committee unreachable, malformed page, no
relay listed, too few for the paths) keeps the last good list and logs one line naming why; it
never ends the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Final

import aiohttp

from node.client.overlay import OverlayRoute
from node.client.relay_registry import Query, read_chain_relays
from protocol.errors import PlanetError

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S: Final = 60.0
DEFAULT_JITTER: Final = 0.1  # each wait within ±10% of the interval
MIN_GAP_S: Final = 10.0  # on-demand reads no closer together than this


class RelayRefresh:
    """Re-reads `/relays` into `route` on a jittered interval and on demand (`wake`)."""

    def __init__(
        self,
        route: OverlayRoute,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        jitter: float = DEFAULT_JITTER,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not interval_s > 0 or not 0 <= jitter < 1:
            raise ValueError(f"relay refresh: interval {interval_s} s, jitter {jitter}")
        self.route = route
        self.interval_s = interval_s
        self.jitter = jitter
        self._clock = clock
        self._rng = rng or random.Random()
        self.last_at = clock()  # the list given at start was read now
        self.next_at = self.last_at + self._wait()
        self.reads = 0  # reads tried (good or not)
        self.failures = 0
        self._woken = asyncio.Event()
        route.on_unreachable = self.wake

    def _wait(self) -> float:
        return self.interval_s * self._rng.uniform(1 - self.jitter, 1 + self.jitter)

    def due(self) -> bool:
        return self._clock() >= self.next_at

    def wake(self) -> None:
        """A relay was unreachable: read again as soon as `MIN_GAP_S` since the last read."""
        self.next_at = min(self.next_at, self.last_at + MIN_GAP_S)
        self._woken.set()

    async def tick(self, query: Query) -> bool:
        """Read `/relays` if due; True when a read was tried."""
        if not self.due():
            return False
        await self.refresh(query)
        return True

    async def refresh(self, query: Query) -> None:
        """One read; the route's list is replaced only by a good one."""
        self.reads += 1
        try:
            hops = await read_chain_relays(query)
            self.route.replace(hops)
        except (PlanetError, aiohttp.ClientError, OSError, TimeoutError) as error:
            self.failures += 1
            reason = getattr(error, "message", None) or str(error) or type(error).__name__
            log.warning(
                "relays: refresh failed (%s: %s); keeping the %d relays read before",
                getattr(error, "code", type(error).__name__),
                reason,
                len(self.route.relays),
            )
        finally:
            self.last_at = self._clock()
            self.next_at = self.last_at + self._wait()

    async def run(self, query: Query) -> None:
        """Until cancelled: wait until due (or woken), then read. A read that fails in a way
        `refresh` does not name (a bug) is logged with its traceback and the next one runs: the
        client keeps its last list, and keeps refreshing it."""
        while True:
            self._woken.clear()
            delay = max(0.0, self.next_at - self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), delay)
            try:
                await self.tick(query)
            except Exception:
                log.exception("relays: refresh pass failed; the next one runs as planned")
