"""Circuits over replicas: several nodes per shard, one chosen by expected cost, the others
spares for failover (`planet ask` with a nodes file that lists more than one node a shard, the
benches, the tests).

`ReplicaCircuits` is a `node.client.failover.CircuitSource`. Each lease reads GET /info of the
nodes whose stats are stale (node/client/costs.py: round trip, compute per forward, queue,
sessions), drops a node that answers for another model, shard or layer range, and picks one
node per shard with `CostBook.choose` (random among the near-cheapest, overloaded ones last).
After a failure the suspect hops are replaced by another node of their shard, and the failed
nodes sit out `avoid_s` (used again only when a shard has no other node).
With the question's `prompt`, each shard's choice among the near-cheapest prefers the node whose
/info `prefix_routes` holds the most of its prefix behind the hops picked before it, and the
circuit's opens send each node the prompt's route keys (protocol/prefix_routes.py).

Prices: what a node asks is its /info `credit_positions`; what this client pays is a price it
can check (`checked`): with `chain_prices` (the committee's `/nodes`, node/client/chain_prices.py)
the node's registered price, where its /info agrees (`price_trusted`); without a chain, /info's
own price only when the user capped it (`info_prices`: `planet ask --min-credit-positions N`
given explicitly), else none — and a charging node with no checked price is refused by name
when its turn to be paid comes (`price_unregistered`, final). A node this client can pay comes
first — a free one, or with `credits` one with a checked price no dearer than the floor — and a
charging node is picked for a client that pays none only when no free node serves its shard.
So such a node's `payment_required` is the client's own doing, shared by every node it could be
sent to instead: final for the question (`node.client.paying.UnpaidError`), no replay, the node
not avoided.

With `overlay` (an `OverlayRoute.dialer`, `planet ask --relays`) every circuit reaches its nodes
over relay paths, and `reader` (node/client/info.py `NodeReader`) reads their /info and health
the same way: nothing of this client reaches a node from the user's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from node.client.chain_prices import price_trusted
from node.client.circuit import CircuitClient
from node.client.costs import CostBook, prefix_preference
from node.client.credit_wallet import CreditWallet
from node.client.failover import unhealthy_hops
from node.client.info import NodeReader, node_info
from node.client.paying import MIN_POSITIONS, CreditPayer, accepts_price, payee
from node.client.types import Hop
from protocol.committee.credit_holder import node_party
from protocol.committee.grammar import HEX64
from protocol.errors import ConfigError, PlanetError
from protocol.frames.dtypes import WIRE_DTYPE

log = logging.getLogger(__name__)

AVOID_S = 30.0  # a node that failed a session sits out this long
INFO_TIMEOUT_S = 3.0


class ReplicaCircuits:
    """See the module docstring. `expected[shard] = (model_hash, [start, end])`."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        nodes: Sequence[Hop],
        *,
        expected: Mapping[int, tuple[str, tuple[int, int]]],
        hidden_size: int,
        codec: str = "raw",
        dtype: str = WIRE_DTYPE,
        request_timeout_s: float = 120.0,
        prefill_chunk: int = 64,
        costs: CostBook | None = None,
        avoid_s: float = AVOID_S,
        probe_timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        plaintext_links: bool = False,
        credits: CreditWallet | None = None,
        min_credit_positions: int = MIN_POSITIONS,
        chain_prices: Mapping[str, int | None] | None = None,
        info_prices: bool = False,
        prompt: Sequence[int] | None = None,
        overlay: Callable[[Hop], Awaitable[Any]] | None = None,
        reader: NodeReader | None = None,
    ) -> None:
        self.http = http
        # reach the nodes over relay paths (module docstring); None: direct links and reads
        self.overlay = overlay
        self.reader = reader
        # the question's prompt: each shard's choice among the near-cheapest prefers the node
        # holding the most of its prefix (node/client/costs.py `prefix_preference`)
        self.prompt = None if prompt is None else list(prompt)
        self.plaintext_links = plaintext_links  # plaintext beyond loopback (explicit local mode)
        self.expected = dict(expected)
        # hops by the first shard they serve (a span hop: shards hop.shard … hop.last)
        self.by_shard: dict[int, list[Hop]] = {shard: [] for shard in sorted(self.expected)}
        for hop in nodes:
            if hop.shard not in self.by_shard or hop.span.last not in self.by_shard:
                raise ConfigError(f"node {hop.url} serves shards {hop.span}, not in the model")
            if hop not in self.by_shard[hop.shard]:
                self.by_shard[hop.shard].append(hop)
        if self._covering(lambda hop: True) is None:
            served = {shard for hops in self.by_shard.values() for h in hops for shard in h.span}
            empty = [shard for shard in self.by_shard if shard not in served]
            raise ConfigError(
                f"no node serves shard {empty[0]}"
                if empty
                else "no chain of the nodes' shards and spans covers every shard"
            )
        self.hidden_size = hidden_size
        self.codec = codec
        self.dtype = dtype
        self.request_timeout_s = request_timeout_s
        self.prefill_chunk = prefill_chunk
        self.costs = costs or CostBook()
        self.avoid_s = avoid_s
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._avoid: dict[str, float] = {}
        self._wrong: set[Hop] = set()  # answered for another model, shard or layers
        self.current: tuple[Hop, ...] | None = None
        self.circuits: list[tuple[Hop, ...]] = []  # every circuit leased, in order
        # what each node asks (its /info `credit_positions`), and what this client pays it: a
        # price it can check (module docstring; absent: none, `price_unregistered`)
        self.prices: dict[str, int] = {}
        self.checked: dict[str, int] = {}
        self.chain_prices = chain_prices  # hop URL → registered price (None: none); None: no chain
        self.info_prices = info_prices  # no chain: pay /info's price (the user capped it)
        self.payer = (
            None
            if credits is None
            else CreditPayer(credits, self.checked, min_positions=min_credit_positions)
        )
        # which prices this client pays: free nodes only without credits
        self._payable = (
            (lambda price: price == 0) if credits is None else accepts_price(min_credit_positions)
        )

    # ------------------------------------------------------------------------------ choosing
    async def refresh(self) -> None:
        """GET /info of every node whose stats are stale (concurrently)."""
        stale = [
            hop
            for hops in self.by_shard.values()
            for hop in hops
            if hop not in self._wrong and not self._avoided(hop) and self.costs.stale(hop.url)
        ]
        await asyncio.gather(*(self._observe(hop) for hop in stale))

    async def _observe(self, hop: Hop) -> None:
        started = time.perf_counter()
        timeout_s = INFO_TIMEOUT_S if self.reader is None else self.reader.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self.reader is not None:
                    info = await self.reader.info(hop)
                else:
                    info = await node_info(self.http, hop, plaintext_links=self.plaintext_links)
        except (PlanetError, TimeoutError):
            self.costs.observe_failure(hop.url)
            return
        self.take_info(hop, info, time.perf_counter() - started)

    def take_info(self, hop: Hop, info: dict[str, Any], rtt_s: float) -> None:
        """What `hop`'s /info says, read by the caller `rtt_s` ago (`planet ask` reads the
        circuit's to check it first: not read twice, which over relays is a link each)."""
        self.costs.observe_info(hop.url, info, rtt_s)
        for name, price in _advertised(hop, info).items():  # a span hop: one price per shard
            self.prices[name] = price if isinstance(price, int) and 0 <= price < 2**31 else 0
            self._check_price(name, price)
        model_hash, layers = self.span_expected(hop)
        if (
            info.get("model_hash") != model_hash
            or info.get("shard") != hop.shard
            or info.get("layers") != list(layers)
            or info.get("shards", [hop.shard]) != list(hop.span.shards)
        ):
            log.warning("node serves something else; not used url=%s", hop.url)
            self._wrong.add(hop)
            return
        self._note_party(hop, info.get("node_key"), model_hash)

    def _note_party(self, hop: Hop, announced: object, model_hash: str) -> None:
        """Whom `hop`'s credits are assigned to: its pinned key (https://), else the key its
        /info announces (a node that names another's key only pays that other node)."""
        key = hop.key or announced
        if self.payer is not None and isinstance(key, str) and HEX64.match(key):
            for shard, name in _payees(hop):
                self.payer.parties[name] = node_party(bytes.fromhex(key), model_hash, shard)

    def _check_price(self, url: str, advertised: object) -> None:
        """`checked[url]`: the price this client may pay the node asking `advertised`."""
        if self.chain_prices is not None:
            registered = self.chain_prices.get(url)
            trusted = price_trusted(registered, advertised)
            price = (registered or 0) if trusted else None
            if not trusted:
                log.warning(
                    "node's /info price is not its registered one url=%s registered=%s "
                    "advertised=%r",
                    url,
                    registered,
                    advertised,
                )
        else:  # no chain: free, or /info's own price where the user capped what it pays
            price = None
            if isinstance(advertised, int) and price_trusted(advertised, advertised):
                price = advertised if advertised == 0 or self.info_prices else None
        if price is None:
            self.checked.pop(url, None)
        else:
            self.checked[url] = price

    def _can_pay(self, hop: Hop) -> bool:
        """Whether this client pays what `hop` asks: nothing (no credits), or a checked price
        no dearer than its floor."""
        names = [name for _, name in _payees(hop)]
        if self.payer is None:
            return all(self.prices.get(name, 0) == 0 for name in names)
        prices = [self.checked.get(name) for name in names]
        return all(price is not None and self._payable(price) for price in prices)

    def _avoided(self, hop: Hop) -> bool:
        until = self._avoid.get(hop.url)
        return until is not None and until > self._clock()

    def span_expected(self, hop: Hop) -> tuple[str, tuple[int, int]]:
        """(model hash, layer range) a node must announce for `hop`'s shards."""
        model_hash, first_layers = self.expected[hop.shard]
        last_layers = self.expected[hop.span.last][1]
        return model_hash, (first_layers[0], last_layers[1])

    def _covering(
        self, allowed: Callable[[Hop], bool], first: int = 0, last: int | None = None
    ) -> dict[int, bool] | None:
        """For every shard s in `first` … `last` (default: the model's last): whether hops that
        `allowed` lets through, one after another, cover s … `last` (a span hop covers its
        shards at once); None when they do not cover `first`."""
        end = (max(self.by_shard) if last is None else last) + 1
        reach = {end: True}
        for shard in range(end - 1, first - 1, -1):
            reach[shard] = any(
                reach.get(hop.span.last + 1, False)
                for hop in self.by_shard.get(shard, [])
                if allowed(hop)
            )
        return reach if reach[first] else None

    def pick(
        self,
        shard: int,
        exclude: frozenset[str] = frozenset(),
        prefer: Callable[[Hop], int] | None = None,
        *,
        until: int | None = None,
        reach: Mapping[int, bool] | None = None,
    ) -> Hop:
        """The hop that starts at `shard`: by cost among the usable ones this client can pay
        (module docstring); an avoided or excluded node only when nothing else serves the
        shard, one it cannot pay only when no other is usable. Among usable, payable, not
        overloaded ones a span (fewer hops) comes first, the longest that ends by `until`
        (default: the last shard) and from whose end `reach` goes on."""
        last = max(self.by_shard) if until is None else until

        def fits(hop: Hop) -> bool:
            end = hop.span.last
            return end <= last and (end == last or reach is None or reach.get(end + 1, False))

        every = [h for h in self.by_shard[shard] if fits(h)]
        hops = [h for h in every if h not in self._wrong] or every
        usable = [h for h in hops if h.url not in exclude and not self._avoided(h)]
        payable = [h for h in usable if self._can_pay(h)]
        light = [h for h in payable if not self.costs.overloaded(h.url)]
        if light:  # fewer hops when a span's load allows
            longest = max(h.span.size for h in light)
            payable = [h for h in light if h.span.size == longest]
        chosen = self.costs.choose(payable or usable or hops, _url, prefer)
        assert chosen is not None  # a cover exists (checked in __init__)
        return chosen

    def cover(
        self,
        first: int,
        last: int,
        exclude: frozenset[str] = frozenset(),
        upstream: Sequence[Hop] = (),
    ) -> list[Hop]:
        """Hops that run shards `first` … `last` in order (singles and spans), picked one
        start after another (`pick`)."""
        good = self._covering(lambda h: h not in self._wrong, first, last)
        usable = self._covering(
            lambda h: h not in self._wrong and h.url not in exclude and not self._avoided(h),
            first,
            last,
        )
        anything = self._covering(lambda h: True, first, last)
        reach = usable or good or anything
        picked: list[Hop] = []
        shard = first
        while shard <= last:
            prefer = None
            if self.prompt is not None:
                seen = [hop.url for hop in (*upstream, *picked)]
                prefer = prefix_preference(self.costs, self.prompt, seen, _url)
            hop = self.pick(shard, exclude, prefer, until=last, reach=reach)
            picked.append(hop)
            shard = hop.span.last + 1
        return picked

    def fail(self, hop: Hop) -> None:
        log.warning("node failed; avoided for %g s url=%s", self.avoid_s, hop.url)
        self._avoid[hop.url] = self._clock() + self.avoid_s
        self.costs.observe_failure(hop.url)

    # ------------------------------------------------------------------------------ leasing
    @contextlib.asynccontextmanager
    async def lease(
        self,
        replace: frozenset[int],
        *,
        failed: bool = True,
        accused: frozenset[int] = frozenset(),
    ) -> AsyncIterator[CircuitClient]:
        """A dialled circuit (see CircuitSource.lease); closed when the block ends. An
        `accused` hop (only another hop named it) is replaced but not avoided."""
        previous = self.current
        if previous is not None and failed:
            for index in replace - accused:
                self.fail(previous[index])
        await self.refresh()
        if previous is None or not replace:
            hops = tuple(self.cover(0, max(self.by_shard)))
        else:  # a replaced hop's shards by other nodes: the same span, or shorter hops
            out: list[Hop] = []
            for index, hop in enumerate(previous):
                if index in replace:
                    out.extend(self.cover(hop.shard, hop.span.last, frozenset({hop.url}), out))
                else:
                    out.append(hop)
            hops = tuple(out)
        self.current = hops
        self.circuits.append(hops)
        client = CircuitClient(
            hops,
            hidden_size=self.hidden_size,
            codec=self.codec,
            dtype=self.dtype,
            request_timeout_s=self.request_timeout_s,
            prefill_chunk=self.prefill_chunk,
            http=self.http,
            plaintext_links=self.plaintext_links,
            payer=self.payer,
            known_prices=self.prices,
            overlay=self.overlay,
        )
        for hop in hops:  # its open sends each node the prompt's route keys
            stats = self.costs.get(hop.url)
            if stats.prefix_routes is not None:
                client.route_salts[hop.url] = stats.prefix_routes.salt
            # and next.alternates only to the previous hops whose /info takes them
            client.open_features[hop.url] = stats.open_features
        async with client:
            yield client

    def observe(self, urls: Sequence[str], pass_s: float) -> None:
        self.costs.observe_circuit(urls, pass_s)

    def outpriced(self, hops: Sequence[Hop]) -> set[int]:
        out = set()
        for index, hop in enumerate(hops):
            usable = [
                h
                for h in self.by_shard.get(hop.shard, [])
                if h.span == hop.span and h not in self._wrong and not self._avoided(h)
            ]
            if hop in usable and self.costs.outpriced(usable, lambda h: h.url, hop):
                out.add(index)
        return out

    async def probe(self) -> set[int]:
        if self.current is None:
            return set()
        if self.reader is not None:
            reader, timeout_s = self.reader, self.probe_timeout_s
            answers = await asyncio.gather(*(reader.healthy(h, timeout_s) for h in self.current))
            return {index for index, ok in enumerate(answers) if not ok}
        return await unhealthy_hops(self.http, self.current, self.probe_timeout_s)


def _url(hop: Hop) -> str:
    return hop.url


def _payees(hop: Hop) -> list[tuple[int, str]]:
    """(shard, payee) of each shard `hop` is paid for: its one shard (its URL), or each shard
    of its span (node/client/paying.py `payee`)."""
    if hop.span.size == 1:
        return [(hop.shard, hop.url)]
    return [(shard, payee(hop.url, shard)) for shard in hop.span]


def _advertised(hop: Hop, info: dict[str, Any]) -> dict[str, object]:
    """Payee → the price its /info asks: `credit_positions`, or for a span each shard's
    (`shard_prices`; a free span lists none: 0 each)."""
    if hop.span.size == 1:
        return {hop.url: info.get("credit_positions", 0)}
    listed = info.get("shard_prices")
    prices = listed if isinstance(listed, dict) else {}
    return {name: prices.get(str(shard), 0) for shard, name in _payees(hop)}
