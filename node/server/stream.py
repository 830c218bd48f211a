"""`GET /v1/stream`: a node's end of a circuit's links (protocol/stream.py), client → A → B → C →
client.

One WebSocket per link. A client opens a session on its own link to every hop (with that hop's
capability); a hop that is not the last attaches the session with the feed token over its link
to the next hop (node/server/link_pool.py: one persistent link per next URL and node key, shared
by all sessions, dialled ahead for the next shard's replicas so an open pays no handshake). An
https:// next hop is dialled over TLS pinned to the node key the open names
(node/links.py), at its URL or, behind NAT, at its addresses at its other relays
(`next.alternates`, in turn): a peer that does not prove it is refused as `node_key_mismatch`;
an http:// one only on loopback or in local mode (`--plaintext-links`), else `plaintext_link`.
Each frame is one work item for the batcher (decode steps of sessions arriving together run as
one batched forward);
its output goes on down the circuit, or, from the last hop, back on the client's link. A refusal is
sent by name to the client's link of the refusing hop. When a client's link closes, the sessions it
opened are closed (KV freed). Next hops are dialled only after the next-hop policy allowed them
(next_hops.py), on a session that never follows a redirect (`node.dial.refuse_redirects`): a 30x
from a next hop fails the dial, its Location is never contacted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from node.dial import refuse_redirects
from node.server.backend import served_span
from node.server.config import ServerConfig
from node.server.link_pool import ATTACH_TIMEOUT_S, DownLink, LinkLostError, LinkPool, ws_dialer
from node.server.next_hops import PublicResolver, build_policy
from node.server.payments import Account
from node.server.peers import peer_key
from node.server.rendezvous import fronted_caller
from node.server.ring import RingLoop
from node.server.ring_vouch import VouchWriter
from node.server.sessions import PeerQuotaError, Session, short_tag
from node.server.span_payments import SpanPayments
from node.server.state import CONFIG_KEY, STATE_KEY, ComputeError, NodeState, after_forward
from node.server.warm_targets import warm_targets
from protocol.errors import BusyError, PlanetError, ProtocolError, RemoteError, UnavailableError
from protocol.frames.codecs import decode_values, encode_body
from protocol.frames.errors import (
    BadPositionsError,
    FrameError,
    NonFiniteError,
    SessionExpiredError,
    WrongShardError,
)
from protocol.frames.header import FrameHeader, frame_sid, pack_frame, parse_frame
from protocol.frames.sessions import session_tag
from protocol.links import check_link
from protocol.paid_credits import spent_id
from protocol.ring import RingUnavailableError
from protocol.ring_vouch import last_row_body
from protocol.stream import (
    MAX_CONTROL_BYTES,
    MAX_SESSION_FRAMES,
    BadControlError,
    BadFeedError,
    Control,
    CreditNotTakenError,
    DownstreamError,
    NextHop,
    PaymentRequiredError,
    UnknownStreamError,
    error_message,
    parse_control,
    ws_frame_bytes,
)
from protocol.threshold_mint import PeriodAnswerError

log = logging.getLogger(__name__)

# A client sends its opens to every hop at once, so an upstream hop's attach may arrive before
# the client's open of this hop: it waits this long for it (less than ATTACH_TIMEOUT_S, so the
# upstream hop hears the refusal), at most MAX_ATTACH_WAITS of them per link.
ATTACH_WAIT_S = 5.0
MAX_ATTACH_WAITS = 64
# frames held on one link while their session's open or attach is handled: beyond this they are
# handled at once (a stranger's flood is refused as for an unknown session, not buffered)
MAX_HELD_BYTES = 64 * 1024**2
# a credit check the committee did not answer is tried again after these waits before the credit
# goes back `credit_not_taken`: a validator's blip (a loaded machine, a dropped connection) would
# otherwise stop a paid session, its frame refused `payment_required` while the credit was
# already on its way back (seen on the hosts devnet); only while half the frames' wait for a
# `pay` is left (`Payments.wait_s`), so a credit given back is back before its frame is refused
PAY_CHECK_RETRY_S = (0.2, 0.5, 1.0)
_FROM_PEERS = frozenset({"open", "close", "attach", "pay"})


# ------------------------------------------------------------------------------ sessions
@dataclass(eq=False)
class Route:
    """Where a stream session's data comes from and goes to on this node."""

    session: Session
    reply: web.WebSocketResponse  # the client's link: errors, and the last hop's outputs
    reply_sid: int
    feed_tag: str | None = None  # an upstream attaches with the feed whose tag this is
    forwards: bool = False  # not the last hop: outputs go to `down` once the attach is sent
    down: DownLink | None = None
    down_sid: int = 0
    # set once the attach to the next hop is sent (down, down_sid known) or failed (down None)
    down_sent: asyncio.Event = field(default_factory=asyncio.Event)
    # held while a frame goes down, or while the attach goes again on a fresh link
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # frames sent down before the next hop confirmed the attach (sent again if the link dies
    # first: `_attach_down`); None once confirmed
    unconfirmed: list[tuple[FrameHeader, bytes]] | None = field(default_factory=list)
    frames: int = 0  # frames of this session queued or computing here
    account: Account = field(default_factory=Account)  # credits paid, positions used (paid work)
    # the ring (docs/overlay.md): the session's decode loop, on its first hop
    ring: RingLoop | None = None
    # a later hop opened with `back`: outputs (or its next hop's, come back) go up the link
    # that fed it, under the sid it attached with (`up`, set by the attach)
    back: bool = False
    up: tuple[Any, int] | None = None
    # the last hop of a ring opened with `vouch`: the digests of its rows to the client's link
    vouch: VouchWriter | None = None


@dataclass(eq=False)
class _Link:
    """One accepted WebSocket: what it opened (a client) and what it may feed (client or node)."""

    ws: web.WebSocketResponse
    peer: str
    max_inflight: int  # sessions of one caller with frames in flight (max_inflight_per_peer)
    opened: dict[int, Route] = field(default_factory=dict)
    inbound: dict[int, Route] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    attach_waits: int = 0  # attaches on this link waiting for their session's open
    # sids whose open or attach is being handled → their frames that arrived meanwhile, in
    # order. A client does not wait for `opened`, nor an upstream hop for `attached`: frames
    # sent right behind the control message are held here (by the reader, which sees messages
    # in order) and started in that order once it settles (`_release`), never refused as
    # unknown nor overtaken by a later frame of the session.
    # A `pay` for a settling sid is held with them, in order.
    settling: dict[int, list[bytes | Control]] = field(default_factory=dict)
    held_bytes: int = 0  # of the messages held in `settling` (at most MAX_HELD_BYTES)


async def _send(state: NodeState, ws: web.WebSocketResponse, data: bytes | dict[str, Any]) -> None:
    """Send on an accepted link; a link that went away is not this node's failure."""
    try:
        if isinstance(data, bytes):
            await ws.send_bytes(data)
            state.stream_bytes_out += ws_frame_bytes(len(data), masked=False)
        else:
            await ws.send_json(data)
    except (ConnectionError, RuntimeError):
        log.debug("stream link gone while sending")


async def _refuse(
    state: NodeState, ws: web.WebSocketResponse, sid: int, error: PlanetError
) -> None:
    log.info("stream refused sid=%d code=%s message=%s", sid, error.code, error.message)
    await _send(state, ws, error_message(sid, error))


def _close_route(state: NodeState, route: Route) -> None:
    state.store.close(route.session.tag)
    if route.feed_tag is not None:
        state.routes_by_feed.pop(route.feed_tag, None)
    if route.ring is not None:
        route.ring.stop()
    if route.vouch is not None:
        route.vouch.stop()
    if route.down is not None:
        route.down.back.pop(route.down_sid, None)


async def _relay_up(state: NodeState, route: Route, data: bytes) -> None:
    """An output this `back` hop's next hop sent back up: on up the link that fed this hop,
    under the sid it attached with (parsed here: from a peer; a bad one is dropped)."""
    try:
        parse_frame(data, state.backend.hidden_size, state.max_tokens_per_frame)
    except FrameError as error:
        log.info("ring: a bad output came back from the next hop: %s", error.message)
        return
    if route.up is None or route.session.cache is None:
        return
    ws, sid = route.up
    relayed = bytearray(data)
    relayed[2:6] = sid.to_bytes(4, "big")  # the frame header's sid (protocol/frames/header.py)
    await _send(state, ws, bytes(relayed))


def _ring_loop(
    state: NodeState, link: _Link, route: Route, control: Control, head: Any
) -> RingLoop:
    """The first hop's loop for `route`: its frames run as the client's would on `link`."""
    assert control.ring is not None

    async def refuse(error: PlanetError) -> None:
        await _refuse(state, link.ws, control.sid, error)

    return RingLoop(
        control.ring,
        head,
        hidden_size=state.backend.hidden_size,
        max_tokens=state.max_tokens_per_frame,
        executor=state.executor,
        reply_sid=control.sid,
        submit=lambda frame: _data(state, link, frame),
        to_client=lambda data: _send(state, link.ws, data),
        refuse=refuse,
    )


def _spawn(link: _Link, work: Any) -> None:
    task = asyncio.create_task(work)
    link.tasks.add(task)
    task.add_done_callback(link.tasks.discard)


def _hold(link: _Link, control: Control) -> None:
    """The reader saw an open or attach: hold the frames of its sid until it settles."""
    if control.op in ("open", "attach") and control.sid not in link.settling:
        link.settling[control.sid] = []


def _holds(link: _Link, held: list[bytes | Control] | None, size: int, *, pay: bool) -> bool:
    """Whether a message of `size` bytes joins `held` (its sid is settling) within the caps:
    MAX_SESSION_FRAMES frames, and as many `pay`s (a client pays ahead of each frame)."""
    if held is None or link.held_bytes + size > MAX_HELD_BYTES:
        return False
    pays = sum(isinstance(item, Control) for item in held)
    return (pays if pay else len(held) - pays) < MAX_SESSION_FRAMES


def _release(state: NodeState, link: _Link, sid: int) -> None:
    """Start the frames held for `sid`, in their order (synchronously with dropping the hold,
    so every frame the reader sees later starts after them)."""
    for item in link.settling.pop(sid, None) or ():
        if isinstance(item, Control):
            link.held_bytes -= MAX_CONTROL_BYTES
            _spawn(link, _control(state, link, item))
        else:
            link.held_bytes -= len(item)
            _spawn(link, _data(state, link, item))


async def _open(state: NodeState, link: _Link, control: Control) -> None:
    try:
        await _open_settling(state, link, control)
    finally:
        _release(state, link, control.sid)


async def _open_settling(state: NodeState, link: _Link, control: Control) -> None:
    backend = state.backend
    if control.shard != backend.shard_id:
        raise WrongShardError(int(control.shard or 0), backend.shard_id)
    if control.sid in link.opened or control.sid in link.inbound:
        raise BadControlError(f"sid {control.sid} is already in use on this link")
    if control.session is None:  # parse_control sets it for every "open"
        raise BadControlError("open needs a session capability")
    tag = session_tag(control.session)
    if tag in state.store:
        raise BadControlError(f"session {short_tag(tag)} is already open")
    head = None
    if control.ring is not None:  # loaded (once per node) before anything is reserved
        if state.ring_heads is None:
            raise RingUnavailableError("this node runs no ring")
        head = await state.ring_heads.head()
    if control.next is not None:
        await state.next_hops.check(control.next)  # before anything is reserved or dialled
        for url in control.next.addresses:  # every address pinned to the one key
            check_link(url, control.next.key, plaintext_ok=state.links.plaintext_ok)
    for victim in state.store.reserve(0, new_session=True, peer=link.peer):
        log.info("session reclaimed for another caller session=%s", short_tag(victim))
    session = state.store.open(tag, backend.new_cache(), peer=link.peer)
    if state.prefix is not None:
        session.prefix = state.prefix.chain(control.prefix, control.route)
    route = Route(session=session, reply=link.ws, reply_sid=control.sid, back=control.back)
    if control.vouch:  # the parser allows it only on a last hop opened `back`
        route.vouch = VouchWriter(control.sid, lambda data: _send(state, link.ws, data))
    if head is not None:
        route.ring = _ring_loop(state, link, route, control, head)
        state.ring_heads.sessions += 1
    link.opened[control.sid] = route
    if control.feed is None:
        link.inbound[control.sid] = route  # the client feeds this hop itself
    else:
        route.feed_tag = session_tag(control.feed)
        state.routes_by_feed[route.feed_tag] = route
        for waiter in state.feed_waiters.pop(route.feed_tag, []):
            if not waiter.done():
                waiter.set_result(route)
    if control.next is not None:
        route.forwards = True
        _release(state, link, control.sid)  # frames compute now; outputs wait for `down_sent`
        try:
            await _attach_down(state, route, control.next)
        except FrameError:  # unreachable, refused, or not the node key the open names
            route.down = None
            route.down_sent.set()
            link.opened.pop(control.sid, None)
            link.inbound.pop(control.sid, None)
            _close_route(state, route)
            if state.payments is not None:  # no `opened`: the client takes its credits back
                for credit in state.payments.give_back(route.account):
                    await _refuse(
                        state,
                        link.ws,
                        control.sid,
                        CreditNotTakenError(spent_id(credit), "the open failed"),
                    )
            raise
    log.info(
        "stream session opened session=%s peer=%s last=%s sessions=%d",
        short_tag(tag),
        link.peer,
        route.down is None,
        len(state.store),
    )
    route.account.opened = True  # its credits are kept from here on, whatever happens
    route.account.taken.clear()
    await _send(state, link.ws, {"op": "opened", "sid": control.sid})


async def _attach_down(state: NodeState, route: Route, hop: NextHop) -> None:
    """Attach `route` to its next hop over the pooled link (node/server/link_pool.py). Frames
    may go down behind the attach at once; if the link dies before the next hop confirmed it
    (a pooled link gone stale, LinkLostError), the attach and those frames go again, once, on a
    fresh link, so the question does not fail. A next hop behind NAT is dialled at its
    addresses in turn (`LinkPool.reach`). A refusal or a failed dial fails the open."""
    for attempt in (1, 2):
        try:
            async with route.send_lock:
                down = await state.links.reach(hop.addresses, hop.key)
                sid, answer = await down.attach(hop.feed)
                route.down, route.down_sid = down, sid
                if route.ring is not None:  # the last hop's outputs come back on this link
                    down.back[sid] = route.ring.deliver
                elif route.back:
                    down.back[sid] = functools.partial(_relay_up, state, route)
                for header, body in route.unconfirmed or ():
                    await down.send_bytes(pack_frame(replace(header, sid=sid), body))
                route.down_sent.set()
            await down.wait_attached(sid, answer)
        except LinkLostError as error:
            if route.down is not None:  # a ring's taker of what comes back: on the new link
                route.down.back.pop(route.down_sid, None)
            if attempt == 2:
                raise
            state.links.stats.reattached += 1
            log.info("next-hop link lost during an open; attaching again: %s", error.message)
            continue
        route.unconfirmed = None
        return


async def _forward(route: Route, header: FrameHeader, body: bytes) -> None:
    """Send one output frame to the next hop (under the session's sid there). Before the
    attach is confirmed the frame is kept, and a link lost under it is not this frame's
    failure: `_attach_down` sends it again on the fresh link."""
    async with route.send_lock:
        if route.down is None:
            return  # the attach failed: the open refused the session by name
        kept = route.unconfirmed
        if kept is not None:
            kept.append((header, body))
        try:
            await route.down.send_bytes(pack_frame(replace(header, sid=route.down_sid), body))
        except LinkLostError:
            if kept is None:
                raise


async def _attach(state: NodeState, link: _Link, control: Control) -> None:
    """An upstream hop attaches to a session by its feed token; the session's open may still
    be on its way from the client (opens go to every hop at once): wait for it, bounded. The
    upstream hop's frames for it may follow at once: they wait until this settles."""
    try:
        await _attach_settling(state, link, control)
    finally:
        _release(state, link, control.sid)


async def _attach_settling(state: NodeState, link: _Link, control: Control) -> None:
    if control.feed is None:  # parse_control sets it for every "attach"
        raise BadControlError("attach needs a feed token")
    if control.sid in link.inbound:
        raise BadControlError(f"sid {control.sid} is already in use on this link")
    tag = session_tag(control.feed)
    route = state.routes_by_feed.get(tag)
    if route is None:
        if link.attach_waits >= MAX_ATTACH_WAITS:
            raise BadFeedError(
                f"no open session expects this feed token ({MAX_ATTACH_WAITS} attaches already "
                "wait on this link)"
            )
        waiter: asyncio.Future[Route] = asyncio.get_running_loop().create_future()
        waiters = state.feed_waiters.setdefault(tag, [])
        waiters.append(waiter)
        link.attach_waits += 1
        try:
            async with asyncio.timeout(ATTACH_WAIT_S):
                route = await waiter
        except TimeoutError:
            raise BadFeedError("no open session expects this feed token") from None
        finally:
            link.attach_waits -= 1
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters and state.feed_waiters.get(tag) is waiters:
                del state.feed_waiters[tag]
    if route.session.cache is None:
        raise BadFeedError("the session this feed token names is closed")
    link.inbound[control.sid] = route
    if route.back:  # its outputs (or its next hop's) go back up this link
        route.up = (link.ws, control.sid)
    await _send(state, link.ws, {"op": "attached", "sid": control.sid})


async def _control(state: NodeState, link: _Link, parsed: Control | FrameError) -> None:
    """Handle one control message the reader parsed (or refuse the one it could not parse)."""
    if isinstance(parsed, FrameError):
        await _refuse(state, link.ws, 0, parsed)
        return
    control = parsed
    try:
        if control.op == "open":
            await _open(state, link, control)
        elif control.op == "attach":
            await _attach(state, link, control)
        elif control.op == "pay":
            await _pay(state, link, control)
        else:  # close
            route = link.opened.pop(control.sid, None)
            if route is None:
                raise UnknownStreamError(f"sid {control.sid} was not opened on this link")
            link.inbound.pop(control.sid, None)
            _close_route(state, route)
            await _send(state, link.ws, {"op": "closed", "sid": control.sid})
    except (FrameError, BusyError) as error:
        await _refuse(state, link.ws, control.sid, error)
    except PlanetError as error:  # a credit refused, or the committee not reachable to check it
        if control.op != "pay":
            raise
        await _refuse(state, link.ws, control.sid, error)


async def _pay(state: NodeState, link: _Link, control: Control) -> None:
    """A credit for a session this link opened (the client's link to this hop)."""
    if control.credit is None:  # parse_control sets it for every "pay"
        raise BadControlError("pay needs a credit")
    identifier = spent_id(control.credit)
    route = link.opened.get(control.sid)
    if route is None:
        raise CreditNotTakenError(identifier, f"sid {control.sid} is not open on this link")
    if state.payments is None:
        raise CreditNotTakenError(identifier, "this node computes without credits")
    loop = asyncio.get_running_loop()
    # the credit goes back before a frame waiting for it gives up (`Payments.cover`)
    give_up = loop.time() + state.payments.wait_s / 2
    per_shard = isinstance(state.payments, SpanPayments)  # a span: paid per shard
    if control.shard is not None and not per_shard and control.shard != state.backend.shard_id:
        raise CreditNotTakenError(identifier, f"this hop serves shard {state.backend.shard_id}")
    for delay in (*PAY_CHECK_RETRY_S, None):
        try:
            if per_shard:  # a shard it does not serve: refused by name (credit_refused)
                await state.payments.accept(route.account, control.credit, control.shard)
            else:
                await state.payments.accept(route.account, control.credit)
            return
        # its validator does not answer (most often a blip: asked again while there is time),
        # answers an error, or answers a key period it cannot parse
        except (UnavailableError, RemoteError, PeriodAnswerError) as error:
            blip = isinstance(error, UnavailableError)
            if not blip or delay is None or loop.time() + delay >= give_up:
                raise CreditNotTakenError(
                    identifier, f"the node cannot check credits now ({error.code})"
                ) from None
            log.info("credit check: the committee did not answer (%s); again in %gs", error, delay)
            await asyncio.sleep(delay)
        except OSError as error:  # its spool cannot be written (disk full, permissions)
            log.error("credit not kept: the credits dir cannot be written: %s", error)
            raise CreditNotTakenError(identifier, "the node cannot keep credits now") from None


async def _data(state: NodeState, link: _Link, data: bytes) -> None:
    try:
        header, body = parse_frame(data, state.backend.hidden_size, state.max_tokens_per_frame)
    except FrameError as error:
        await _refuse(state, link.ws, 0, error)
        return
    route = link.inbound.get(header.sid)
    if route is None:
        await _refuse(state, link.ws, header.sid, UnknownStreamError(f"sid {header.sid} unknown"))
        return
    peer = route.session.peer
    if route.frames >= MAX_SESSION_FRAMES:
        await _refuse(
            state,
            route.reply,
            route.reply_sid,
            PeerQuotaError(
                f"session has {route.frames} frames queued (per-session limit "
                f"{MAX_SESSION_FRAMES}); wait for answers before sending more"
            ),
        )
        return
    if route.frames == 0:  # the session's first frame in flight counts against its caller
        queued = state.peer_in_flight.get(peer, 0)
        limit = link.max_inflight
        if queued >= limit:
            await _refuse(
                state,
                route.reply,
                route.reply_sid,
                PeerQuotaError(
                    f"this address has {queued} sessions with frames in flight "
                    f"(per-caller limit {limit})"
                ),
            )
            return
        state.peer_in_flight[peer] = queued + 1
    route.frames += 1
    state.in_flight += 1
    try:
        await _compute(state, route, header, body)
    finally:
        state.in_flight -= 1
        route.frames -= 1
        if route.frames == 0:
            left = state.peer_in_flight[peer] - 1
            if left:
                state.peer_in_flight[peer] = left
            else:
                del state.peer_in_flight[peer]


async def _compute(state: NodeState, route: Route, header: FrameHeader, body: memoryview) -> None:
    session = route.session
    store = state.store
    try:
        async with session.lock:
            if session.cache is None:
                raise SessionExpiredError(short_tag(session.tag))
            if header.rewind and header.start < session.length:
                try:
                    state.backend.rewind(session.cache, header.start)
                except ProtocolError as error:
                    raise BadPositionsError(error.message) from None
                store.rewound(session, header.start, state.backend.cache_bytes(session.cache))
                if session.prefix is not None:
                    session.prefix.end()  # positions were dropped: no more cached blocks
            store.check_start(session, header.start)
            if state.payments is not None:
                try:
                    await state.payments.cover(route.account, header.count)
                except PaymentRequiredError:
                    store.close(session.tag)  # a client that stops paying is stopped
                    raise
                if session.cache is None:  # closed while the credits were awaited (a client
                    # that failed over closes its old session): nothing to compute on (its
                    # cache handed to the forward was `None`: a ValueError/ProtocolError there)
                    state.payments.refund(route.account, header.count)
                    raise SessionExpiredError(short_tag(session.tag))
            hidden = decode_values(
                header.dtype, header.codec, (1, header.count, state.backend.hidden_size), body
            )
            reclaimed = store.reserve(
                header.count, new_session=False, peer=session.peer, session=session
            )
            for victim in reclaimed:
                log.info("session reclaimed for another caller session=%s", short_tag(victim))
            try:
                out, _ = await state.batcher.run(
                    session.peer, session.cache, hidden, header.start, session.prefix
                )
            except BusyError:
                store.release(session, header.count)
                if state.payments is not None:
                    state.payments.refund(route.account, header.count)
                raise
            except Exception as error:
                store.close(session.tag)
                log.exception("forward failed session=%s", short_tag(session.tag))
                raise ComputeError(f"forward failed: {type(error).__name__}: {error}") from None
            if session.cache is None:
                raise SessionExpiredError(short_tag(session.tag))
            after_forward(state, session.tag, header.start, hidden, out, session.cache)
            start, count = header.start, header.count
            last = not route.forwards
            if last and header.last_only and count > 1:
                out = out[:, -1:, :]
                start, count = start + count - 1, 1
            try:
                if not np.isfinite(out).all():
                    raise NonFiniteError("the layers' output is not finite")
                encoded = encode_body(out, header.dtype, header.codec)
            except FrameError:
                store.close(session.tag)  # the cache holds positions nobody will get
                raise
            store.advance(session, header.count, state.backend.cache_bytes(session.cache))
            state.forwards += 1
            if last:
                out_header = FrameHeader(
                    route.reply_sid,
                    start,
                    count,
                    header.dtype,
                    header.codec,
                    header.last_only,
                    header.rewind,
                )
                if route.ring is not None:  # a one-hop circuit's ring: its own output
                    await route.ring.deliver(pack_frame(out_header, encoded))
                elif route.back:  # up the link that fed it, not the client's
                    if route.up is None:
                        raise BadControlError("back: no hop attached to this session")
                    if route.vouch is not None:  # the client checks the row the ring relays
                        row = last_row_body(
                            header.dtype, header.codec, count, state.backend.hidden_size, encoded
                        )
                        route.vouch.add(start + count - 1, row)
                    ws, sid = route.up
                    await _send(state, ws, pack_frame(replace(out_header, sid=sid), encoded))
                else:
                    await _send(state, route.reply, pack_frame(out_header, encoded))
            else:
                if not route.down_sent.is_set():
                    try:
                        async with asyncio.timeout(ATTACH_TIMEOUT_S):
                            await route.down_sent.wait()
                    except TimeoutError:
                        raise DownstreamError("the next hop was not dialled in time") from None
                out_header = FrameHeader(
                    0,  # the sid on the link to the next hop: `_forward` sets it
                    start,
                    count,
                    header.dtype,
                    header.codec,
                    header.last_only,
                    header.rewind,
                )
                await _forward(route, out_header, encoded)
    except (FrameError, BusyError, ComputeError) as error:
        await _refuse(state, route.reply, route.reply_sid, error)


async def stream(request: web.Request) -> web.WebSocketResponse:
    config = request.app[CONFIG_KEY]
    state = request.app[STATE_KEY]
    ws = web.WebSocketResponse(max_msg_size=config.max_request_bytes, autoping=True)
    await ws.prepare(request)
    state.streams.add(ws)
    try:
        # a connection a relay fronted counts against its dialer (node/server/rendezvous.py)
        caller = fronted_caller(request) or request.remote
        await serve_link(state, config, ws, peer_key(caller))
    finally:
        state.streams.discard(ws)
    return ws


async def serve_link(state: NodeState, config: ServerConfig, ws: Any, peer: str) -> None:
    """Serve one client link until it ends: `ws` is an accepted WebSocket, or anything that
    iterates WebSocket messages and has `send_bytes` and `send_json` (the overlay's links,
    node/server/overlay.py); `peer` is the caller its sessions count against."""
    link = _Link(ws=ws, peer=peer, max_inflight=config.max_inflight_per_peer)
    try:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.BINARY:
                state.stream_bytes_in += ws_frame_bytes(len(message.data), masked=True)
                held = link.settling.get(frame_sid(message.data))
                size = len(message.data)
                if _holds(link, held, size, pay=False):
                    held.append(message.data)  # its open or attach is being handled
                    link.held_bytes += size
                    continue
                _spawn(link, _data(state, link, message.data))
            elif message.type == aiohttp.WSMsgType.TEXT:
                try:  # parsed here, in message order, so an open holds the frames behind it
                    parsed: Control | FrameError = parse_control(message.data, _FROM_PEERS)
                    _hold(link, parsed)
                except FrameError as error:
                    parsed = error
                if isinstance(parsed, Control) and parsed.op == "pay":
                    held = link.settling.get(parsed.sid)
                    if _holds(link, held, MAX_CONTROL_BYTES, pay=True):  # paid behind its open
                        held.append(parsed)  # type: ignore[union-attr]
                        link.held_bytes += MAX_CONTROL_BYTES
                        continue
                _spawn(link, _control(state, link, parsed))
            else:
                break
    finally:
        for route in link.opened.values():
            _close_route(state, route)
        if link.opened:
            log.info("stream link closed sessions_closed=%d", len(link.opened))


async def close_streams(app: web.Application) -> None:
    """on_shutdown: close every accepted stream (a WebSocket handler otherwise keeps the
    server's graceful shutdown waiting for its peer)."""
    for ws in list(app[STATE_KEY].streams):
        await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"node shutting down")


def _next_hop_policy(config: ServerConfig, state: NodeState, http: aiohttp.ClientSession) -> Any:
    source = None
    if config.next_hops.mode == "committee" and config.committee_rpc:
        from node.chain.committee_rpc import CommitteeRpc

        source = CommitteeRpc(config.committee_rpc, session=http)
    policy = build_policy(
        config.next_hops,
        served_span(state.backend).last,  # the hop after a span follows its last shard
        source=source,
        model_hash=state.backend.model_hash,
    )
    if config.next_hops.mode == "any":
        log.warning(
            "next hops: ANY URL a client names is dialled (--next-hops any, development only): "
            "strangers can make this node connect to any host:port it reaches"
        )
    else:
        log.info("next hops: %s", config.next_hops.describe())
    return policy


def _count_forwarded(state: NodeState, sent: int) -> None:
    state.stream_bytes_out += sent
    state.stream_bytes_forwarded += sent


async def close_links(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the node's client session for downstream links, and the next-hop policy
    asked before any of them is dialled."""
    state = app[STATE_KEY]
    config = app[CONFIG_KEY]
    connector = None
    if config.next_hops.public_only:  # registered endpoints are strangers' choice
        connector = aiohttp.TCPConnector(resolver=PublicResolver())
    # next hops are strangers' choice: a redirect would dial its Location behind the policy
    http = aiohttp.ClientSession(
        skip_auto_headers=("User-Agent",), connector=connector, middlewares=(refuse_redirects,)
    )
    state.next_hops = _next_hop_policy(config, state, http)
    state.links = LinkPool(
        ws_dialer(http, config.max_request_bytes, plaintext_ok=config.plaintext_links),
        lambda sent: _count_forwarded(state, sent),
        targets=warm_targets(
            state.next_hops,
            http,
            state.backend.model_hash,
            plaintext_ok=config.plaintext_links,
        ),
        idle_s=config.idle_timeout_s,
        plaintext_ok=config.plaintext_links,
    )
    state.links.start()
    yield
    await state.links.close()
    await http.close()
