"""CircuitClient: generate through a circuit whose nodes forward to each other (protocol/stream.py).

    client ──▶ A ──▶ B ──▶ C ──▶ client        one WebSocket per link, kept for the client's life

Every link to an https:// hop is TLS pinned to the hop's node key (node/links.py; a node that
does not prove it is refused as `node_key_mismatch` before anything is sent), and the open
names each next hop's key, which the forwarding node pins in turn, and, for a node behind NAT,
its addresses at its other relays (`Hop.alternates` → `next.alternates`: the forwarding node
dials them in turn when the first is not reached, `next_hop`) — only to a forwarding node whose
/info advertises taking them (`open_features`; a node of before refuses such an open).
http:// hops are dialled only on loopback or with `plaintext_links` (local mode;
protocol/links.py).

A token costs K + 1 transfers for K nodes and no per-request HTTP: each transfer is one
WebSocket message with a 17-byte binary header (protocol/frames/header.py). The client holds one
link to every hop: it opens each hop's session there with that hop's own capability
(node/client/capabilities.py) and learns refusals there by name; it feeds the first hop on its
link and reads the last hop's output on its link. Hops pass activations on with per-hop feed
tokens, never capabilities. Many generations share the links (sessions are multiplexed by sid),
so one client drives many sessions, and their decode steps meet at each shard's batcher.

The prompt is sent as chunks back to back (`prefill_chunk` positions each): hop A computes
chunk 2 while hop B computes chunk 1, so prefill is pipelined across nodes.

Failover (node/client/failover.py): the client records which hop failed a session (a link
that closed, a refusal on a hop's link, a refusal naming the hop as the next hop's fault
(`NEXT_HOP_FAULTS`: `downstream_unavailable`, `next_hop_not_allowed`, `node_key_mismatch`, from
the hop before it: `named_by(sid)`), a bad answer from the last hop: `suspects(sid)`); the
generation loop replaces that hop and replays the token history into a new session at the same
positions. Per-hop commitments stay possible: each
hop computes, and so sees, its own output, and the client can name every hop's session by its
public tag (`session_tags`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import numpy as np

from node.client.capabilities import hop_capability, hop_feed, hop_prefix_salt, hop_tag
from node.client.paying import CreditPayer, UnpaidError, payee
from node.client.ring_vouch import VouchBook
from node.client.sampling import SamplingConfig
from node.client.speculation import SpeculationConfig, SpeculationStats
from node.client.types import Head, Hop, Timings
from node.dial import first_reachable, refuse_redirects
from node.links import link_ssl, refusal
from protocol.errors import (
    BusyError,
    ConfigError,
    PlanetError,
    ProtocolError,
    RemoteError,
    UnavailableError,
)
from protocol.frames.codecs import DTYPES, decode_values, encode_body
from protocol.frames.dtypes import WIRE_DTYPE
from protocol.frames.errors import FrameError
from protocol.frames.header import FrameHeader, pack_frame, parse_frame
from protocol.frames.sessions import check_session_id
from protocol.links import is_encrypted
from protocol.open_features import OLD_NODE, OpenFeatures
from protocol.prefix_routes import route_keys
from protocol.ring import RingSpec
from protocol.ring_tokens import RingTokens, is_ring_tokens, parse_ring_tokens
from protocol.ring_vouch import VouchError, is_ring_vouch, parse_ring_vouch
from protocol.stream import (
    CREDIT_NOT_ASSIGNED,
    MAX_NEXT_ALTERNATES,
    MAX_SESSION_FRAMES,
    CreditNotTakenError,
    NextHop,
    PaymentRequiredError,
    not_assigned_id,
    not_taken_id,
    open_message,
    parse_control,
    pay_message,
    ws_frame_bytes,
)

log = logging.getLogger(__name__)

_FROM_NODE = frozenset({"opened", "closed", "error"})
PREFILL_WINDOW = 8  # prefill chunks outstanding per session (≤ MAX_SESSION_FRAMES)
MAX_ANSWER_TOKENS = 8192
SETTLE_CREDITS_S = 2.0  # a closing client waits this long for credits a hop did not keep
MAX_BLAMED = 1024  # failed sessions whose faulty hop a client remembers
# refusals by which a hop names its NEXT hop as the fault, not itself: it could not reach or
# attach to it (`downstream_unavailable`), its next-hop policy does not list it (yet:
# `next_hop_not_allowed`, e.g. a node that moved shards a moment ago), or it proved another
# key than the one the chain registers for it (`node_key_mismatch`). From the last hop (no next
# hop) they are that hop's own fault.
NEXT_HOP_FAULTS = frozenset({"downstream_unavailable", "next_hop_not_allowed", "node_key_mismatch"})


class BadStreamAnswerError(ProtocolError):
    """A node sent something on the client's link that does not answer what was asked."""

    code = "bad_answer"
    http_status = 502


def _node_error(hop: Hop, code: str, message: str, *, unpaid: bool = False) -> PlanetError:
    """The error a hop's refusal raises; `unpaid`: the client sent that hop its positions
    unpaid, knowing it charges (a `payment_required` from it is then final: `UnpaidError`)."""
    if unpaid and code == PaymentRequiredError.code:
        return UnpaidError(hop.url, hop.shard, message)
    if code == "busy":
        return BusyError(
            f"node {hop.url} (shard {hop.shard}) is busy: {message}",
            hint="retry in a moment, or add nodes for this shard",
        )
    return RemoteError(f"node {hop.url} (shard {hop.shard})", code, message, http_status=502)


class _Link:
    """The client's WebSocket to one hop: control answers and (last hop) outputs."""

    def __init__(self, client: CircuitClient, index: int, ws: aiohttp.ClientWebSocketResponse):
        self.client = client
        self.index = index
        self.hop = client.hops[index]
        self.ws = ws
        self.pending: dict[int, asyncio.Future[None]] = {}
        self.opened: set[int] = set()  # sids this hop answered `opened` for
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        client = self.client
        try:
            async for message in self.ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    client.bytes_received += ws_frame_bytes(len(message.data), masked=False)
                    self._data(message.data)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    self._control(message.data)
        finally:
            gone = UnavailableError(
                f"node {self.hop.url} (shard {self.hop.shard}) closed the stream",
                hint="the node stopped or restarted; retry on another circuit",
            )
            if not client.closing:
                client.lost_hops.add(self.index)
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(gone)
            for queue in client.outputs.values():
                queue.put_nowait(gone)

    def _control(self, text: str) -> None:
        try:
            control = parse_control(text, _FROM_NODE)
        except FrameError as error:
            log.warning("node %s sent a bad control message: %s", self.hop.url, error.message)
            return
        future = self.pending.pop(control.sid, None)
        if control.op == "opened":
            self.opened.add(control.sid)
        if control.op == "error" and control.code == CreditNotTakenError.code:
            self._not_taken(control.sid, control.message or "")
            if future is not None:  # not the answer it waits for
                self.pending[control.sid] = future
            return
        if control.op == "error" and control.code == CREDIT_NOT_ASSIGNED:
            self._not_assigned(control.sid, control.message or "")  # and the session fails
        if control.op == "error":
            code = control.code or "http_error"
            unpaid = self.client.unpaid(self.index)
            error = _node_error(self.hop, code, control.message or "", unpaid=unpaid)
            if not isinstance(error, UnpaidError):  # that one is the client's doing, not the hop's
                if code in NEXT_HOP_FAULTS and self.index + 1 < len(self.client.hops):
                    # the hop followed its rules; it names its next hop as the fault (its word
                    # only: `named_by`, so the gateway cools that node briefly, not for a fault
                    # it saw itself)
                    self.client.blame_hop(control.sid, self.index + 1, named_by=self.index)
                else:
                    self.client.blame_hop(control.sid, self.index)
            if future is not None and not future.done():
                future.set_exception(error)
            elif control.sid in self.client.outputs:
                self.client.outputs[control.sid].put_nowait(error)
            else:
                log.warning("node %s refused: %s", self.hop.url, error.message)
        elif future is not None and not future.done():
            future.set_result(None)

    def _not_taken(self, sid: int, message: str) -> None:
        """The hop did not keep a credit it was paid (the session was not open there): back
        into the wallet with it. Not a session error: the session goes on or failed anyway."""
        identifier = not_taken_id(message)
        payer = self.client.payer
        slots = self.client.slots_of.get(self.index, [self.index])
        if (
            identifier is None
            or payer is None
            or not any(payer.give_back(sid, slot, identifier) for slot in slots)
        ):
            log.warning("node %s: a credit not taken, unknown here: %s", self.hop.url, message)
        elif sid not in self.client.outputs and not payer.pending(sid):
            self.client.paid_sids.discard(sid)  # a closed session, every credit settled

    def _not_assigned(self, sid: int, message: str) -> None:
        """The hop refused a credit before taking it: its assignment was not for that node
        (`CreditPayer.not_assigned`); a holder-bound one goes back into the wallet."""
        identifier = not_assigned_id(message)
        payer = self.client.payer
        slots = self.client.slots_of.get(self.index, [self.index])
        if (
            identifier
            and payer is not None
            and any(payer.not_assigned(sid, slot, identifier) for slot in slots)
        ):
            log.info("node %s: a credit not assigned to it is back in the wallet", self.hop.url)
        else:
            log.warning("node %s: a credit not assigned, not given back: %s", self.hop.url, message)

    def _data(self, data: bytes) -> None:
        client = self.client
        item: tuple[FrameHeader, bytes] | RingTokens
        if is_ring_vouch(data):  # a ring session's last hop vouches for its rows
            self._vouch(data)
            return
        try:
            if is_ring_tokens(data):  # a ring session's tokens, from its first hop
                item = parse_ring_tokens(data, client.hidden_size)
                sid = item.sid
                if self.index != 0 or sid not in client.ring_sids:
                    raise FrameError("only a ring session's first hop sends it tokens")
            else:
                header, body = parse_frame(data, client.hidden_size, MAX_ANSWER_TOKENS)
                sid = header.sid
                # a ring session's outputs come from its first hop (the ring passes them on)
                answers = 0 if sid in client.ring_sids else len(client.hops) - 1
                if self.index != answers:
                    raise FrameError("only the last hop sends outputs to the client")
                item = (header, bytes(body))
        except FrameError as error:
            log.warning("node %s sent a bad frame: %s", self.hop.url, error.message)
            return
        queue = client.outputs.get(sid)
        if queue is not None:
            queue.put_nowait(item)

    def _vouch(self, data: bytes) -> None:
        """A vouch message: refused by name (logged, dropped) unless it is the last hop's for
        a ring session that asked it to vouch; one out of that session's positions fails the
        session (`bad_vouch`, the last hop blamed), no other."""
        client = self.client
        book: VouchBook | None = None
        try:
            vouch = parse_ring_vouch(data)
            if self.index != len(client.hops) - 1:
                raise VouchError("only a ring session's last hop vouches for its rows")
            book = client.vouches.get(vouch.sid)
            if book is None:
                raise VouchError(f"sid {vouch.sid}: no ring session asked this hop to vouch")
            book.take(vouch)
        except FrameError as error:
            log.warning("node %s sent a bad ring vouch: %s", self.hop.url, error.message)
            if isinstance(error, VouchError) and book is not None and book.failed is None:
                client.blame_hop(vouch.sid, self.index)
                book.fail(error)
                queue = client.outputs.get(vouch.sid)
                if queue is not None:  # the ring's reader stops on it at once
                    queue.put_nowait(error)

    async def request(self, body: dict[str, Any], sid: int, timeout_s: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending[sid] = future
        try:
            await self.ws.send_json(body)
            async with asyncio.timeout(timeout_s):
                await future
        except TimeoutError:
            self.client.blame_hop(sid, self.index)
            raise UnavailableError(f"node {self.hop.url} did not answer {body['op']}") from None
        except (ConnectionError, RuntimeError) as error:
            self.client.blame_hop(sid, self.index)
            raise UnavailableError(f"node {self.hop.url} stream failed: {error}") from None
        finally:
            self.pending.pop(sid, None)


class _HeadBatcher:
    """Logits of the sessions whose outputs arrived together, in one matmul (the LM head is the
    client's largest cost per token on a CPU: ~19 ms for SmolLM2 at load 9); a head without
    `logits_batch_np` is called once per session."""

    def __init__(self) -> None:
        self._pending: list[tuple[Any, np.ndarray, asyncio.Future[np.ndarray]]] = []
        self._task: asyncio.Task[None] | None = None

    async def logits(self, head: Any, hidden_last: np.ndarray) -> np.ndarray:
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending.append((head, hidden_last, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        await asyncio.sleep(0)  # sessions whose outputs came in the same read join this batch
        while self._pending:
            batch, self._pending = self._pending, []
            groups: dict[int, list[tuple[Any, np.ndarray, asyncio.Future[np.ndarray]]]] = {}
            for item in batch:
                groups.setdefault(id(item[0]), []).append(item)
            for items in groups.values():
                head = items[0][0]
                try:
                    if len(items) > 1 and hasattr(head, "logits_batch_np"):
                        rows = head.logits_batch_np(np.stack([h for _, h, _ in items]))
                        results = [rows[b] for b in range(len(items))]
                    else:
                        results = [head.logits_np(h) for _, h, _ in items]
                except Exception as error:
                    for _, _, future in items:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, _, future), logits in zip(items, results, strict=True):
                    if not future.done():
                        future.set_result(logits)


def next_hop(hop: Hop, feed: str, previous: OpenFeatures = OLD_NODE) -> NextHop:
    """What an open tells the previous hop about `hop`: its URL, shard, feed and key, and, for a
    node behind NAT, its addresses at its other relays (`Hop.alternates`: the https:// ones,
    distinct, at most MAX_NEXT_ALTERNATES; only with its key, which pins every one), so the
    previous hop dials the next of them when `url` is not reached. The alternates go only to a
    previous hop that advertises taking them (`previous`, from its /info:
    protocol/open_features.py): a node of before refuses an open that carries them."""
    alternates: tuple[str, ...] = ()
    if hop.key is not None and previous.next_alternates:
        kept = dict.fromkeys(a for a in hop.alternates if is_encrypted(a) and a != hop.url)
        alternates = tuple(kept)[:MAX_NEXT_ALTERNATES]
    return NextHop(url=hop.url, shard=hop.shard, feed=feed, key=hop.key, alternates=alternates)


class CircuitClient:
    """Persistent WebSockets to every node of one circuit. Use as `async with`."""

    def __init__(
        self,
        hops: Sequence[Hop],
        *,
        hidden_size: int,
        codec: str = "raw",
        dtype: str = WIRE_DTYPE,
        request_timeout_s: float = 120.0,
        prefill_chunk: int = 64,
        prefill_window: int = PREFILL_WINDOW,
        http: aiohttp.ClientSession | None = None,
        plaintext_links: bool = False,
        payer: CreditPayer | None = None,
        overlay: Callable[[Hop], Awaitable[Any]] | None = None,
        known_prices: Mapping[str, int] | None = None,
        prefix_isolation: str | None = None,
    ) -> None:
        if not hops:
            raise ConfigError("a circuit needs at least one node")
        self.hops = tuple(hops)
        # who is paid: one payee per hop, a span hop one per shard (`payee`: its URL, or its
        # URL and shard), each a slot of the payer's (sid, slot) tallies
        self.payees: list[tuple[int, int | None, str]] = []  # (hop index, span shard, payee)
        self.slots_of: dict[int, list[int]] = {}
        for index, hop in enumerate(self.hops):
            shards = [None] if hop.span.size == 1 else list(hop.span.shards)
            for shard in shards:
                self.slots_of.setdefault(index, []).append(len(self.payees))
                self.payees.append((index, shard, payee(hop.url, shard)))
        self.hidden_size = hidden_size
        self.codec = codec
        if dtype not in DTYPES:
            raise ConfigError(f"wire dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.dtype = dtype  # raw frames' activations: WIRE_DTYPE (fp16) unless asked otherwise
        self.request_timeout_s = request_timeout_s
        self.prefill_chunk = prefill_chunk
        if not 1 <= prefill_window <= MAX_SESSION_FRAMES:
            raise ConfigError(f"prefill_window must be 1..{MAX_SESSION_FRAMES}")
        self.prefill_window = prefill_window
        # local mode: http:// hops off loopback too (protocol/links.py); https:// hops are
        # always pinned to their node key
        self.plaintext_links = plaintext_links
        # reach each hop through relay paths instead of a direct WebSocket: called per hop, it
        # returns an entered `node.client.overlay.OverlayLink` (the node never sees this client)
        self.overlay = overlay
        # pays the charging hops a credit per chunk of positions, ahead of each frame
        # (node/client/paying.py); None: the nodes compute for free (or are paid otherwise)
        self.payer = payer
        # without a payer: each hop's price (positions per credit, 0 free) as this client
        # learned it (node/client/replicas.py: /info), so that a `payment_required` from a hop
        # it knowingly sent unpaid is final (`unpaid`); unknown: a node believed free
        self.known_prices = known_prices if known_prices is not None else {}
        # the user's isolation secret: each open carries a per-node salt derived from it
        # (`hop_prefix_salt`), so nodes reuse cached prompt blocks only among this user's
        # sessions (docs/privacy.md); None: shared with every session that asks for none
        if prefix_isolation is not None:
            try:
                check_session_id(prefix_isolation)
            except FrameError:
                raise ConfigError(
                    "the prefix isolation secret must be 22-64 characters of [A-Za-z0-9_-]",
                    hint="draw one with node.client.capabilities.new_session_id() and keep it",
                ) from None
        self.prefix_isolation = prefix_isolation
        # node URL → its public prefix-route salt (its /info `prefix_routes`): an open with a
        # prompt sends that node the prompt's route keys (protocol/prefix_routes.py)
        self.route_salts: dict[str, str] = {}
        # node URL → the open fields it takes beyond the first open (its /info
        # `open_features`, protocol/open_features.py): an open tells a previous hop its next
        # hop's `alternates` only when it takes them; unknown: a node of before
        self.open_features: dict[str, OpenFeatures] = {}
        self._sent: dict[int, int] = {}  # sid → positions sent (every hop computes each)
        self._http = http
        self._own_http = http is None
        self.links: list[_Link] = []
        self.outputs: dict[int, asyncio.Queue[Any]] = {}
        self._sids = itertools.count(1)  # without a payer (with one: `payer.new_sid`)
        self.paid_sids: set[int] = set()  # sessions with credits the payer still tracks
        self.ring_sids: set[int] = set()  # sessions whose loop their first hop runs (ring.py)
        # ring sessions whose last hop vouches for its rows (node/client/ring_vouch.py)
        self.vouches: dict[int, VouchBook] = {}
        self._heads = _HeadBatcher()
        self.blame: dict[int, int] = {}  # sid -> index of the hop that failed that session
        # sid -> more hops blamed with it (a ring's relayed row is not the one its last hop
        # vouched for: the client cannot tell which hop lied, node/client/ring.py
        # `check_vouched`)
        self.co_blamed: dict[int, frozenset[int]] = {}
        # sid -> index of the hop whose refusal named the blamed hop (absent: the client saw
        # the blamed hop fail itself)
        self.named: dict[int, int] = {}
        self.lost_hops: set[int] = set()  # hops whose link closed (every session failed there)
        self.closing = False  # __aexit__ runs: links closing now are not the nodes' failure
        self.bytes_sent = 0  # client's own WebSocket bytes (framing included)
        self.bytes_received = 0

    async def __aenter__(self) -> CircuitClient:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                skip_auto_headers=("User-Agent",), middlewares=(refuse_redirects,)
            )
        try:
            for index, hop in enumerate(self.hops):
                if self.overlay is not None:
                    self.links.append(_Link(self, index, await self.overlay(hop)))
                    continue
                try:
                    _, ws = await first_reachable(
                        hop.addresses,
                        functools.partial(self._dial, hop),
                        total_s=self.request_timeout_s,
                        what=f"node {hop.url} (shard {hop.shard})",
                    )
                except (aiohttp.ClientError, OSError, TimeoutError) as error:
                    named = refusal(error, hop.url)
                    if named is not None:
                        raise named from None
                    raise UnavailableError(
                        f"node {hop.url} (shard {hop.shard}) is not reachable: "
                        f"{type(error).__name__} {error}".rstrip(),
                        hint="check `planet local status`, or start nodes with `planet local up`",
                    ) from None
                self.links.append(_Link(self, index, ws))
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _dial(self, hop: Hop, url: str) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to `hop` at `url` (its endpoint or another relay's port for it), TLS
        pinned to its key."""
        assert self._http is not None
        pin = link_ssl(url, hop.key, plaintext_ok=self.plaintext_links)
        return await self._http.ws_connect(
            f"{url}/v1/stream", max_msg_size=64 * 1024 * 1024, ssl=pin
        )

    async def __aexit__(self, *exc: object) -> None:
        await self._settle_credits()
        self.closing = True
        for link in self.links:
            await link.ws.close()
            link.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link.reader
        self.links = []
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None

    async def _settle_credits(self) -> None:
        """Before the links close: wait (bounded) for the hops that neither opened a session
        nor refused its credits yet — a refused open's credits come back `credit_not_taken`
        right behind the refusal, and go back into the wallet."""
        payer = self.payer
        if payer is None or not self.links:
            return
        links = self.links

        def opened(sid: int, slot: int) -> bool:
            hop = self.payees[slot][0]
            return sid in links[hop].opened or links[hop].reader.done()

        mine = self.paid_sids  # this circuit's sessions: others sharing the payer run on
        deadline = time.monotonic() + SETTLE_CREDITS_S
        while payer.unsettled(opened, mine) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if payer.unsettled(opened, mine):
            log.warning(
                "credits sent to hops that never opened their session nor gave them back: %d",
                payer.unsettled(opened, mine),
            )

    def unpaid(self, index: int) -> bool:
        """Hop `index` charges credits, as far as this client knows, and this client pays no
        node: its positions go there unpaid, and its `payment_required` is this client's own
        doing (`UnpaidError`, final). With a payer every charging hop is paid ahead of each
        frame, so a refusal means the hop did not count what it was paid: its failure."""
        return self.payer is None and any(
            self.known_prices.get(self.payees[slot][2], 0) > 0
            for slot in self.slots_of.get(index, [])
        )

    # ------------------------------------------------------------------------------- tokens
    def capabilities(self, secret: str) -> list[str]:
        return [hop_capability(secret, i, h.shard, h.url) for i, h in enumerate(self.hops)]

    def feeds(self, secret: str) -> list[str]:
        return [hop_feed(secret, i, h.shard, h.url) for i, h in enumerate(self.hops)]

    def session_tags(self, secret: str) -> list[str]:
        return [hop_tag(secret, i, h.shard, h.url) for i, h in enumerate(self.hops)]

    # ------------------------------------------------------------------------------- sessions
    def new_sid(self) -> int:
        """A fresh sid for `open` (so a caller knows it even when the open fails). With a
        payer, from the payer: the circuits of a gateway share one, and each (sid, hop) tally
        there must be one session's."""
        return self.payer.new_sid() if self.payer is not None else next(self._sids)

    async def open(
        self,
        secret: str,
        sid: int | None = None,
        *,
        wait: bool = True,
        prompt: Sequence[int] | None = None,
        ring: RingSpec | None = None,
        vouch: bool = False,
    ) -> int:
        """Open the session on every hop at once (one round trip, not one per hop: a hop whose
        upstream attaches before the client's open arrived waits for it); returns the sid that
        names it on the client's links. The first refusal closes the session everywhere.

        `wait=False` returns once the opens are sent: the caller's frames may follow at once
        (each hop holds a session's frames until its open, or its upstream's attach, settled),
        which takes the open's round trips off the first token (4 one-way delays, not 8, on a
        3-hop circuit). A refusal then comes out of `receive` by name, its hop blamed.

        `prompt`: the ids the session will prefill; each hop whose route salt is known
        (`route_salts`) gets their prefix-route keys (not with `prefix_isolation`).
        `ring`: the first hop runs the session's decode loop (node/client/ring.py); every
        later hop is opened `back` (its outputs go back up the circuit); `vouch`: the last of
        them (K > 1) also vouches for its rows on the client's link (`vouch_ready`)."""
        if not self.links:
            raise RuntimeError("CircuitClient used outside `async with`")
        sid = self.new_sid() if sid is None else sid
        self.outputs[sid] = asyncio.Queue()
        caps, feeds = self.capabilities(secret), self.feeds(secret)
        last = len(self.hops) - 1
        bodies = []
        for index in range(last, -1, -1):  # last first: its open is the first on its way
            nxt = None
            if index < last:
                hop = self.hops[index + 1]
                previous = self.open_features.get(self.hops[index].url, OLD_NODE)
                nxt = next_hop(hop, feeds[index + 1], previous)
            hop = self.hops[index]
            salt = None
            routes: list[str] = []
            if self.prefix_isolation is not None:
                salt = hop_prefix_salt(self.prefix_isolation, hop.shard, hop.url)
            elif prompt is not None and hop.url in self.route_salts:
                upstream = [h.url for h in self.hops[:index]]
                routes = route_keys(self.route_salts[hop.url], upstream, prompt)
            body = open_message(
                sid,
                caps[index],
                hop.shard,
                feeds[index] if index else None,
                nxt,
                salt,
                routes,
                ring=ring if index == 0 else None,
                back=ring is not None and index > 0,
                vouch=vouch and ring is not None and 0 < index == last,
            )
            bodies.append((index, body))
        if not wait:
            for index, body in bodies:
                try:
                    await self.links[index].ws.send_json(body)
                except (ConnectionError, RuntimeError) as error:
                    self.blame_hop(sid, index)
                    await self.close(sid)
                    raise UnavailableError(
                        f"node {self.hops[index].url} stream failed: {error}"
                    ) from None
            return sid
        requests = [
            asyncio.create_task(self.links[index].request(body, sid, self.request_timeout_s))
            for index, body in bodies
        ]
        try:
            done, pending = await asyncio.wait(requests, return_when=asyncio.FIRST_EXCEPTION)
            failed = [task for task in done if task.exception() is not None]
            if failed:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                raise failed[0].exception()  # type: ignore[misc]
        except BaseException:
            for task in requests:
                task.cancel()
            await asyncio.gather(*requests, return_exceptions=True)
            await self.close(sid)
            raise
        return sid

    async def close(self, sid: int) -> None:
        """Close the session on every hop (best effort; a closed link closed it already)."""
        self.outputs.pop(sid, None)
        self._sent.pop(sid, None)
        self.ring_sids.discard(sid)
        self.vouches.pop(sid, None)
        if self.payer is not None:
            opened = {i for i, link in enumerate(self.links) if sid in link.opened}
            self.payer.forget(sid, {s for s, (i, _, _) in enumerate(self.payees) if i in opened})
            if not self.payer.pending(sid):
                self.paid_sids.discard(sid)
        for link in self.links:
            link.opened.discard(sid)
        for link in self.links:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await link.ws.send_json({"op": "close", "sid": sid})

    async def send(
        self,
        sid: int,
        start: int,
        hidden: np.ndarray,
        last_only: bool = True,
        *,
        rewind: bool = False,
    ) -> None:
        """Feed rows [1, T, H] at positions start.. to the first hop. `rewind`: every hop first
        drops its cached positions >= start (speculative decoding, node/client/speculation.py)."""
        header = FrameHeader(
            sid, start, int(hidden.shape[1]), self.dtype, self.codec, last_only, rewind
        )
        message = pack_frame(header, encode_body(hidden, self.dtype, self.codec))
        if self.payer is not None:
            await self._pay(sid, header.count)
        try:
            await self.links[0].ws.send_bytes(message)
        except (ConnectionError, RuntimeError) as error:
            self.blame_hop(sid, 0)
            raise UnavailableError(f"node {self.hops[0].url} stream failed: {error}") from None
        self.bytes_sent += ws_frame_bytes(len(message), masked=True)

    def ring_ready(self) -> bool:
        """Every hop takes the ring's open fields (its /info `open_features`): the first runs
        the loop (`ring`), the later ones send outputs back (`ring_back`)."""
        features = [self.open_features.get(hop.url, OLD_NODE) for hop in self.hops]
        return features[0].ring and all(f.ring_back for f in features[1:])

    def vouch_ready(self) -> bool:
        """A ring on this circuit can be checked against its last hop's vouches: K > 1 (with
        one node, first and last are the same) and the last hop takes `vouch` (/info
        `ring_vouch`)."""
        last = self.open_features.get(self.hops[-1].url, OLD_NODE)
        return len(self.hops) > 1 and last.ring_vouch

    async def pay_upto(self, sid: int, targets: Sequence[int]) -> None:
        """Pay every charging payee i (a hop, or one shard of a span hop: `payees`) so that
        `targets[i]` positions of `sid` are paid there (the ring pays ahead of the loop:
        node/client/ring.py)."""
        if self.payer is None:
            return
        urls = [name for _, _, name in self.payees]  # a span hop: one payee per shard
        owed = self.payer.due_each(sid, urls, list(targets))
        if any(owed):
            await self._send_credits(sid, urls, owed)

    async def _pay(self, sid: int, count: int) -> None:
        """Pay every charging hop for the positions sent so far and `count` more, each on the
        client's own link to it (ahead of the frame: the first hop reads the `pay` first)."""
        assert self.payer is not None
        sent = self._sent.get(sid, 0) + count
        urls = [name for _, _, name in self.payees]  # a span hop: one payee per shard
        owed = self.payer.due(sid, urls, sent)
        if any(owed):
            await self._send_credits(sid, urls, owed)
        self._sent[sid] = sent

    async def _send_credits(self, sid: int, urls: list[str], owed: list[int]) -> None:
        """Send `owed[slot]` credits to each payee slot (a hop, or one shard of a span hop), on
        the client's own link to its hop."""
        assert self.payer is not None
        for slot, credits in enumerate(self.payer.take(owed)):
            index, shard, _ = self.payees[slot]
            for credit in credits:
                try:
                    given = self.payer.to_hop(urls[slot], credit)
                    await self.links[index].ws.send_json(pay_message(sid, given, shard))
                except (ConnectionError, RuntimeError) as error:
                    self.blame_hop(sid, index)
                    raise UnavailableError(
                        f"node {self.hops[index].url} stream failed: {error}"
                    ) from None
                self.payer.paid(sid, slot, urls[slot], credit)
                self.paid_sids.add(sid)

    async def receive(
        self, sid: int, start: int, count: int, timeout_s: float | None = None
    ) -> np.ndarray:
        """The last hop's output for the rows sent at start.. (count rows; 1 if last_only),
        within `timeout_s` (default `request_timeout_s`; a stalled circuit is UnavailableError
        with no hop blamed: `suspects` then asks the hops)."""
        wait_s = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(wait_s):
                item = await self.outputs[sid].get()
        except TimeoutError:
            raise UnavailableError(f"no answer from the circuit within {wait_s:g} s") from None
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, RingTokens):
            self.blame_hop(sid, 0)
            raise BadStreamAnswerError(f"node {self.hops[0].url} sent tokens before the prompt")
        header, body = item
        got = (header.start, header.count, header.dtype, header.codec)
        if got != (start, count, self.dtype, self.codec):
            self.blame_hop(sid, 0 if sid in self.ring_sids else len(self.hops) - 1)
            raise BadStreamAnswerError(
                f"node {self.hops[-1].url} answered rows {header.start}+{header.count} "
                f"({header.dtype}/{header.codec}), expected {start}+{count}"
            )
        try:
            return decode_values(header.dtype, header.codec, (1, count, self.hidden_size), body)
        except FrameError as error:
            self.blame_hop(sid, len(self.hops) - 1)
            raise BadStreamAnswerError(f"node {self.hops[-1].url}: {error.message}") from None

    async def receive_ring(
        self, sid: int, start: int, timeout_s: float | None = None
    ) -> RingTokens:
        """The next ring tokens message of `sid`, whose first row must be at `start`."""
        wait_s = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(wait_s):
                item = await self.outputs[sid].get()
        except TimeoutError:
            raise UnavailableError(f"no tokens from the ring within {wait_s:g} s") from None
        if isinstance(item, BaseException):
            raise item
        if not isinstance(item, RingTokens) or item.start != start:
            self.blame_hop(sid, 0)
            got = "a frame" if not isinstance(item, RingTokens) else f"tokens from {item.start}"
            raise BadStreamAnswerError(
                f"node {self.hops[0].url} sent {got}, expected ring tokens from {start}"
            )
        if (item.dtype, item.codec) != (self.dtype, self.codec):
            self.blame_hop(sid, 0)
            raise BadStreamAnswerError(f"node {self.hops[0].url}: ring rows in another encoding")
        return item

    def blame_hop(
        self,
        sid: int,
        index: int,
        *,
        named_by: int | None = None,
        also: Sequence[int] = (),
    ) -> None:
        """Remember that hop `index` failed session `sid` (the first fault counts); `named_by`:
        the hop whose refusal named it (NEXT_HOP_FAULTS), None when the client saw it fail;
        `also`: more hops blamed with it (one of them lied, the client cannot tell which).
        Kept after the session closed, for the failover that asks; only the latest
        MAX_BLAMED are kept."""
        if sid in self.blame:
            return
        self.blame[sid] = index
        if named_by is not None:
            self.named[sid] = named_by
        if also:
            self.co_blamed[sid] = frozenset(also)
        while len(self.blame) > MAX_BLAMED:
            oldest = next(iter(self.blame))
            self.named.pop(oldest, None)
            self.co_blamed.pop(oldest, None)
            del self.blame[oldest]

    def named_by(self, sid: int) -> int | None:
        """The hop whose refusal named session `sid`'s blamed hop (its next hop) as the fault,
        or None (the client saw the fault itself, or nobody is blamed)."""
        return self.named.get(sid)

    def suspects(self, sid: int) -> set[int]:
        """Hops known to have failed session `sid`: the one that refused it or answered badly,
        and every hop whose link closed. Empty when the failure named nobody (a stall)."""
        blamed = {self.blame[sid]} if sid in self.blame else set()
        blamed |= self.co_blamed.get(sid, frozenset())
        return set(self.lost_hops) | blamed

    async def logits(self, head: Head, hidden_last: np.ndarray) -> np.ndarray:
        """The head's logits for one session's last hidden state, batched with the other
        sessions of this client whose outputs arrived together."""
        return await self._heads.logits(head, hidden_last)

    async def prefill(
        self,
        sid: int,
        ids_hidden: np.ndarray,
        start: int = 0,
        *,
        last_only: bool = True,
        on_chunk: Callable[[int, np.ndarray], None] | None = None,
        split_at: int | None = None,
        timeout_s: float | None = None,
        on_sent: Callable[[], Awaitable[None]] | None = None,
    ) -> np.ndarray:
        """Send [1, T, H] in chunks back to back (pipelined); the last row's output [1, 1, H].
        `last_only=False` asks the last hop for every position of each chunk; `on_chunk(start,
        hidden)` then sees each chunk's output ([1, rows, H]) as it arrives. `split_at` starts
        a new chunk there (a replay keeps the prompt's own chunks, so its KV is computed exactly
        as the first time); `timeout_s` bounds each chunk's wait (see `receive`). `on_sent()`
        runs once, right after the last chunk went (a ring pays ahead of its loop there)."""
        total = int(ids_hidden.shape[1])
        split = total if split_at is None else max(0, min(split_at, total))
        bounds = [*range(0, split, self.prefill_chunk), *range(split, total, self.prefill_chunk)]
        ends = [*bounds[1:], total]
        sent = 0

        async def send_upto(count: int) -> None:
            nonlocal sent
            while sent < min(count, len(bounds)):
                begin, end = bounds[sent], ends[sent]
                await self.send(sid, start + begin, ids_hidden[:, begin:end], last_only)
                sent += 1
                if sent == len(bounds) and on_sent is not None:
                    await on_sent()

        # at most `prefill_window` chunks outstanding: enough to keep every hop busy, and a
        # long prompt never has more frames queued at a node than its per-session limit
        await send_upto(self.prefill_window)
        out = None
        for index, (begin, end) in enumerate(zip(bounds, ends, strict=True)):
            if last_only:
                out = await self.receive(sid, start + end - 1, 1, timeout_s)
            else:
                out = await self.receive(sid, start + begin, end - begin, timeout_s)
            if on_chunk is not None:
                on_chunk(start + begin, out)
            await send_upto(index + 1 + self.prefill_window)
        assert out is not None
        return out[:, -1:, :]

    @property
    def alive(self) -> bool:
        """Every link is connected and read (false once a node closed or dropped its link)."""
        return bool(self.links) and all(
            not link.ws.closed and not link.reader.done() for link in self.links
        )

    # ------------------------------------------------------------------------------- generate
    def generate(
        self,
        head: Head,
        prompt_ids: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        timings: Timings | None = None,
        stop_on_eos: bool = True,
        prefill_last_only: bool = True,
        on_prefill: Callable[[int, np.ndarray], None] | None = None,
        on_logits: Callable[[np.ndarray], None] | None = None,
        speculation: SpeculationConfig | None = None,
        stats: SpeculationStats | None = None,
    ) -> AsyncIterator[int]:
        """Yield new token ids as they are chosen; stops on EOS (not yielded) or the limit.
        `stop_on_eos=False` (benchmarks) always runs `max_new_tokens` steps.
        `prefill_last_only=False`: the prompt's frames ask the last node for every
        position (the gateway sends every question so, which makes echo requests look like any
        other); `on_prefill(start, hidden)` sees each prefill chunk's final hidden states.
        `on_logits(logits)` sees the logits each token is sampled from, before it is yielded
        (the head stays the caller's one object, so sessions sharing it batch their logits).
        `speculation`: several tokens per pass (node/client/speculation.py), counted in `stats`.
        On this one circuit only: the first failure is raised (`node.client.failover`
        replaces failed hops and continues)."""
        from node.client.failover import NO_FAILOVER, FixedCircuit, generate  # no cycle at import

        return generate(
            FixedCircuit(self),
            head,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            timings=timings,
            stop_on_eos=stop_on_eos,
            prefill_last_only=prefill_last_only,
            on_prefill=on_prefill,
            on_logits=on_logits,
            policy=NO_FAILOVER,
            speculation=speculation,
            stats=stats,
        )
