"""A node's links to its next hops: one multiplexed WebSocket per next hop, dialled ahead.

A session that is not on the circuit's last hop is attached to the next hop over this node's
link to it (node/server/stream.py). A link is one TCP + TLS + WebSocket handshake (TLS pinned to
the next hop's node key, node/links.py): three round trips that a question would pay at its open
if the link were dialled then. So the pool keeps links open and dials them ahead:

- **One link per next hop** (URL and pinned node key), shared by every session routed there.
  Sessions are multiplexed by sid, each attached with its own feed token; the next hop feeds
  a link's frames only into the session its sid was attached to, and sends nothing back on it
  but control answers, so no session's activations reach another session. A link is only ever
  reused for the same key (the pin is part of its identity).
- **Warm targets.** Every `refresh_s` (at once when a link drops, and after 1, 2, 4 … s while a
  target cannot be dialled) the pool asks its
  `targets` (warm_targets.py: the next shard's replicas on the committee chain, or the
  `--next-hops` list's nodes that serve the next shard), adds the next hops questions used
  within `idle_s` (their keys were named by clients and allowed by the policy), and dials the
  ones not open, so the first question pays no handshake, nor the first after a replica joined
  or a link failed.
- **Dead links.** A link pings its next hop every `HEARTBEAT_S` and closes when no pong comes
  (a peer that vanished without a FIN); a closed link is never handed out, and is dialled again.
  A link that dies under an open before the next hop confirmed the attach (`LinkLostError`) is
  replaced once and the attach, with the frames sent behind it, goes again on the fresh link
  (stream.py `_attach_down`): the question does not fail.
- **A next hop behind NAT** has several addresses (its port at each relay that fronts it: an
  open's `next.alternates`). `reach` takes an open link at any of them (in their order) and
  otherwise dials them in turn (node/dial.py `first_reachable`), each within the bound one
  address gets (`ATTACH_TIMEOUT_S`), every one pinned to the same node key: when the first
  relay is down the session goes through the second. Warm targets carry the same list
  (`WarmTarget`: from the committee, the addresses that key registered; a question's next hop:
  the addresses its open named), so a NAT next hop is dialled ahead at its second relay while
  its first is down, and the open finds that link.
- **Bounded.** At most `max_links` links (at most `max_warm` of them warm targets); a link no
  attach or frame used for `idle_s` (the node's session idle timeout: its sessions are gone) is
  closed unless it is a warm target. A new next hop when the pool is full takes an idle link's
  place, or is refused `downstream_unavailable` while every link carries sessions.

Counters (`stats`, in /info `links`): `dialled` counts handshakes (successful dials), so a test
or operator sees that a question opened no new link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from node.dial import first_reachable
from node.links import link_ssl, refusal
from protocol.errors import PlanetError
from protocol.frames.errors import FrameError
from protocol.frames.header import frame_sid
from protocol.links import NodeKeyMismatchError
from protocol.stream import DownstreamError, parse_control, ws_frame_bytes

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 10.0
HEARTBEAT_S = 15.0  # ping interval on a link; no pong within half of it closes the link
REFRESH_S = 10.0  # how often the warm targets are asked again
MIN_ROUND_S = 1.0  # warm rounds woken by dropped links come at most this often
MAX_LINKS = 32
MAX_WARM = 8
_TO_UPSTREAM = frozenset({"attached", "error", "closed"})

LinkId = tuple[str, str | None]  # next hop URL (canonical), pinned node key (None: plaintext)


@dataclass(frozen=True, slots=True)
class WarmTarget:
    """A next hop to keep a link to: its URL and key and, behind NAT, its addresses at its
    other relays (registered on the chain: `rendezvous`), dialled in turn as an open's
    `next.alternates` are (`LinkPool.reach`)."""

    url: str
    key: str | None
    alternates: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.url, *self.alternates)

    @property
    def idents(self) -> tuple[LinkId, ...]:
        return tuple((url, self.key) for url in self.addresses)


def as_target(item: LinkId | WarmTarget) -> WarmTarget:
    """A warm target as the pool handles it (a bare (URL, key): a next hop with one address)."""
    return item if isinstance(item, WarmTarget) else WarmTarget(item[0], item[1])


class LinkLostError(DownstreamError):
    """The link to the next hop closed (or a send on it failed) before the next hop answered."""


class WebSocketLike(Protocol):
    """What a link needs of a dialled WebSocket (aiohttp's ClientWebSocketResponse)."""

    @property
    def closed(self) -> bool: ...

    def __aiter__(self) -> Any: ...

    async def send_json(self, data: Any) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self) -> Any: ...


Dialer = Callable[[str, str | None], Awaitable[WebSocketLike]]
Targets = Callable[[], Awaitable[Iterable[LinkId | WarmTarget]]]


async def no_targets() -> list[LinkId]:
    return []


@dataclass
class LinkStats:
    dialled: int = 0  # successful dials: one TCP + TLS + WebSocket handshake each
    warm_dialled: int = 0  # of which ahead of any question (warm targets)
    dial_failures: int = 0
    reattached: int = 0  # opens whose link died before `attached`, attached again on a new one
    idle_closed: int = 0
    evicted: int = 0  # idle links closed to make room for another next hop

    def as_json(self, open_links: int, warm: int) -> dict[str, int]:
        return {"open": open_links, "warm_targets": warm, **self.__dict__}


class DownLink:
    """This node's WebSocket to one next hop (shared by every session routed there)."""

    def __init__(
        self,
        url: str,
        ws: WebSocketLike,
        on_sent: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.ws = ws
        self.on_sent = on_sent  # WebSocket bytes of each frame sent (the node's counters)
        self.clock = clock
        self.last_used = clock()
        self._next_sid = 1
        self._pending: dict[int, asyncio.Future[None]] = {}
        # sid → what takes the frames the next hop sends back for it (a ring session's outputs,
        # docs/overlay.md *The ring*); frames for any other sid are dropped
        self.back: dict[int, Callable[[bytes], Awaitable[None]]] = {}
        self._reader = asyncio.create_task(self._read())

    @property
    def closed(self) -> bool:
        return self.ws.closed or self._reader.done()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        self._reader.add_done_callback(lambda _task: callback())

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    # only a session opened `back` sends frames up (in order: awaited here)
                    taker = self.back.get(frame_sid(message.data) or 0)
                    if taker is not None:
                        await taker(message.data)
                    continue
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue  # nothing but control comes back upstream
                try:
                    control = parse_control(message.data, _TO_UPSTREAM)
                except FrameError:
                    continue
                future = self._pending.pop(control.sid, None)
                if future is None or future.done():
                    continue
                if control.op == "error":
                    future.set_exception(
                        DownstreamError(
                            f"next hop {self.url} refused: {control.code}: {control.message}"
                        )
                    )
                else:
                    future.set_result(None)
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(LinkLostError(f"link to next hop {self.url} closed"))

    async def attach(self, feed: str) -> tuple[int, asyncio.Future[None]]:
        """Send an attach; returns its sid at once (frames for it may follow on this link: the
        next hop holds them until the attach settles) and the future of the next hop's answer
        (`wait_attached`). LinkLostError when the link is closed or the send fails."""
        if self.closed:
            raise LinkLostError(f"link to next hop {self.url} closed")
        sid = self._next_sid
        self._next_sid += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[sid] = future
        try:
            await self.send_json({"op": "attach", "sid": sid, "feed": feed})
        except DownstreamError:
            self._pending.pop(sid, None)
            raise
        return sid, future

    async def wait_attached(self, sid: int, future: asyncio.Future[None]) -> None:
        try:
            async with asyncio.timeout(ATTACH_TIMEOUT_S):
                await future
        except TimeoutError:
            raise DownstreamError(f"next hop {self.url} did not answer the attach") from None
        finally:
            self._pending.pop(sid, None)

    async def send_json(self, body: dict[str, Any]) -> None:
        self.last_used = self.clock()
        try:
            await self.ws.send_json(body)
        except (ConnectionError, RuntimeError) as error:
            raise LinkLostError(f"link to next hop {self.url} failed: {error}") from None

    async def send_bytes(self, data: bytes) -> None:
        self.last_used = self.clock()
        try:
            await self.ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as error:
            raise LinkLostError(f"link to next hop {self.url} failed: {error}") from None
        self.on_sent(ws_frame_bytes(len(data), masked=True))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def ws_dialer(http: aiohttp.ClientSession, max_msg_bytes: int, *, plaintext_ok: bool) -> Dialer:
    """The node's dial: a WebSocket to `url`/v1/stream, TLS pinned to `key` for https
    (node/links.py), pinging every HEARTBEAT_S. A pin refusal is `node_key_mismatch`, anything
    else that fails the dial `downstream_unavailable`."""

    async def dial(url: str, key: str | None) -> WebSocketLike:
        pin = link_ssl(url, key, plaintext_ok=plaintext_ok)
        try:
            async with asyncio.timeout(ATTACH_TIMEOUT_S):
                return await http.ws_connect(
                    f"{url}/v1/stream",
                    max_msg_size=max_msg_bytes,
                    autoping=True,
                    heartbeat=HEARTBEAT_S,
                    ssl=pin,
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            named = refusal(error, url)
            if named is not None:
                log.warning("next hop refused: %s", named.message)
                raise named from None
            raise DownstreamError(f"cannot reach next hop {url}: {type(error).__name__}") from None

    return dial


class LinkPool:
    """Open links by next hop (URL, pinned key), dialled ahead for the warm targets (see the
    module docstring). `dial(url, key)` opens one pinned WebSocket or raises a named error."""

    def __init__(
        self,
        dial: Dialer,
        on_sent: Callable[[int], None] = lambda _n: None,
        *,
        targets: Targets = no_targets,
        max_links: int = MAX_LINKS,
        max_warm: int = MAX_WARM,
        idle_s: float = 300.0,
        refresh_s: float = REFRESH_S,
        plaintext_ok: bool = False,
        min_round_s: float = MIN_ROUND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= max_warm <= max_links:
            raise ValueError("need 1 <= max_warm <= max_links")
        self.dial = dial
        self.on_sent = on_sent
        self.targets = targets
        self.max_links = max_links
        self.max_warm = max_warm
        self.idle_s = idle_s
        self.refresh_s = refresh_s
        self.plaintext_ok = plaintext_ok  # local mode: http:// next hops off loopback too
        self.min_round_s = min_round_s
        self.clock = clock
        self.stats = LinkStats()
        self.targets_warm: tuple[WarmTarget, ...] = ()  # the warm targets of the last round
        self.warm: tuple[LinkId, ...] = ()  # their links at any of their addresses
        self._links: dict[LinkId, DownLink] = {}
        # next hops questions used → when, oldest first
        self._used: dict[WarmTarget, float] = {}
        self._dialling: dict[LinkId, asyncio.Lock] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return sum(not link.closed for link in self._links.values())

    def info(self) -> dict[str, int]:
        return self.stats.as_json(len(self), len(self.targets_warm))

    def link(self, url: str, key: str | None = None) -> DownLink | None:
        """The open link to this next hop, if there is one (no dial)."""
        link = self._links.get((url, key))
        return link if link is not None and not link.closed else None

    def _note_used(self, target: WarmTarget) -> None:
        """A question's next hop: kept warm while it is used (`warm_round`)."""
        self._used.pop(target, None)
        self._used[target] = self.clock()
        while len(self._used) > self.max_links:
            del self._used[next(iter(self._used))]

    async def get(self, url: str, key: str | None = None, *, warm: bool = False) -> DownLink:
        """The open link to (url, key), dialled now if there is none (or it died)."""
        if not warm:
            self._note_used(WarmTarget(url, key))
        return await self._get(url, key, warm=warm)

    async def _get(self, url: str, key: str | None, *, warm: bool) -> DownLink:
        ident = (url, key)
        link = self.link(url, key)
        if link is not None:
            return link
        async with self._dialling.setdefault(ident, asyncio.Lock()):
            link = self.link(url, key)
            if link is not None:
                return link
            await self._make_room(ident)
            try:
                ws = await self.dial(url, key)
            except BaseException:
                self.stats.dial_failures += 1
                raise
            old = self._links.pop(ident, None)
            if old is not None:
                await old.close()
            link = DownLink(url, ws, self.on_sent, self.clock)
            link.add_done_callback(self._wake.set)  # a dropped link: dial it again soon
            self._links[ident] = link
            self.stats.dialled += 1
            self.stats.warm_dialled += warm
            return link

    async def reach(
        self, addresses: Sequence[str], key: str | None, *, warm: bool = False
    ) -> DownLink:
        """The link to one next hop at `addresses` (its URL, then its addresses at its other
        relays): an open link at any of them, in order, else the first that can be dialled,
        each address within `ATTACH_TIMEOUT_S` (what a next hop with one address gets), all
        pinned to `key`. When none is reached: the first address's refusal. A question's
        next hop (not `warm`) is kept warm at all of its addresses while it is used."""
        if not warm:
            self._note_used(WarmTarget(addresses[0], key, tuple(addresses[1:])))
        for url in addresses:
            if self.link(url, key) is not None:
                return await self._get(url, key, warm=warm)
        try:
            _, link = await first_reachable(
                addresses,
                lambda url: self._get(url, key, warm=warm),
                total_s=ATTACH_TIMEOUT_S * len(addresses),
                each_s=ATTACH_TIMEOUT_S,
                what=f"next hop {addresses[0]}",
                errors=(DownstreamError, NodeKeyMismatchError, TimeoutError),
            )
        except TimeoutError:  # the bound ran out before the dial's own timeout named it
            raise DownstreamError(f"cannot reach next hop {addresses[0]}: TimeoutError") from None
        return link

    async def _make_room(self, ident: LinkId) -> None:
        """Before a dial: drop closed links; when full, close the longest idle link that is no
        warm target (or, failing that, any idle one); none idle → DownstreamError."""
        for other, link in list(self._links.items()):
            if link.closed and other != ident:
                del self._links[other]
        if len(self._links) < self.max_links:
            return
        idle = [
            (link.last_used, other not in self.warm, other)
            for other, link in self._links.items()
            if self.clock() - link.last_used >= self.idle_s
        ]
        if not idle:
            raise DownstreamError(
                f"this node holds its most next-hop links ({self.max_links}), all in use; "
                "try again later"
            )
        # a non-target first (True sorts after False: negate), then the longest idle
        _, _, victim = min(idle, key=lambda item: (not item[1], item[0]))
        self.stats.evicted += 1
        await self._links.pop(victim).close()

    # ------------------------------------------------------------------------------ warm
    async def warm_round(self) -> bool:
        """Ask the targets, dial those not open (failures logged and counted), close links idle
        `idle_s` that are no target. False when a target could not be dialled (or the targets
        say, by a true `incomplete` attribute, that they could not all be read)."""
        missed = False
        try:
            named = list(await self.targets())
        except Exception:
            log.warning("next-hop links: the warm targets could not be read", exc_info=True)
            named = list(self.warm)
        now = self.clock()
        for ident, used in list(self._used.items()):
            if now - used >= self.idle_s:
                del self._used[ident]
        recent = sorted(self._used, key=self._used.__getitem__, reverse=True)
        wanted: list[WarmTarget] = []
        covered: set[LinkId] = set()  # a next hop named twice (by URL, or at another address)
        for target in [*(as_target(item) for item in named), *recent]:
            if not covered.isdisjoint(target.idents):
                continue
            wanted.append(target)
            covered.update(target.idents)
        wanted = wanted[: self.max_warm]
        self.targets_warm = tuple(wanted)
        self.warm = tuple(ident for target in wanted for ident in target.idents)
        for target in wanted:
            if any(self.link(*ident) is not None for ident in target.idents):
                continue
            try:  # behind NAT: at its other relays' addresses when the first is not reached
                await self.reach(target.addresses, target.key, warm=True)
                log.info("next-hop link warm url=%s", target.url)
            except (PlanetError, OSError, aiohttp.ClientError, TimeoutError) as error:
                missed = True
                log.info("next-hop link not warmed url=%s: %s", target.url, error)
        now = self.clock()
        for ident, lock in list(self._dialling.items()):
            if ident not in self._links and not lock.locked():
                del self._dialling[ident]
        for ident, link in list(self._links.items()):
            if link.closed:
                del self._links[ident]
            elif ident not in self.warm and now - link.last_used >= self.idle_s:
                del self._links[ident]
                self.stats.idle_closed += 1
                log.info("next-hop link closed (idle) url=%s", ident[0])
                await link.close()
        # targets that could not all be read (a list node's /info did not answer) count as missed
        return not missed and not getattr(self.targets, "incomplete", False)

    async def _run(self) -> None:
        retry_s = self.min_round_s  # after a round that missed a target: sooner, then doubling
        while True:
            self._wake.clear()
            started = self.clock()
            complete = await self.warm_round()
            await asyncio.sleep(max(0.0, self.min_round_s - (self.clock() - started)))
            wait_s = self.refresh_s if complete else min(self.refresh_s, retry_s)
            retry_s = self.min_round_s if complete else min(self.refresh_s, 2 * retry_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()

    def start(self) -> None:
        """Keep the warm targets dialled in the background (until `close`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for link in list(self._links.values()):
            await link.close()
        self._links.clear()


__all__ = [
    "ATTACH_TIMEOUT_S",
    "DownLink",
    "LinkId",
    "LinkLostError",
    "LinkPool",
    "LinkStats",
    "WarmTarget",
    "as_target",
    "no_targets",
    "ws_dialer",
]
