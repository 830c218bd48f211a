"""Circuit links: node-to-node forwarding over one persistent WebSocket per link.

A circuit's data path runs client → A → B → C → client: a token costs one transfer per hop
(K + 1 for K nodes) and no per-request HTTP overhead. Every link is a WebSocket on
`GET /v1/stream`; a session on a link is named by a small integer `sid` the sending side chose.
Two kinds of message:

**Frames** (binary): activations, a 17-byte header then the body (protocol/frames/header.py);
the body's size is checked against count × hidden size before anything is decoded.

**Control** (text, one JSON object, at most 16 KiB, nesting ≤ 4):

    client → node   {"op": "open", "sid", "session": capability, "shard",
                     "feed": token | null, "next": {"url", "shard", "feed": token
                     [, "key": node key[, "alternates": [url, ...]]]} | null
                     [, "prefix": salt][, "route": keys][, "ring": spec][, "back": true]
                     [, "vouch": true]}
    client → node   {"op": "close", "sid"}
    client → node   {"op": "pay", "sid", "credit": 176 hex chars (a credit: period ‖ nonce ‖
                    σ)[, "assignment": 128 hex chars (its holder's assignment of it to this
                    node on its model and shard, protocol/committee/credit_holder.py)]
                    [, "shard": the shard of a span hop it pays (protocol/spans.py; absent:
                    the hop's first shard)]}
    node → node     {"op": "attach", "sid", "feed": token}
    node → peer     {"op": "opened" | "attached" | "closed", "sid"}
    node → client   {"op": "error", "sid", "code", "message"}

Capabilities stay per hop. The client opens hop i's session on its own link to hop i with
hop i's capability (never seen by any other node). `feed` is a second per-hop token (derived
from the client's secret like the capability): hop i learns the token its upstream must present
(`feed`) and the token it presents to hop i + 1 (`next.feed`), never hop i + 1's capability. A
feed token only lets its holder append positions whose output flows on down the circuit; reading
an output (the last hop answers on the client's own link), closing and opening need the
capability. `next: null` marks the last hop: it sends its output back on the client's link.
`next.key` is the next hop's node key (64 hex, protocol/links.py): required for an https://
next hop, whose TLS handshake must prove it (the node pins it when it dials), optional for a
plaintext one. `next.alternates` (optional, 1..MAX_NEXT_ALTERNATES https:// URLs, only with
`next.key`) names the next hop's addresses at its other rendezvous relays (a node behind NAT,
docs/overlay.md): the node dials `next.url`, then each alternate in order, every one pinned to
`next.key` and each one allowed by the node's next-hop policy before anything is dialled. An
open without `alternates` is the single-address open of before; a node of before refuses an
open that carries them (`bad_control`).
Errors about a session always go to the client's link of the hop that refused, by name.
A node that charges for its work (`credit_positions` > 0, node/server/payments.py) computes a
session's positions only while the credits paid for it cover them: the client pays each hop on
its own link, one bearer credit (docs/credits.md) per `pay`, ahead of the positions it sends; a
frame that would go past what is paid waits a few seconds for the `pay` (a later hop's `pay`
and its upstream's frame race on two links), then the session is refused `payment_required`
and closed. A client is at most one credit ahead of the work; a node never works unpaid. A `pay`
the node does not keep through no fault of the credit (its session is not open on that link, or
its open failed after the `pay` came) is refused `credit_not_taken` naming the credit's spent
id, and the client puts that credit back; a node keeps the credits of a session it answered
`opened` for. A `pay` whose credit's holder assignment is not for the node (its key, model and
shard) is refused `credit_not_assigned` before the node takes it, naming the spent id the same
way (`not_assigned_message`): a holder-bound credit goes back to the client's wallet too.
An open may carry `prefix`, a salt of the client's own (a token like `feed`): the node's prefix
cache then shares that session's prompt blocks only with sessions opened with the same salt
(node/server/prefix_cache.py, docs/privacy.md); without it, with every session of the node. It
may carry `route`, its prompt's prefix-route keys for this node (≤ 64 × 16 hex,
protocol/prefix_routes.py): the node advertises the keys of the blocks it then holds.
An open may carry `ring` (only the first hop's: `feed` null), the ring spec of
protocol/ring.py: that node then runs the session's decode loop itself (docs/overlay.md, *The
ring*), or, `back: true` (only a later hop's), ask that hop to send what it outputs (the last
hop) or what its next hop sends back (a middle hop) back up the link that fed it, under the
sid that link attached with, instead of on the client's link. A node of before refuses both
(`bad_control`): clients send them only to nodes whose /info lists `ring` / `ring_back`
(protocol/open_features.py). `vouch: true` (only with `back`, on the hop with `next: null`):
that last hop also sends the client, on the client's own link, the digest of every output row
it sends back (ring vouches, protocol/ring_vouch.py); clients send it only to nodes whose /info
lists `ring_vouch`.
Frames may follow an open or an attach on the same link at once (the receiving hop holds them
until that control message is handled), so no round trip comes before a session's first pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol.canonical import JsonTooDeepError, loads_bounded
from protocol.committee.credit_holder import parse_assignment
from protocol.committee.grammar import TxDecodeError
from protocol.committee.registry import MAX_RENDEZVOUS
from protocol.frames.errors import FrameError, TooLargeError
from protocol.frames.sessions import check_session_id
from protocol.links import MissingNodeKeyError, check_node_key, is_encrypted
from protocol.paid_credits import (
    AssignedCredit,
    PaidCredit,
    credit_json,
    parse_paid_credit,
    with_assignment,
)
from protocol.prefix_routes import BadRouteKeysError, check_route_keys
from protocol.ring import RingSpec, parse_ring_spec
from protocol.urls import BadUrlError, canonical_url

MAX_CONTROL_BYTES: Final = 16384  # a `pay` carries a credit: 176 hex chars
MAX_SID: Final = 2**32 - 1
MAX_URL_CHARS: Final = 200
# a next hop's addresses besides `next.url`: at most one per other relay a node may name as
# its rendezvous point (register_node `rendezvous`)
MAX_NEXT_ALTERNATES: Final = MAX_RENDEZVOUS
# frames of ONE session a node holds queued or computing; the session's first one counts
# against its caller's in-flight limit, the rest only against this (a pipelined prefill sends
# several chunks of one session back to back); one more is refused as busy
MAX_SESSION_FRAMES: Final = 16
OPS_FROM_CLIENT: Final = frozenset({"open", "close", "attach", "pay"})
OPS_TO_CLIENT: Final = frozenset({"opened", "attached", "closed", "error"})


class BadControlError(FrameError):
    """A control message is malformed (not JSON, unknown op, missing or bad fields)."""

    code = "bad_control"


class BadRouteError(FrameError):
    """The `next` hop of an open is not a plain http(s)://host[:port] URL (protocol/urls.py)."""

    code = "bad_route"


class NextHopNotAllowedError(FrameError):
    """The `next` hop of an open is not one this node forwards to (its next-hop policy:
    node/server/next_hops.py); refused before anything is dialled."""

    code = "next_hop_not_allowed"
    http_status = 403


class UnknownStreamError(FrameError):
    """Data or a close names a sid that is not open or attached on this link."""

    code = "unknown_stream"
    http_status = 404


class BadFeedError(FrameError):
    """An attach presented a feed token no open session expects."""

    code = "bad_feed"
    http_status = 403


class PaymentRequiredError(FrameError):
    """The node computes only positions paid for with credits, and this session's credits do not
    cover the frame (none came in time); the session is closed."""

    code = "payment_required"
    http_status = 402


class CreditNotTakenError(FrameError):
    """A `pay` the node did not keep, through no fault of the credit: its session was not open
    on this link (never, or its open failed), or the node computes without credits. The message
    names the credit by its spent id (`protocol.credits.spent_id`), so the client puts exactly
    that credit back into its wallet; a session's other messages are not affected."""

    code = "credit_not_taken"

    def __init__(self, identifier: str, reason: str) -> None:
        super().__init__(f"credit {identifier} not taken: {reason}")
        self.identifier = identifier


_NOT_TAKEN = re.compile(r"credit ([0-9a-f]{64}) not taken: ")


def not_taken_id(message: str) -> str | None:
    """The spent id a `credit_not_taken` refusal names, or None."""
    match = _NOT_TAKEN.match(message)
    return match.group(1) if match else None


CREDIT_NOT_ASSIGNED: Final = "credit_not_assigned"  # node/server/payments.py refuses so
_NOT_ASSIGNED = re.compile(r"credit ([0-9a-f]{64}) not assigned to this node: ")


def not_assigned_message(identifier: str, reason: str) -> str:
    """A `credit_not_assigned` refusal's message: it names the credit by its spent id, so the
    client knows which credit the node refused before taking it (`not_assigned_id`)."""
    return f"credit {identifier} not assigned to this node: {reason}"


def not_assigned_id(message: str) -> str | None:
    """The spent id a `credit_not_assigned` refusal names, or None (a node of before named
    none)."""
    match = _NOT_ASSIGNED.match(message)
    return match.group(1) if match else None


class DownstreamError(FrameError):
    """The next hop of the circuit could not be reached or refused the attach."""

    code = "downstream_unavailable"
    http_status = 502


# ------------------------------------------------------------------------------------ control
@dataclass(frozen=True, slots=True)
class NextHop:
    url: str
    shard: int
    feed: str
    key: str | None = None  # the next hop's node key (64 hex); required for an https:// url
    # behind NAT: its addresses at its other relays (https://, pinned to `key`), dialled in
    # order when `url` is not reached
    alternates: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        """`url`, then the alternates: every address the node may dial for this hop."""
        return (self.url, *self.alternates)


@dataclass(frozen=True, slots=True)
class Control:
    """A parsed control message; fields not used by its op are None."""

    op: str
    sid: int
    session: str | None = None
    shard: int | None = None
    feed: str | None = None
    next: NextHop | None = None
    code: str | None = None
    message: str | None = None
    credit: PaidCredit | None = None
    prefix: str | None = None  # open: the client's prefix-cache salt (isolation), if it asks
    route: tuple[str, ...] = ()  # open: its prompt's prefix-route keys for this node
    ring: RingSpec | None = None  # open (first hop): run the session's decode loop here
    back: bool = False  # open (later hop): outputs go back up the link that fed this hop
    vouch: bool = False  # open (last hop, back): digests of its rows to the client's link


_FIELDS: Final[dict[str, frozenset[str]]] = {
    "open": frozenset({"op", "sid", "session", "shard", "feed", "next"}),
    # an open may also carry "prefix" (a salt of the client's own, docs/privacy.md) and
    # "route" (its prompt's prefix-route keys for this node, protocol/prefix_routes.py)
    "close": frozenset({"op", "sid"}),
    "attach": frozenset({"op", "sid", "feed"}),
    "pay": frozenset({"op", "sid", "credit"}),
    "opened": frozenset({"op", "sid"}),
    "attached": frozenset({"op", "sid"}),
    "closed": frozenset({"op", "sid"}),
    "error": frozenset({"op", "sid", "code", "message"}),
}
_NEXT_FIELDS: Final = (
    frozenset({"url", "shard", "feed"}),
    frozenset({"url", "shard", "feed", "key"}),
    frozenset({"url", "shard", "feed", "key", "alternates"}),
)
_OPEN_OPTIONAL: Final = frozenset({"prefix", "route", "ring", "back", "vouch"})
_OPTIONAL: Final[dict[str, frozenset[str]]] = {
    "open": _OPEN_OPTIONAL,
    # a holder-bound credit's (protocol/committee/credit_holder.py); the shard of a span hop
    # it pays (docs/compute.md, *Span hops*)
    "pay": frozenset({"assignment", "shard"}),
}
_CODE_RE = re.compile(r"[a-z0-9_]{1,64}")


def _int_field(raw: dict[str, Any], name: str, maximum: int) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise BadControlError(f"{name} must be an integer in 0..{maximum}")
    return value


def _token(value: Any, name: str) -> str:
    try:
        return check_session_id(value)
    except FrameError:
        raise BadControlError(f"{name} must be 22-64 characters of [A-Za-z0-9_-]") from None


def _node_key(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return check_node_key(value)
    except ValueError:
        raise BadControlError("next.key must be null or 64 lower-case hex characters") from None


def _route(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    try:
        return check_route_keys(value)
    except BadRouteKeysError as error:
        raise BadControlError(error.message) from None


def check_next_url(value: Any) -> str:
    """A next hop's base URL in canonical form (protocol/urls.py: scheme, lower-case host,
    explicit port); no path, user info, query or escapes."""
    if isinstance(value, str) and len(value) > MAX_URL_CHARS:
        raise BadRouteError(f"next.url is longer than {MAX_URL_CHARS} characters")
    try:
        return canonical_url(value)
    except BadUrlError as error:
        raise BadRouteError(f"next.url: {error.message}") from None


def check_next_alternates(value: Any, url: str) -> tuple[str, ...]:
    """`next.alternates`: 1..MAX_NEXT_ALTERNATES distinct https:// URLs, each checked as
    `next.url` is (`check_next_url`) and none equal to `url` (canonical), or BadRouteError
    naming the entry. https:// only: every address of the hop is pinned to `next.key`."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_NEXT_ALTERNATES:
        raise BadRouteError(
            f"next.alternates must be a list of 1..{MAX_NEXT_ALTERNATES} URLs (or absent)"
        )
    out: list[str] = []
    for index, item in enumerate(value):
        name = f"next.alternates[{index}]"
        try:
            alternate = check_next_url(item)
        except BadRouteError as error:
            raise BadRouteError(error.message.replace("next.url", name, 1)) from None
        if not is_encrypted(alternate):
            raise BadRouteError(f"{name} must be https:// (pinned to next.key): {alternate}")
        if alternate == url or alternate in out:
            raise BadRouteError(f"{name} repeats an address of the next hop: {alternate}")
        out.append(alternate)
    return tuple(out)


def parse_control(text: str | bytes, allowed: frozenset[str]) -> Control:
    """Parse one control message whose op is in `allowed`, or raise a named FrameError."""
    if len(text) > MAX_CONTROL_BYTES:
        raise TooLargeError(f"control message over {MAX_CONTROL_BYTES} bytes")
    try:
        raw = loads_bounded(text, max_depth=4, parse_constant=_no_constant)
    except (ValueError, JsonTooDeepError, RecursionError):
        raise BadControlError("control message is not a JSON object of depth <= 4") from None
    if not isinstance(raw, dict):
        raise BadControlError("control message must be a JSON object")
    op = raw.get("op")
    if not isinstance(op, str) or op not in allowed:
        raise BadControlError(f"op must be one of {sorted(allowed)}")
    optional = _OPTIONAL.get(op, frozenset())
    if not _FIELDS[op] <= set(raw) <= _FIELDS[op] | optional:
        raise BadControlError(f"{op} needs exactly the fields {sorted(_FIELDS[op])}")
    sid = _int_field(raw, "sid", MAX_SID)
    if op == "open":
        feed = raw["feed"]
        nxt = raw["next"]
        next_hop = None
        if nxt is not None:
            if not isinstance(nxt, dict) or set(nxt) not in _NEXT_FIELDS:
                raise BadControlError(
                    "next must be null or {url, shard, feed[, key[, alternates]]}"
                )
            url = check_next_url(nxt["url"])
            next_hop = NextHop(
                url=url,
                shard=_int_field(nxt, "shard", 2**16),
                feed=_token(nxt["feed"], "next.feed"),
                key=_node_key(nxt.get("key")),
                alternates=check_next_alternates(nxt["alternates"], url)
                if "alternates" in nxt
                else (),
            )
            unpinned = [a for a in next_hop.addresses if is_encrypted(a)]
            if next_hop.key is None and unpinned:
                raise MissingNodeKeyError(unpinned[0])
        ring = None if raw.get("ring") is None else parse_ring_spec(raw["ring"])
        back = raw.get("back", False)
        if back is not True and back is not False:
            raise BadControlError("back must be true (or absent)")
        if ring is not None and feed is not None:
            raise BadControlError("only the first hop (feed null) runs a ring")
        if back and feed is None:
            raise BadControlError("back needs a hop that is fed by another (feed set)")
        vouch = raw.get("vouch", False)
        if vouch is not True and vouch is not False:
            raise BadControlError("vouch must be true (or absent)")
        if vouch and (not back or next_hop is not None):
            raise BadControlError("vouch needs the last hop (next null) of a ring (back true)")
        return Control(
            op=op,
            sid=sid,
            session=_token(raw["session"], "session"),
            shard=_int_field(raw, "shard", 2**16),
            feed=None if feed is None else _token(feed, "feed"),
            next=next_hop,
            prefix=None if raw.get("prefix") is None else _token(raw["prefix"], "prefix"),
            route=_route(raw.get("route")),
            ring=ring,
            back=back,
            vouch=vouch,
        )
    if op == "attach":
        return Control(op=op, sid=sid, feed=_token(raw["feed"], "feed"))
    if op == "pay":
        try:
            credit = parse_paid_credit(raw["credit"], "credit")
            if "assignment" in raw:
                credit = with_assignment(credit, parse_assignment(raw["assignment"], "assignment"))
        except TxDecodeError as error:
            raise BadControlError(error.reason) from None
        shard = None if "shard" not in raw else _int_field(raw, "shard", 2**16 - 1)
        return Control(op=op, sid=sid, credit=credit, shard=shard)
    if op == "error":
        code, message = raw["code"], raw["message"]
        if not isinstance(code, str) or not _CODE_RE.fullmatch(code):
            code = "http_error"
        if not isinstance(message, str):
            message = ""
        message = "".join(c if c.isprintable() else "?" for c in message[:300])
        return Control(op=op, sid=sid, code=code, message=message)
    return Control(op=op, sid=sid)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def open_message(
    sid: int,
    session: str,
    shard: int,
    feed: str | None,
    next_hop: NextHop | None,
    prefix: str | None = None,
    route: Sequence[str] = (),
    ring: RingSpec | None = None,
    back: bool = False,
    vouch: bool = False,
) -> dict[str, Any]:
    nxt: dict[str, Any] | None = None
    if next_hop is not None:
        nxt = {"url": next_hop.url, "shard": next_hop.shard, "feed": next_hop.feed}
        if next_hop.key is not None:
            nxt["key"] = next_hop.key
        if next_hop.alternates:
            nxt["alternates"] = list(next_hop.alternates)
    message = {
        "op": "open",
        "sid": sid,
        "session": session,
        "shard": shard,
        "feed": feed,
        "next": nxt,
    }
    if prefix is not None:
        message["prefix"] = prefix
    if route:
        message["route"] = list(route)
    if ring is not None:
        message["ring"] = ring.to_json()
    if back:
        message["back"] = True
    if vouch:
        message["vouch"] = True
    return message


def pay_message(sid: int, credit: PaidCredit, shard: int | None = None) -> dict[str, Any]:
    """A `pay` of `credit`, with its assignment when it is an `AssignedCredit`, and the shard
    it pays when the hop is a span (`shard`; None: the hop's one shard)."""
    message: dict[str, Any] = {"op": "pay", "sid": sid, "credit": credit_json(credit)}
    if isinstance(credit, AssignedCredit):
        message["assignment"] = credit.assignment.hex()
    if shard is not None:
        message["shard"] = shard
    return message


def error_message(sid: int, error: Any) -> dict[str, Any]:
    return {"op": "error", "sid": sid, "code": error.code, "message": error.message[:300]}


def ws_frame_bytes(payload: int, *, masked: bool) -> int:
    """Bytes a WebSocket frame of `payload` bytes takes on the wire (RFC 6455 header)."""
    header = 2 if payload < 126 else 4 if payload < 65536 else 10
    return header + (4 if masked else 0) + payload


__all__ = [
    "CREDIT_NOT_ASSIGNED",
    "MAX_NEXT_ALTERNATES",
    "MAX_SESSION_FRAMES",
    "BadControlError",
    "BadFeedError",
    "BadRouteError",
    "Control",
    "CreditNotTakenError",
    "DownstreamError",
    "NextHop",
    "NextHopNotAllowedError",
    "PaymentRequiredError",
    "UnknownStreamError",
    "check_next_alternates",
    "error_message",
    "not_assigned_id",
    "not_assigned_message",
    "not_taken_id",
    "open_message",
    "parse_control",
    "pay_message",
    "ws_frame_bytes",
]
