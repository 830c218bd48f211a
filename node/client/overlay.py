"""The user's side of the overlay: a link to a node that travels n relay paths as S-IDA cloves
(docs/overlay.md), usable wherever the client would open a WebSocket to the node.

    paths = choose_paths(relays, n=4, length=3)          distinct relays, no relay twice
    async with OverlayLink(http, paths, node_url, k=3) as ws:
        await ws.send_json({...}); await ws.send_bytes(frame)
        async for message in ws: ...                      aiohttp.WSMessage, in order

Each message (a control message or a frame of the stream protocol) becomes a link message
(`protocol.overlay.LinkMessage`: this link's random id, its sequence number), dispersed into n
cloves (`protocol.sida`), clove i wrapped in path i's layers and sent as one DATA cell. Answers
come back the same way and are put back in sequence order. Any n − k paths may fail; a path
whose cells stop opening is torn down by its relays and counted in `failed_paths`.

With a purse (node/client/relay_paying.py), the link pays each path's relays for the clove
bytes that path delivered: forward, as the node acknowledges them (ACK link messages, every few
messages and once at the end: `close` waits up to ACK_WAIT_S for it); backward, as they come
back. Each relay gets its credits in a PAY cell that only it can open (`protocol.relay_pay`).
A path that delivered nothing is paid nothing; one torn down keeps what it was paid before.

The node sees its exit relays, never this client's address; no single relay sees more than
its neighbours, path ids and the size of the cells.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp

from node.client.relay_guards import RelayGuards
from node.client.relay_paying import RelayPurse
from protocol import sida
from protocol.blind_bls import ThresholdCredit
from protocol.committee.credit_holder import relay_party
from protocol.errors import UnavailableError, UsageError
from protocol.overlay import (
    Cell,
    CellKind,
    Hop,
    InfoInvalid,
    InOrder,
    LinkMessage,
    MessageKind,
    OverlayError,
    build_onion,
    new_path_id,
    parse_info,
    unwrap_backward,
    wrap_forward,
)
from protocol.paid_credits import HeldCredit
from protocol.relay_pay import MAX_PAY_CREDITS, AckInvalid, Acks, credits_due, wrap_pay

log = logging.getLogger(__name__)

DEFAULT_PATHS: Final = 4  # the seed's n
DEFAULT_NEEDED: Final = 3  # the seed's k
DEFAULT_LENGTH: Final = 3  # the seed's l
SETUP_TIMEOUT_S: Final = 15.0
MAX_EARLY: Final = 256
ACK_WAIT_S: Final = 2.0  # how long `close` waits for the node's last acknowledgement


def network_of(url: str) -> str:
    """The /16 an IPv4 relay sits in (/32 for IPv6), else its host name: relays in one such
    network are likely one operator's, or one network's to watch."""
    host = urlsplit(url).hostname or url
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    prefix = 16 if address.version == 4 else 32
    return str(ipaddress.ip_network((address, prefix), strict=False))


def choose_paths(
    relays: Sequence[Hop],
    n: int = DEFAULT_PATHS,
    length: int = DEFAULT_LENGTH,
    entries: Sequence[Hop] | None = None,
) -> list[list[Hop]]:
    """n paths of `length` relays drawn at random: no relay on two paths (or twice on one),
    path i entered by `entries[i]` when given (the guards), and no two relays of a path in one
    network (`network_of`) while the relays not yet used offer another."""
    if n * length > len(relays):
        raise UsageError(
            f"{n} paths of {length} relays need {n * length} distinct relays, {len(relays)} known",
            hint="use fewer or shorter paths, or add relays",
        )
    draw = random.SystemRandom()
    entries = list(entries or [])
    used = {hop.url for hop in entries}
    pool = [relay for relay in relays if relay.url not in used]
    draw.shuffle(pool)
    paths: list[list[Hop]] = []
    for i in range(n):
        path = [entries[i]] if i < len(entries) else []
        while len(path) < length:
            seen = {network_of(hop.url) for hop in path}
            pick = next((r for r in pool if network_of(r.url) not in seen), pool[0])
            pool.remove(pick)
            path.append(pick)
        paths.append(path)
    return paths


@dataclass(eq=False)
class _Path:
    hops: list[Hop]
    keys: list[bytes] = field(default_factory=list)
    ws: aiohttp.ClientWebSocketResponse | None = None
    ident: int = 0
    forward_seq: int = 0
    backward_seq: int = 0
    created: asyncio.Future[None] | None = None
    reader: asyncio.Task[None] | None = None
    alive: bool = False
    failed: bool = False  # came up, then was torn down or lied while the link was in use
    delivered: int = 0  # cloves that came back on it
    delivered_bytes: int = 0  # their bytes
    sent: int = 0  # clove bytes sent on it
    acked: int = 0  # clove bytes sent on it that the node acknowledged (never above `sent`)
    paid: list[int] = field(default_factory=list)  # per relay: credits paid to it
    pay_sequences: list[int] = field(default_factory=list)  # per relay: its next PAY sequence

    def due(self, rate: int, target: int | None = None) -> int:
        """Credits relay `target` of this path (None: the least paid) is owed now: whole
        credits for the clove bytes that arrived (acknowledged forward, received backward),
        less what it was paid."""
        paid = min(self.paid, default=0) if target is None else self.paid[target]
        return credits_due(self.acked + self.delivered_bytes, rate, paid)


# A path that brought back no clove while another brought back this many is dropping cloves
# (in either direction: the node answers only on paths its cloves arrived on).
SILENT_AFTER: Final = 3


class OverlayLink:
    """One link to a node over n paths; the subset of aiohttp's client WebSocket the circuit
    client uses (`send_json`, `send_bytes`, `close`, `closed`, async iteration)."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        paths: Sequence[Sequence[Hop]],
        node_url: str,
        *,
        k: int = DEFAULT_NEEDED,
        node_key: str | None = None,
        on_close: Callable[[OverlayLink], None] | None = None,
        purse: RelayPurse | None = None,
    ) -> None:
        if not 2 <= k <= len(paths) <= sida.MAX_CLOVES:
            raise UsageError(
                f"need 2 ≤ k ≤ paths ≤ {sida.MAX_CLOVES}, got {len(paths)} paths and k={k}"
            )
        self.http = http
        self.paths = [_Path(list(hops)) for hops in paths]
        self.node_url = node_url
        self.node_key = node_key  # an https:// node's key: the exits pin it
        self.on_close = on_close  # sees the link once it is closed (its suspects)
        self.k = k
        self.ident = os.urandom(16)
        self.sent = 0
        self.order = InOrder(MAX_EARLY)  # what the node sends, handed on in sequence order
        self.inbox: asyncio.Queue[aiohttp.WSMessage | None] = asyncio.Queue()
        self.collector = sida.Collector()
        self.closed = False
        self.failed_paths = 0
        self.cells_sent = 0
        self.bytes_sent = 0  # cells on this client's links to its first relays (payloads)
        self.bytes_received = 0
        self._lock = asyncio.Lock()
        self.purse = purse  # pays the paths' relays; None: they are not paid
        self.acks = 0  # acknowledgements received
        self._acked = asyncio.Event()  # set by each acknowledgement
        self._paying: set[asyncio.Task[None]] = set()
        self._info: asyncio.Future[dict[str, Any]] | None = None  # an INFO_ASK's answer
        self.up = False  # k paths came up (`__aenter__`)

    async def __aenter__(self) -> OverlayLink:
        try:
            await asyncio.gather(*(self._open(path) for path in self.paths))
        except BaseException:
            await self.close()
            raise
        alive = sum(path.alive for path in self.paths)
        self.up = alive >= self.k  # from now on, paths lost below k end the link
        if alive < self.k:
            await self.close()  # its suspects are reported: the next draw avoids them
            raise UnavailableError(
                f"only {alive} of {len(self.paths)} overlay paths to {self.node_url} came up, "
                f"{self.k} needed",
                hint="relays are down or refuse the next hop; try other relays",
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self, path: _Path) -> None:
        onion, path.keys = build_onion(path.hops, self.node_url, self.node_key)
        path.pay_sequences = [0] * len(path.hops)
        path.paid = [0] * len(path.hops)
        path.ident = new_path_id()
        path.created = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(SETUP_TIMEOUT_S):
                path.ws = await self.http.ws_connect(
                    path.hops[0].url.rstrip("/") + "/v1/relay", max_msg_size=4 * 1024 * 1024
                )
                path.reader = asyncio.create_task(self._read(path))
                await path.ws.send_bytes(Cell(CellKind.SETUP, path.ident, onion).to_bytes())
                await path.created
            path.alive = True
        except (
            aiohttp.ClientError,
            OSError,
            TimeoutError,
            OverlayError,
            UnavailableError,
        ) as error:
            # UnavailableError: torn down before CREATED (an exit that did not reach the node,
            # or refused its address): one failed path, the others may still make k
            log.info("overlay: a path via %s did not come up: %s", path.hops[0].url, error)
            self.failed_paths += 1
            path.failed = True

    async def _read(self, path: _Path) -> None:
        assert path.ws is not None
        try:
            async for message in path.ws:
                if message.type != aiohttp.WSMsgType.BINARY:
                    break
                self.bytes_received += len(message.data)
                cell = Cell.from_bytes(message.data)
                if cell.path != path.ident:
                    continue
                if cell.kind is CellKind.CREATED and path.created and not path.created.done():
                    path.created.set_result(None)
                elif cell.kind is CellKind.DATA:
                    raw = unwrap_backward(path.keys, path.backward_seq, cell.body)
                    path.backward_seq += 1
                    path.delivered += 1
                    path.delivered_bytes += len(raw)
                    self._clove(raw)
                    if self.purse is not None and path.due(self.purse.rate):
                        self._pay_soon()
                elif cell.kind is CellKind.DESTROY:
                    break
        except OverlayError as error:  # the path lied: it is over, the others go on
            log.info("overlay: path via %s dropped: %s", path.hops[0].url, error.message)
        finally:
            if path.alive and not self.closed:  # lost while the link was in use
                self.failed_paths += 1
                path.failed = True
            path.alive = False
            if path.created and not path.created.done():
                path.created.set_exception(UnavailableError("the path was torn down"))
            # once the link is up (a path torn down during set-up is counted by `_open`)
            if self.up and not self.closed and sum(p.alive for p in self.paths) < self.k:
                self.inbox.put_nowait(None)
                self._no_info(ConnectionResetError("the overlay link ended before the INFO"))

    def _clove(self, raw: bytes) -> None:
        try:
            whole = self.collector.add(sida.Clove.from_bytes(raw))
        except sida.CloveReplayed:
            return  # a late clove of a message already whole
        except sida.CloveError as error:
            log.info("overlay: refused a clove: %s", error.message)
            return
        if whole is None:
            return
        try:
            message = LinkMessage.from_bytes(whole)
        except InfoInvalid as error:  # whole, so from the node (k paths agree): refused by name
            log.info("overlay: refused the node's INFO: %s", error.message)
            self._no_info(error)
            return
        if message.link != self.ident:
            return
        ready = self.order.add(message)
        if ready is None:  # a gap that never fills: the link is over
            self.inbox.put_nowait(None)
            self._no_info(ConnectionResetError("the overlay link ended before the INFO"))
            return
        for one in ready:
            if one.kind is MessageKind.ACK:
                self._acknowledged(one.body)
            elif one.kind is MessageKind.INFO:
                if self._info is not None and not self._info.done():
                    self._info.set_result(parse_info(one.body))  # checked by from_bytes
            elif one.kind is MessageKind.INFO_ASK:
                continue  # the client's own kind: a node does not send it
            elif one.kind is MessageKind.TEXT:
                self.inbox.put_nowait(
                    aiohttp.WSMessage(aiohttp.WSMsgType.TEXT, one.body.decode(), None)
                )
            elif one.kind is MessageKind.BINARY:
                self.inbox.put_nowait(aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, one.body, None))
            else:
                self.inbox.put_nowait(None)

    # -- paying the relays ----------------------------------------------------------------------

    def _acknowledged(self, body: bytes) -> None:
        """The node's counts of the clove bytes it received, per path: raise each path's
        `acked`, never above what was sent on it (a node cannot make the client pay for
        more)."""
        try:
            acks = Acks.from_bytes(body)
        except AckInvalid as error:
            log.info("overlay: refused an acknowledgement: %s", error.message)
            return
        if len(acks.received) != len(self.paths):
            log.info("overlay: refused an acknowledgement of %d paths", len(acks.received))
            return
        for path, received in zip(self.paths, acks.received, strict=True):
            path.acked = max(path.acked, min(received, path.sent))
        self.acks += 1
        self._acked.set()
        if self.purse is not None:
            self._pay_soon()

    def _pay_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self.pay())
        self._paying.add(task)
        task.add_done_callback(self._paying.discard)

    async def pay(self) -> int:
        """Pay every live path's relays what they are owed now; the credits given."""
        if self.purse is None:
            return 0
        given = 0
        async with self._lock:  # PAY cells and DATA cells leave in one order per path
            for path in self.paths:
                if not path.alive or path.ws is None:
                    continue
                for target, hop in enumerate(path.hops):
                    due = path.due(self.purse.rate, target)
                    if not due:
                        continue
                    paid = await self._pay_relay(path, target, due)
                    path.paid[target] += paid
                    if paid:
                        self.purse.note(hop.url, paid)
                    given += paid
                    if paid < due:
                        return given  # the wallet is short, or the path went
        return given

    async def _pay_relay(self, path: _Path, target: int, due: int) -> int:
        """Give relay `target` of `path` `due` credits, in PAY cells of at most
        MAX_PAY_CREDITS; the credits given (a cell that could not leave gives its back)."""
        assert self.purse is not None and path.ws is not None
        given = 0
        while given < due:
            credits = self.purse.draw(min(MAX_PAY_CREDITS, due - given))
            if credits is None:
                return given
            given_to = to_relay(credits, path.hops[target].key)
            body = wrap_pay(path.keys, path.pay_sequences, target, given_to)
            try:
                await path.ws.send_bytes(Cell(CellKind.PAY, path.ident, body).to_bytes())
            except (ConnectionError, RuntimeError):
                self.purse.give_back(credits)
                return given
            for j in range(target + 1):
                path.pay_sequences[j] += 1
            given += len(credits)
        return given

    # -- the WebSocket surface ------------------------------------------------------------------

    def __aiter__(self) -> OverlayLink:
        return self

    async def __anext__(self) -> aiohttp.WSMessage:
        if self.closed and self.inbox.empty():
            raise StopAsyncIteration
        message = await self.inbox.get()
        if message is None:
            self.closed = True
            raise StopAsyncIteration
        return message

    async def send_json(self, body: Any) -> None:
        await self._send(MessageKind.TEXT, json.dumps(body).encode())

    async def send_bytes(self, data: bytes) -> None:
        await self._send(MessageKind.BINARY, bytes(data))

    async def _send(self, kind: MessageKind, body: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("the overlay link is closed")
        async with self._lock:  # cloves leave in sequence order on every path
            message = LinkMessage(self.ident, self.sent, kind, body)
            self.sent += 1
            cloves = sida.disperse(message.to_bytes(), len(self.paths), self.k)
            for path, clove in zip(self.paths, cloves, strict=True):
                if not path.alive or path.ws is None:
                    continue
                raw = clove.to_bytes()
                payload = wrap_forward(path.keys, path.forward_seq, raw)
                path.forward_seq += 1
                cell = Cell(CellKind.DATA, path.ident, payload).to_bytes()
                try:
                    await path.ws.send_bytes(cell)
                except (ConnectionError, RuntimeError):
                    path.alive = False
                    continue
                path.sent += len(raw)
                self.cells_sent += 1
                self.bytes_sent += len(cell)
            if sum(p.alive for p in self.paths) < self.k:
                raise ConnectionResetError("fewer than k overlay paths are left")

    async def info(self) -> dict[str, Any]:
        """The node's GET /info, asked over this link (an INFO_ASK the node's door answers
        with an INFO: the node sees the exits, never this client). ConnectionResetError when
        the link ends first; the caller bounds the wait."""
        self._info = asyncio.get_running_loop().create_future()
        if sum(p.alive for p in self.paths) < self.k:
            raise ConnectionResetError("fewer than k overlay paths are left")
        await self._send(MessageKind.INFO_ASK, b"")
        return await self._info

    def _no_info(self, error: Exception) -> None:
        if self._info is not None and not self._info.done():
            self._info.set_exception(error)

    def suspects(self) -> set[str]:
        """URLs of the relays on paths that failed, or that stayed silent while another path
        brought back SILENT_AFTER cloves: one of each such path's relays drops, alters or
        lost its link (which one, the client cannot tell)."""
        busiest = max((path.delivered for path in self.paths), default=0)
        out: set[str] = set()
        for path in self.paths:
            if path.failed or (busiest >= SILENT_AFTER and path.delivered == 0):
                out.update(hop.url for hop in path.hops)
        return out

    async def close(self) -> None:
        was_closed = self.closed
        await self._close()
        if not was_closed and self.on_close is not None:
            self.on_close(self)

    async def _close(self) -> None:
        ended = False
        if not self.closed and sum(p.alive for p in self.paths) >= self.k:
            self._acked.clear()
            with contextlib.suppress(ConnectionError):
                await self._send(MessageKind.CLOSE, b"")
                ended = True
        was_closed = self.closed
        self.closed = True
        self.inbox.put_nowait(None)
        if self.purse is not None and not was_closed:
            if ended:  # the node's last count answers the CLOSE
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._acked.wait(), ACK_WAIT_S)
            for task in list(self._paying):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            with contextlib.suppress(Exception):  # paying never stops a close
                await self.pay()
        for path in self.paths:
            if path.ws is not None and not path.ws.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await path.ws.send_bytes(Cell(CellKind.DESTROY, path.ident).to_bytes())
                await path.ws.close()
            if path.reader is not None:
                path.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await path.reader


@dataclass
class OverlayRoute:
    """How a client reaches nodes over the overlay: the relays it draws from and the shape of a
    link (n paths of `length` relays, any k of them enough).

    Relays on a path that failed or stayed silent (`OverlayLink.suspects`) are avoided by later
    draws while enough others remain (the honest relays of such a path are avoided with the
    culprit: the client cannot tell them apart, as with Tor's path failures). `avoided` holds
    them for this process's life.

    `relays` may be replaced while the client runs (`replace`, by node/client/relay_refresh.py):
    new links draw from the new list; links already open keep their paths."""

    relays: tuple[Hop, ...]
    paths: int = DEFAULT_PATHS
    needed: int = DEFAULT_NEEDED
    length: int = DEFAULT_LENGTH
    avoided: set[str] = field(default_factory=set)
    # the entry relays kept across questions (node/client/relay_guards.py); None: drawn afresh
    guards: RelayGuards | None = None
    # called when a link's path did not come up (a relay unreachable): the list may be stale
    on_unreachable: Callable[[], None] | None = None
    # pays the relays of every link's paths for the cloves that arrived (relay_paying.py)
    purse: RelayPurse | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.needed <= self.paths <= sida.MAX_CLOVES:
            raise UsageError(
                f"overlay: need 2 ≤ k ≤ n ≤ {sida.MAX_CLOVES}, got n={self.paths} k={self.needed}"
            )
        choose_paths(self.relays, self.paths, self.length)  # enough distinct relays

    def dialer(self, http: aiohttp.ClientSession) -> Callable[[Any], Awaitable[OverlayLink]]:
        """`CircuitClient(overlay=...)`: an entered OverlayLink to each hop, on fresh paths."""

        async def dial(hop: Any) -> OverlayLink:
            link = OverlayLink(
                http,
                self.draw(),
                hop.url,
                k=self.needed,
                node_key=hop.key,
                on_close=self.report,
                purse=self.purse,
            )
            return await link.__aenter__()

        return dial

    def draw(self) -> list[list[Hop]]:
        """Fresh paths entered by the guards, from the relays not avoided when enough of them
        remain."""
        entries = None
        if self.guards is not None:
            entries = self.guards.entries(self.relays, self.paths, self.avoided)
        trusted = [relay for relay in self.relays if relay.url not in self.avoided]
        pool = trusted if len(trusted) >= self.paths * self.length else list(self.relays)
        kept = {hop.url for hop in entries or []}
        pool = [*(entries or []), *(r for r in pool if r.url not in kept)]
        return choose_paths(pool, self.paths, self.length, entries)

    def replace(self, relays: tuple[Hop, ...]) -> None:
        """Draw new links from `relays` (a fresh `/relays` read); UsageError, and the old list
        kept, when they are too few for this route's paths."""
        choose_paths(relays, self.paths, self.length)  # enough distinct relays
        old, new = {hop.url for hop in self.relays}, {hop.url for hop in relays}
        if old != new:
            log.info(
                "overlay: %d relays listed (%d joined, %d left)",
                len(relays),
                len(new - old),
                len(old - new),
            )
        self.relays = relays

    def report(self, link: OverlayLink) -> None:
        found = link.suspects()
        if found - self.avoided:
            log.warning("overlay: avoiding relays on failed or silent paths: %s", sorted(found))
        self.avoided |= found
        if link.failed_paths and self.on_unreachable is not None:
            self.on_unreachable()


def read_relays(path: Path) -> tuple[Hop, ...]:
    """A relays file: one relay per line, `URL KEY` (its X25519 key, 64 hex digits, as
    `planet relay serve` prints it); blank lines and `#` comments are skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise UsageError(
            f"cannot read the relays file {path}: {error.strerror}",
            hint="give a file of one `URL KEY` line per relay, as `planet relay serve` prints it",
        ) from None
    relays = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        try:
            if len(parts) != 2 or not parts[0].startswith(("http://", "https://")):
                raise ValueError
            key = bytes.fromhex(parts[1])
            if len(key) != 32:
                raise ValueError
        except ValueError:
            raise UsageError(
                f"{path}:{number}: expected `URL KEY` (http(s) URL, 64 hex digits)",
                hint="copy the line `planet relay serve` prints: relay on URL key HEX",
            ) from None
        relays.append(Hop(parts[0].rstrip("/"), key))
    if len({hop.url for hop in relays}) != len(relays):
        raise UsageError(f"{path}: a relay is listed twice")
    return tuple(relays)


def to_relay(credits: list[ThresholdCredit], relay_key: bytes) -> list[ThresholdCredit]:
    """`credits` as relay `relay_key` (its X25519 key) is paid with them: each
    assigned to it (protocol/committee/credit_holder.py `relay_party`) when every one is
    holder-bound, so no other relay or node can redeem them; else as they are (a note holds
    one form)."""
    if not all(isinstance(c, HeldCredit) for c in credits):
        return credits
    party = relay_party(relay_key)
    return [c.assign(party) for c in credits if isinstance(c, HeldCredit)]
