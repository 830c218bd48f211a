"""Circuits from the committee chain's routable nodes.

The committee answers `/nodes?model=<model_hash>&role=compute`; only entries with `routable`
true (SERVING, agreed stake >= minimum, reputation >= 0.4, computed by the app) are used, grouped
by shard. A circuit takes one node per shard, chosen by expected cost (node/client/costs.py:
half the round trip of its /info, its compute per forward, its queue and sessions; a node
whose queue or session table is full, or whose gateway slots are all taken, counts as
overloaded) and at random (system randomness) among the near-cheapest, so equal replicas
share the load and no node holds a fixed position for a user, while a node much slower than
its replicas is left out. Stats older than 2 s are refreshed in the background (one /info per
node at a time), never on a question's path. The gateway keeps the circuit for one session
(one question: the nodes hold its KV cache); when a hop fails mid-answer `replace` swaps in the
next choice for that shard (node/gateway/engine.py replays the answer's history there).

**Prefix-aware** (issue 44, route "cost" only): `circuit(prompt)` prefers, among each shard's
near-cheapest, the node whose /info `prefix_routes` holds the most leading blocks of the
question's prompt behind the hops chosen before it (node/client/costs.py `choose(prefer=)`,
protocol/prefix_routes.py), so questions sharing a system prompt go where its KV is cached while
the load allows. The personal client's private and uniform routes never look at prefixes.

Entries are untrusted: an endpoint must be a plain `http(s)://host:port` URL, a node key 64 hex;
anything else is skipped. A registered endpoint is a stranger's choice, so the router applies
the nodes' public-address policy (node/server/next_hops.py) before it probes or dials one:
with `public_only` (the default) an IP-literal endpoint that is not globally routable
(loopback, private, link-local, ...) is skipped, and a host name is dialled only through a
resolver that hands out global addresses (`PublicResolver` on the gateway's connector, run.py);
`--private-endpoints` lifts the rule for a devnet or LAN. Probes never follow a redirect (the
gateway's session refuses them too, `node.dial.refuse_redirects`). Every link to a node is
pinned to its registered key (https://, TLS whose certificate key must be the node key:
node/links.py); a plaintext endpoint is dialled only on loopback (protocol/links.py), others
are cooled down.

**`route="private"`** (a personal client's default, node/gateway/guards.py): no choice by cost.
Each shard's node is the client's guard there — drawn uniformly at random from the shard's
routable nodes, kept for every question until it fails, stops being routable or rotates, then
drawn again uniformly — and no hop is ever moved for being slower than its replicas
(`outpriced` is empty). An adversary then gets a hop with probability f (its fraction of the
shard's nodes) per draw, whatever its speed or claims. **`route="uniform"`** draws the same way
for every question afresh and keeps nothing: a verifier's own client, whose challenges must
reach every routable node, unpredictably.

Before a node is used the first time (and again after `VERIFY_TTL_S`) its `/info` must name
this model's hash, the shard and the shard's layers from the manifest.
Every /info and health read goes through the router's `info` reader (node/gateway/node_info.py):
directly (pinned), or for a personal client with `--relays` as INFO link messages over relay
paths, so no request reaches a node from the user's address (issue 43); over the overlay the
background refresh runs at most every 30 s per node instead of 2 s.
Nodes that failed a question sit out `cooldown_s` locally (`COOLDOWN_S`, 30 s, unless the
operator sets `--node-cooldown-s`; they stay on chain until the committee marks them DOWN).
A node that only its previous hop named as the fault (`downstream_unavailable`,
`next_hop_not_allowed`, `node_key_mismatch`: node/client/circuit.py `NEXT_HOP_FAULTS`) sits out
`accused_cooldown_s` (5 s) instead: a hop's word about another node, which a hostile hop could
give about an honest one, costs that node a few seconds and a fresh /info check, never 30 s.
**A cooldown never empties a shard** (issue 44): when no node of a shard that is not cooling
answers (or every one is cooling), the router tries the cooling ones again — each /info read
first, routable before graced, the one that failed longest ago first — and answers 503
`no_routable_node` only when none of them verifies either. (A
shard whose only node failed once, a passing fault, would otherwise refuse every question for
the whole cooldown.)

**A DOWN mark is a hint; a live answer wins** (issue 44). A node the committee lists with
`grace` (DOWN lately, otherwise routable: it missed heartbeats, abci_app/liveness.py) is a
fallback: a shard whose routable nodes are all gone or failing is routed through a graced node
that answers its `/info` now, rather than refused with 503 `no_routable_node`. It is never
preferred to a routable node, and one that does not answer cools down like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from node.chain.committee_pages import path_query, read_nodes
from node.client.chain_prices import chain_price, price_trusted
from node.client.costs import CostBook, prefix_preference
from node.client.types import payee
from node.dial import first_reachable
from node.gateway.config import NODE_COOLDOWN_S
from node.gateway.errors import NoCircuit
from node.gateway.guards import ROUTES, Guards
from node.gateway.node_info import DirectInfo, InfoFetcher, InfoUnavailable
from node.links import NodeKeyPin, link_ssl
from node.server.next_hops import is_ip_literal, is_public_address
from protocol.committee.credit_holder import node_party
from protocol.errors import PlanetError
from protocol.spans import NonContiguousSpanError, ShardSpan, span_of

log = logging.getLogger(__name__)

VERIFY_TTL_S = 60.0
VERIFY_TIMEOUT_S = 3.0
COOLDOWN_S = NODE_COOLDOWN_S  # a failed node sits out this long by default
# a node only another hop named as the fault (node/client/circuit.py NEXT_HOP_FAULTS) sits out
# this long (at most `cooldown_s`): that hop's word, not a failure the gateway saw
ACCUSED_COOLDOWN_S = 5.0
MAX_TRIES_PER_SHARD = 4  # unverified candidates probed per shard for one circuit
_KEY = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class RoutableNode:
    key: str  # ed25519 node key, 64 hex
    endpoint: str  # base URL
    shard: int
    capacity: int = field(default=0, compare=False)  # registered max sessions (0: unknown)
    grace: bool = field(default=False, compare=False)  # DOWN on chain, a fallback (see above)
    # positions one credit buys there, as registered on the committee chain for this epoch
    # (abci_app/prices.py; 0: free; None: no price registered, so never paid — routed only
    # while its /info says free): what this gateway pays, never its /info
    price: int | None = field(default=None, compare=False)
    # behind NAT: its addresses at its other relays (register_node `rendezvous`), dialled in
    # turn when `endpoint` (the first relay's port) is not reached (`addresses`)
    alternates: tuple[str, ...] = field(default=(), compare=False)
    # the last shard of a span it serves as one hop (register_node `shards` [shard … last],
    # protocol/spans.py); None: `shard` alone
    last: int | None = None
    # a span's registered price on each of its shards, in order (it is paid per shard:
    # `payees`); () for one shard (`price`)
    shard_prices: tuple[int | None, ...] = field(default=(), compare=False)

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.endpoint, *self.alternates)

    def payees(self) -> list[tuple[int, str, int | None]]:
        """(shard, payee, registered price) of each shard it is paid for: its one shard at its
        endpoint, or each shard of its span (node/client/types.py `payee`)."""
        if self.last is None:
            return [(self.shard, self.endpoint, self.price)]
        return [
            (shard, payee(self.endpoint, shard), price)
            for shard, price in zip(self.span, self.shard_prices, strict=True)
        ]

    @property
    def span(self) -> ShardSpan:
        return ShardSpan(self.shard, self.shard if self.last is None else self.last)


@dataclass(frozen=True, slots=True)
class Circuit:
    # one per hop, in shard order (a span hop covers several shards); for an answer that
    # failed over: the final circuit's nodes, then every node that served a failed circuit
    # before (engine.py `served_circuit`)
    nodes: tuple[RoutableNode, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(n.key for n in self.nodes)


class NodeSource(Protocol):
    async def compute_nodes(self) -> list[dict[str, Any]]: ...


class CommitteeNodes:
    """`/nodes?model=...&role=compute` from one validator's RPC, every page (`read_nodes`: a
    malformed page or a list past `NODE_PAGES` pages fails the refresh by name)."""

    def __init__(self, rpc: Any, model_hash: str) -> None:
        self.rpc = rpc
        self.model_hash = model_hash

    async def compute_nodes(self) -> list[dict[str, Any]]:
        query = path_query(self.rpc.abci_query)
        return await read_nodes(query, model=self.model_hash, role="compute")


def clean_endpoint(value: Any) -> str | None:
    """`http(s)://host:port` with nothing else, or None."""
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def dialable(endpoint: str, public_only: bool) -> bool:
    """Whether the address policy lets the gateway dial `endpoint` (a `clean_endpoint`): with
    `public_only` an IP literal must be globally routable (names are checked at resolution)."""
    if not public_only:
        return True
    host = urlsplit(endpoint).hostname or ""
    return not is_ip_literal(host) or is_public_address(host)


def alternates_of(entry: dict[str, Any], endpoint: str, public_only: bool) -> tuple[str, ...]:
    """A node's addresses at the relays its registration names (`rendezvous`: up to 3 of
    `{relay, endpoint}`) other than `endpoint`, in their order: clean, dialable, https:// only
    (a fronted node serves TLS pinned to its key, whichever relay carries it); none for an
    http:// endpoint."""
    entries = entry.get("rendezvous")
    if not endpoint.startswith("https://") or not isinstance(entries, list):
        return ()
    out: list[str] = []
    for item in entries[:3]:
        url = clean_endpoint(item.get("endpoint")) if isinstance(item, dict) else None
        if url is None or not url.startswith("https://") or url == endpoint or url in out:
            continue
        if dialable(url, public_only):
            out.append(url)
    return tuple(out)


def routable_by_shard(
    entries: Iterable[Any], shard_count: int, *, public_only: bool = True
) -> dict[int, list[RoutableNode]]:
    """Routable (or graced: `RoutableNode.grace`), well-formed, dialable entries grouped by
    the first shard they serve (shards 0..shard_count-1): one shard, or a contiguous span
    served as one hop (`RoutableNode.last`); a `shards` list that is not contiguous
    (`NonContiguousSpanError`) or runs past the model is skipped."""
    out: dict[int, list[RoutableNode]] = {s: [] for s in range(shard_count)}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        grace = entry.get("routable") is not True and entry.get("grace") is True
        if entry.get("routable") is not True and not grace:
            continue
        key, endpoint = entry.get("key"), clean_endpoint(entry.get("endpoint"))
        if not isinstance(key, str) or not _KEY.match(key) or endpoint is None:
            continue
        if not dialable(endpoint, public_only):
            log.debug("skipping a non-public endpoint endpoint=%s", endpoint)
            continue
        try:
            span = span_of(entry.get("shards"))
        except NonContiguousSpanError as error:
            log.debug("skipping node=%s: %s", key[:16], error.message)
            continue
        if span.last >= shard_count:
            continue
        capacity = entry.get("capacity")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            capacity = 0
        prices = tuple(chain_price(entry, shard) for shard in span)  # a span: paid per shard
        out[span.first].append(
            RoutableNode(
                key,
                endpoint,
                span.first,
                capacity,
                grace=grace,
                price=prices[0],
                alternates=alternates_of(entry, endpoint, public_only),
                last=None if span.size == 1 else span.last,
                shard_prices=() if span.size == 1 else prices,
            )
        )
    return out


class Router:
    def __init__(
        self,
        source: NodeSource,
        *,
        model_hash: str,
        shard_layers: Sequence[tuple[int, int]],
        http: aiohttp.ClientSession,
        refresh_s: float = 2.0,
        max_sessions_per_node: int = 16,
        slot_wait_s: float = 60.0,
        public_only: bool = True,
        accept_price: Callable[[int], bool] | None = None,
        route: str = "cost",
        guards: Guards | None = None,
        cooldown_s: float = COOLDOWN_S,
        accused_cooldown_s: float = ACCUSED_COOLDOWN_S,
        prices: dict[str, int] | None = None,
        parties: dict[str, bytes] | None = None,
        info: InfoFetcher | None = None,
    ) -> None:
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, not {route!r}")
        self.source = source
        self.route = route
        # route="private": the node kept per shard (in memory unless the caller persists it)
        self.guards = guards or Guards(None, model_hash)
        # which nodes this gateway can pay, by the positions a credit buys there (its price
        # registered on the committee chain; 0: free): by default free ones only — without a
        # credit payer, a node charging credits would refuse its every question (402); the
        # hosted gateway and the personal client pass `accepts_price(floor)`
        # (node/client/paying.py)
        self.accept_price = accept_price or (lambda price: price == 0)
        self.public_only = public_only  # dial only globally routable endpoints
        self.model_hash = model_hash
        self.shard_layers = tuple(shard_layers)
        self.http = http
        # how nodes' /info and health are read: directly, or over the user's relay paths
        # (node/gateway/node_info.py; the personal client with --relays): the only way this
        # router reaches a node
        self.info = info or DirectInfo(http)
        self._observed: dict[str, float] = {}  # endpoint -> when its stats were last read
        # endpoint → positions one credit pays for there (its price on the committee chain,
        # checked against its /info; 0: free, or no price and free by its /info; absent: no
        # price on the chain, refused `price_unregistered`): what the gateway's credit payer
        # reads (node/client/paying.py); `prices`: one dict shared by the routers of the models
        # one gateway serves (their nodes' endpoints differ: one payer reads them all)
        self.prices: dict[str, int] = {} if prices is None else prices
        # endpoint → the party the payer assigns that node's credits to (its registered key,
        # this model, its shard: protocol/committee/credit_holder.py), kept with `prices`
        self.parties: dict[str, bytes] = {} if parties is None else parties
        self.refresh_s = refresh_s
        self._cache: tuple[float, dict[int, list[RoutableNode]]] | None = None
        self._lock = asyncio.Lock()
        self._verified: dict[RoutableNode, float] = {}
        self._cooldown: dict[str, float] = {}  # node key → monotonic end of its cooldown
        self._failed_at: dict[str, float] = {}  # node key → monotonic time it last failed
        self.cooldown_s = cooldown_s  # how long a node that failed a question sits out
        # how long a node another hop named as the fault sits out
        self.accused_cooldown_s = min(accused_cooldown_s, cooldown_s)
        self._random = secrets.SystemRandom()
        self.costs = CostBook(rng=self._random)
        self._observing: dict[str, asyncio.Task[None]] = {}  # endpoint -> its /info refresh
        self.max_sessions_per_node = max_sessions_per_node
        self.slot_wait_s = slot_wait_s
        self._slots: dict[str, asyncio.Semaphore] = {}

    @property
    def shard_count(self) -> int:
        return len(self.shard_layers)

    async def routable(self) -> dict[int, list[RoutableNode]]:
        async with self._lock:
            now = time.monotonic()
            if self._cache is None or now - self._cache[0] > self.refresh_s:
                entries = await self.source.compute_nodes()
                view = routable_by_shard(entries, self.shard_count, public_only=self.public_only)
                self._cache = (time.monotonic(), view)
            return self._cache[1]

    def mark_failed(self, node: RoutableNode, *, accused: bool = False) -> None:
        """`node` failed a question (or a check): it sits out `cooldown_s`; `accused`: only
        another hop named it (its next hop, node/client/circuit.py NEXT_HOP_FAULTS), it sits
        out `accused_cooldown_s`. Either way its /info is read again before its next use."""
        cooldown_s = self.accused_cooldown_s if accused else self.cooldown_s
        log.warning(
            "node failed; cooling down node=%s endpoint=%s for_s=%g%s",
            node.key[:16],
            node.endpoint,
            cooldown_s,
            " (named by its previous hop)" if accused else "",
        )
        now = time.monotonic()
        until = max(self._cooldown.get(node.key, 0.0), now + cooldown_s)
        self._cooldown[node.key] = until
        self._failed_at[node.key] = now
        self._verified.pop(node, None)
        self.costs.observe_failure(node.endpoint)

    def _cooling(self, node: RoutableNode) -> bool:
        until = self._cooldown.get(node.key)
        return until is not None and until > time.monotonic()

    def _pin(self, node: RoutableNode) -> NodeKeyPin | bool | None:
        """The link's `ssl=` (TLS pinned to the registered node key, node/links.py), or None
        (logged, node cooled down) for a plaintext endpoint off loopback."""
        try:
            return link_ssl(node.endpoint, node.key, plaintext_ok=False)
        except PlanetError as error:
            log.warning("node refused endpoint=%s error=%s", node.endpoint, error.message)
            self.mark_failed(node)
            return None

    async def _verify(self, node: RoutableNode) -> bool:
        checked = self._verified.get(node)
        fresh = checked is not None and time.monotonic() - checked < VERIFY_TTL_S
        if fresh:
            self._set_price(node)  # the chain's, refreshed with the list
        if fresh and all(self.accept_price(p or 0) for _, _, p in node.payees()):
            return True  # (a price seen since by the background /info refresh counts)
        pin = self._pin(node)
        if pin is None:
            return False
        started = time.perf_counter()
        try:
            info = await self.read_info(node, pin)
        except InfoUnavailable as error:
            log.warning("node unreachable endpoint=%s error=%s", node.endpoint, error)
            self.mark_failed(node)
            return False
        self._observed[node.endpoint] = time.monotonic()
        self.costs.observe_info(node.endpoint, info, time.perf_counter() - started)
        span = node.span
        expected = [self.shard_layers[span.first][0], self.shard_layers[span.last][1]]
        if (
            not isinstance(info, dict)
            or info.get("model_hash") != self.model_hash
            or info.get("shard") != node.shard
            or info.get("layers") != expected
            or info.get("shards", [node.shard]) != list(span.shards)
        ):
            log.warning("node serves something else endpoint=%s", node.endpoint)
            self.mark_failed(node)
            return False
        if not self._note_price(node, info):
            log.warning(
                "node's /info price is not its registered one endpoint=%s registered=%s "
                "advertised=%r",
                node.endpoint,
                [p for _, _, p in node.payees()],
                info.get("shard_prices") if node.last is not None else info.get("credit_positions"),
            )
            self.mark_failed(node)  # looked at again after the cooldown: prices change
            return False
        asked = [self.prices[name] for _, name, _ in node.payees()]
        if not all(self.accept_price(price) for price in asked):
            log.info(
                "node charges what this gateway does not pay endpoint=%s credit_positions=%s",
                node.endpoint,
                asked,
            )
            self.mark_failed(node)  # looked at again after the cooldown: prices change
            return False
        self._verified[node] = time.monotonic()
        return True

    def _slot(self, node: RoutableNode) -> asyncio.Semaphore:
        slot = self._slots.get(node.key)
        if slot is None:
            size = self.max_sessions_per_node
            if node.capacity > 0:
                size = min(size, node.capacity)
            slot = self._slots[node.key] = asyncio.Semaphore(size)
        return slot

    @contextlib.asynccontextmanager
    async def hold(self, circuit: Circuit) -> AsyncIterator[None]:
        """Hold one session slot on every node of `circuit` (at most `max_sessions_per_node`
        questions per node at once from this gateway: nodes count a gateway as one caller with
        a per-caller quota, so going over it would only earn 429s). Waiting questions queue;
        slots are taken in shard order, so two circuits can never wait on each other."""
        held: list[asyncio.Semaphore] = []
        try:
            async with asyncio.timeout(self.slot_wait_s):
                for node in circuit.nodes:
                    slot = self._slot(node)
                    await slot.acquire()
                    held.append(slot)
        except TimeoutError:
            for slot in held:
                slot.release()
            raise NoCircuit(
                "nodes_busy",
                f"every routable node is busy; no session slot within {self.slot_wait_s:g} s",
            ) from None
        except BaseException:
            for slot in held:
                slot.release()
            raise
        try:
            yield
        finally:
            for slot in held:
                slot.release()

    async def circuit(self, prompt: Sequence[int] | None = None) -> Circuit:
        """Verified nodes that cover the shards in order, one hop each (a span hop covers
        several), by cost (see the module docstring); NoCircuit names the first shard nothing
        covers. With the question's `prompt` (route="cost" only), each hop's choice among the
        near-cheapest prefers the node holding the most of its prefix behind the hops already
        chosen (protocol/prefix_routes.py)."""
        routable = await self.routable()
        return Circuit(tuple(await self._cover(routable, 0, self.shard_count - 1, prompt=prompt)))

    async def _cover(
        self,
        routable: dict[int, list[RoutableNode]],
        first: int,
        last: int,
        *,
        exclude: str = "",
        prompt: Sequence[int] | None = None,
    ) -> list[RoutableNode]:
        """Hops for shards `first` … `last`, one start after another: a span (fewer hops)
        where one that fits is usable and not overloaded, else the shard's own node."""
        reach = _reachable(routable, first, last)
        chosen: list[RoutableNode] = []
        shard = first
        while shard <= last:
            prefer = None
            if prompt is not None and self.route == "cost":
                upstream = [n.endpoint for n in chosen]
                prefer = prefix_preference(self.costs, prompt, upstream, _endpoint)
            fits = [
                n
                for n in routable.get(shard, [])
                if n.span.last <= last and reach.get(n.span.last + 1, False)
            ]
            node = await self._choose_hop(fits, shard, exclude, prefer)
            chosen.append(node)
            shard = node.span.last + 1
        return chosen

    async def _choose_hop(
        self,
        nodes: list[RoutableNode],
        shard: int,
        exclude: str,
        prefer: Callable[[RoutableNode], int] | None,
    ) -> RoutableNode:
        """Among `nodes` (all starting at `shard`): the longest span whose nodes are routable,
        not cooling, not overloaded and verify (fewer hops); else the shard's single-shard
        nodes as before (graced, cooling ones after); else a span as leniently."""
        spans = sorted({n.span.size for n in nodes if n.span.size > 1}, reverse=True)
        for size in spans:
            pool = [
                n
                for n in nodes
                if n.span.size == size
                and n.key != exclude
                and not n.grace
                and not self._cooling(n)
                and not self.costs.overloaded(n.endpoint)
            ]
            if pool:
                with contextlib.suppress(NoCircuit):
                    return await self._choose_among(pool, shard, prefer)
        groups = [[n for n in nodes if n.span.size == 1]]
        groups += [[n for n in nodes if n.span.size == size] for size in spans]
        for group in groups[:-1]:
            with contextlib.suppress(NoCircuit):
                return await self._choose({shard: group}, shard, exclude, prefer)
        return await self._choose({shard: groups[-1]}, shard, exclude, prefer)

    async def replace(
        self,
        circuit: Circuit,
        indices: Iterable[int],
        *,
        failed: bool = True,
        accused: Iterable[int] = (),
    ) -> Circuit:
        """`circuit` with the nodes at `indices` (which failed) cooling down and replaced by
        the next choice for their shard; a shard with no other node keeps its node (tried
        again after the caller's backoff: the failure may have been passing). `failed=False`:
        they were `outpriced`, replaced without cooling down. `accused`: those of `indices`
        that only their previous hop named as the fault, cooling `accused_cooldown_s`."""
        routable = await self.routable()
        chosen = set(indices)
        named = set(accused)
        for index in chosen if failed else ():
            self.mark_failed(circuit.nodes[index], accused=index in named)
        nodes: list[RoutableNode] = []
        for index, node in enumerate(circuit.nodes):
            if index not in chosen:
                nodes.append(node)
                continue
            span = node.span  # the same shards: another span, or shorter hops
            try:
                nodes.extend(await self._cover(routable, span.first, span.last, exclude=node.key))
            except NoCircuit:
                log.warning("no other node for shards %s; trying the same node again", span)
                nodes.append(node)
        return Circuit(tuple(nodes))

    async def _choose(
        self,
        routable: dict[int, list[RoutableNode]],
        shard: int,
        exclude: str = "",
        prefer: Callable[[RoutableNode], int] | None = None,
    ) -> RoutableNode:
        nodes = [n for n in routable.get(shard, []) if n.key != exclude]
        candidates = [n for n in nodes if not self._cooling(n)]
        cooling = [n for n in nodes if n not in candidates]
        try:
            return await self._choose_among([n for n in candidates if not n.grace], shard, prefer)
        except NoCircuit:
            graced = [n for n in candidates if n.grace]
            if not graced and not cooling:
                raise
        try:
            node = await self._choose_among(graced, shard)
        except NoCircuit:
            if not cooling:
                raise
            return await self._revive(cooling, shard)
        log.warning(
            "shard %d has no routable node that answers; routing through node %s, DOWN on "
            "chain (missed heartbeats) but answering now",
            shard,
            node.key[:16],
        )
        return node

    async def _revive(self, nodes: list[RoutableNode], shard: int) -> RoutableNode:
        """No node of `shard` that is not cooling answers (or there is none): rather than
        answer `no_routable_node`, try the cooling `nodes` (each /info read again first: a
        cooled node is no longer verified) — routable before graced, the one that failed
        longest ago first (route="cost"; the other routes draw uniformly, as always)."""
        log.warning(
            "no node of shard %d answers but %d cooling down; trying those again",
            shard,
            len(nodes),
        )
        if self.route != "cost":
            routable = [n for n in nodes if not n.grace]
            try:
                return await self._draw(routable, shard)
            except NoCircuit:
                return await self._draw([n for n in nodes if n.grace], shard)
        ordered = sorted(nodes, key=lambda n: (n.grace, self._failed_at.get(n.key, 0.0)))
        for node in ordered[:MAX_TRIES_PER_SHARD]:
            if await self._verify(node):
                return node
        raise self._none_for(shard)

    async def _choose_among(
        self,
        candidates: list[RoutableNode],
        shard: int,
        prefer: Callable[[RoutableNode], int] | None = None,
    ) -> RoutableNode:
        if self.route != "cost":
            return await self._draw(candidates, shard)
        self._observe_stale(candidates)
        # a node whose gateway slots are all taken is overloaded for this gateway
        free = [n for n in candidates if not self._slot(n).locked()]
        pool = free or candidates
        probes = 0  # unverified candidates probed: a few, so dead registrations cannot stall
        while pool:
            node = self.costs.choose(pool, lambda n: n.endpoint, prefer)
            assert node is not None
            if node not in self._verified:
                probes += 1
                if probes > MAX_TRIES_PER_SHARD:
                    break
            if await self._verify(node):
                return node
            pool.remove(node)
        raise self._none_for(shard)

    def _none_for(self, shard: int) -> NoCircuit:
        return NoCircuit(
            "no_routable_node",
            f"no routable compute node serves shard {shard} of {self.shard_count} "
            "right now; try again later",
        )

    async def _draw(self, candidates: list[RoutableNode], shard: int) -> RoutableNode:
        """route="private": the shard's guard while it is a candidate and verifies, else a new
        one drawn uniformly from the candidates (and kept); route="uniform": a fresh draw."""
        pool = list(candidates)
        keeping = self.route == "private"
        kept = self.guards.get(shard) if keeping else None
        node = next((n for n in pool if n.key == kept), None)
        probes = 0
        while pool:
            if node is None:
                node = pool[self._random.randrange(len(pool))]
                if node not in self._verified:
                    probes += 1
                    if probes > MAX_TRIES_PER_SHARD:
                        break
            if await self._verify(node):
                if not keeping:
                    return node
                if node.key != kept:
                    log.info(
                        "route: shard %d through node %s from now on (drawn at random among %d)",
                        shard,
                        node.key[:16],
                        len(candidates),
                    )
                self.guards.keep(shard, node.key)
                return node
            pool.remove(node)
            node = None
        raise self._none_for(shard)

    def outpriced(self, circuit: Circuit) -> set[int]:
        """Indices of `circuit`'s nodes picked on trial that the client's passes now price
        above `MOVE_FACTOR` × their shard's cheapest (node/client/costs.py `outpriced`); none
        unless route="cost" (no node is left for being slower: that would hand the hop to the
        fastest)."""
        if self._cache is None or self.route != "cost":
            return set()
        routable = self._cache[1]
        out = set()
        for index, node in enumerate(circuit.nodes[: self.shard_count]):
            pool = [
                n
                for n in routable.get(node.shard, [])
                if n.span == node.span and not self._cooling(n) and not n.grace
            ]
            if node in pool and self.costs.outpriced(pool, lambda n: n.endpoint, node):
                out.add(index)
        return out

    def _observe_stale(self, nodes: Iterable[RoutableNode]) -> None:
        """Refresh, in the background, the cost stats of the nodes whose stats are stale (one
        /info at a time per node; verified nodes only: a new one is verified when chosen)."""
        for node in nodes:
            if node not in self._verified or not self.costs.stale(node.endpoint):
                continue
            last = self._observed.get(node.endpoint)
            if last is not None and time.monotonic() - last < self.info.observe_s:
                continue  # read less often than the stats go stale (over the overlay: 30 s)
            task = self._observing.get(node.endpoint)
            if task is None or task.done():
                self._observing[node.endpoint] = asyncio.create_task(self._observe(node))

    async def _observe(self, node: RoutableNode) -> None:
        self._observed[node.endpoint] = time.monotonic()
        pin = self._pin(node)  # directly: TLS pinned to the node key; over the overlay the
        if pin is None:  # exits pin it (the onion names the key)
            return
        started = time.perf_counter()
        try:
            info = await self.read_info(node, pin)
        except InfoUnavailable:
            self.costs.observe_failure(node.endpoint)
            return
        self.costs.observe_info(node.endpoint, info, time.perf_counter() - started)
        if isinstance(info, dict) and not self._note_price(node, info):
            self.mark_failed(node)

    async def read_info(self, node: RoutableNode, ssl: Any) -> Any:
        """`node`'s /info through the router's reader, at its endpoint and then at its other
        relays' addresses (node.dial `first_reachable`), each within the reader's timeout (what
        a node with one address gets); InfoUnavailable (the endpoint's) when none answers, in
        time or at all.
        `ssl`: the endpoint's pin (an https:// node's key pin holds at every address:
        `alternates_of` keeps https only)."""
        timeout_s = self.info.timeout_s

        async def read(url: str) -> Any:
            return await self.info.info(url, node.key, ssl, timeout_s)

        try:
            _, info = await first_reachable(
                node.addresses,
                read,
                total_s=timeout_s * len(node.addresses),
                each_s=timeout_s,
                what=f"node {node.key[:16]}… /info",
                errors=(InfoUnavailable, TimeoutError),
            )
        except TimeoutError as error:
            # the dial's bound ran out before the reader's own (a node that takes the
            # connection and never answers: frozen, or a stranger's tarpit): unavailable as
            # any other. Escaping as TimeoutError, it ended the question it was verified for
            # (aiohttp's 504, no traceback) where the caller would have tried another node.
            raise InfoUnavailable(f"no answer within {timeout_s:g} s") from error
        return info

    async def healthy(self, node: RoutableNode, timeout_s: float) -> bool:
        """Whether `node` answers /health (over the overlay: an INFO) at any of its
        addresses, in turn, each within max(`timeout_s`, the reader's timeout): the first
        address of a node behind NAT gets the time a node with one address gets (split, a
        NAT node over 50 ms links failed the failover probe and was swapped out of a healthy
        circuit)."""

        async def probe(url: str) -> None:
            if not await self.info.healthy(url, node.key, timeout_s):
                raise InfoUnavailable(f"{url} is not healthy")

        try:
            await first_reachable(
                node.addresses,
                probe,
                total_s=max(timeout_s, self.info.timeout_s) * len(node.addresses),
                each_s=max(timeout_s, self.info.timeout_s),
                what=f"node {node.key[:16]}… /health",
                errors=(InfoUnavailable, TimeoutError),
            )
        except (InfoUnavailable, TimeoutError):
            return False
        return True

    def _note_price(self, node: RoutableNode, info: dict[str, Any]) -> bool:
        """The node's price is its registered one (`node.price`, from the chain); its /info
        is only checked against it (`price_trusted`). False: not a node to pay or route to."""
        if node.last is None:
            trusted = price_trusted(node.price, info.get("credit_positions", 0))
        else:  # a span: each shard's registered price against its /info `shard_prices`
            listed = info.get("shard_prices")
            advertised = listed if isinstance(listed, dict) else {}
            trusted = all(
                price_trusted(price, advertised.get(str(shard), 0))
                for shard, _, price in node.payees()
            )
        self._set_price(node if trusted else None, node)
        return trusted

    def _set_price(self, node: RoutableNode | None, of: RoutableNode | None = None) -> None:
        """`node`'s chain price into `prices`, per payee (a span: each shard's; a node with
        none, routed only while its /info says free, at 0); None: `of` is not to be paid, its
        entries go."""
        if node is None:
            for _, name, _ in of.payees() if of is not None else ():
                self.prices.pop(name, None)
                self.parties.pop(name, None)
            return
        key = bytes.fromhex(node.key)
        for shard, name, price in node.payees():
            self.prices[name] = price or 0
            self.parties[name] = node_party(key, self.model_hash, shard)

    async def probe(self, circuit: Circuit) -> None:
        """After a failed question: put every node of `circuit` that does not answer /health
        (over the overlay: its INFO) in cooldown."""

        async def one(node: RoutableNode) -> None:
            pin = self._pin(node)
            if pin is None:
                return
            if await self.healthy(node, 2.0):
                return
            self.mark_failed(node)

        await asyncio.gather(*(one(n) for n in circuit.nodes))


async def pool_view(rpc: Any, model_hash: str, shard_count: int) -> dict[str, Any]:
    """The committee's /pool_health for this model (routable per shard, status)."""
    try:
        answer = await rpc.abci_query(f"/pool_health?model={model_hash}&shards={shard_count}")
    except PlanetError as error:
        raise NoCircuit(
            "committee_unavailable", f"the committee chain is unreachable: {error}"
        ) from None
    return answer if isinstance(answer, dict) else {}


def _endpoint(node: RoutableNode) -> str:
    return node.endpoint


def _reachable(routable: dict[int, list[RoutableNode]], first: int, last: int) -> dict[int, bool]:
    """For every shard s in `first` … `last` + 1: whether the routable hops, one after
    another, cover s … `last` (True at `last` + 1)."""
    reach = {last + 1: True}
    for shard in range(last, first - 1, -1):
        reach[shard] = any(
            n.span.last <= last and reach.get(n.span.last + 1, False)
            for n in routable.get(shard, [])
        )
    return reach
