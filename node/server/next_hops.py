"""Which next hops a node dials for a circuit (`open` with `next`): its next-hop policy.

A client's `open` names the next hop's URL and the node dials it. Without a policy any stranger
could make a node open connections to any host:port it can reach (internal services, other
tenants, its own admin ports). So `_open` (node/server/stream.py) asks the policy BEFORE any
dial and refuses with `next_hop_not_allowed` (403) by name:

    none        forward to nobody (a bare `planet node serve`): the node still serves as a last
                hop
    list        only these URLs (`--next-hops URL[,URL...]` / `--next-hops-file`; `planet local
                up` passes its own nodes)
    committee   only compute nodes the committee chain lists as routable (or graced: DOWN
                lately but otherwise routable, abci_app/liveness.py) for this node's model
                AND for the shard the client names, under the node key the client names
                (the key the node pins when it dials: node/links.py) (`planet join`, devnet)
    any         everything (development only; logged as a warning at start)

Every policy also requires `next.shard == own shard + 1`: a circuit runs the shards in order, so a
client cannot route a session in a loop. URLs are compared in their canonical form
(protocol/urls.py); `NextHop.url` arrives canonical from the parser.

Every address of the hop: an open may name the next hop's addresses at its other relays
(`next.alternates`, a node behind NAT) besides `next.url`; the node may dial any of them, so
each one must pass the policy as `next.url` must (list: each on the list; committee: each a
public address, or inside the private ranges, and registered for that node key and shard, as
its `endpoint` or one of its `rendezvous` addresses), or the open is refused naming it: an
alternate never makes a node dial an address it would refuse as a single next hop.

Public addresses only (committee): a staked stranger chooses the endpoint it registers, so it
could register `http://127.0.0.1:6379` or a name resolving to an internal address and have every
node of the previous shard dial it. Under `committee` a node therefore dials only globally
routable addresses: an IP-literal host that is not (loopback, private, link-local, shared,
reserved, IPv4-mapped forms of these) is refused here by name, and a host name is resolved by
`PublicResolver`, which hands the connector only global addresses, so the address checked is
the address connected to (no second lookup to rebind). `--private-next-hops` lifts the rule for
a devnet or a LAN test network. `--private-next-hops CIDR[,CIDR...]` lifts it only for those
ranges (`planet join` passes the devnet's range: 127.0.0.0/8 on loopback, 10.77.0.0/24 for the
devnet's hosts): a non-public IP literal outside them is refused by name, and so is a host name
(it could resolve anywhere; the devnet registers IP literals). Lists and `any` are the
operator's own choice and are not filtered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from node.chain.committee_pages import path_query, read_nodes
from protocol.committee.registry import MAX_RENDEZVOUS
from protocol.errors import PlanetError, UsageError
from protocol.spans import NonContiguousSpanError, span_of
from protocol.stream import MAX_NEXT_ALTERNATES, NextHop, NextHopNotAllowedError
from protocol.urls import BadUrlError, canonical_url

log = logging.getLogger(__name__)

Mode = Literal["none", "any", "list", "committee"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
KEYWORDS: Final = ("none", "any", "committee")
MAX_LIST_URLS: Final = 1024
COMMITTEE_MAX_AGE_S: Final = 10.0  # a hit older than this refreshes the view first
COMMITTEE_MISS_REFRESH_S: Final = 2.0  # misses re-read at most this often (floods of bogus URLs)
COMMITTEE_TIMEOUT_S: Final = 3.0
_KEY_RE = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class NextHopSpec:
    """The parsed `--next-hops` value (part of ServerConfig)."""

    mode: Mode = "none"
    urls: frozenset[str] = frozenset()  # canonical, mode "list" only
    private: bool = False  # committee: also dial non-global addresses (devnet, LAN)
    # committee + private: only the non-global addresses in these ranges (empty: all of them)
    private_ranges: tuple[Network, ...] = ()

    @property
    def public_only(self) -> bool:
        """Whether dials are limited to globally routable addresses (committee, by default)."""
        return self.mode == "committee" and not self.private

    def describe(self) -> str:
        if self.mode == "list":
            return f"list of {len(self.urls)}: {', '.join(sorted(self.urls))}"
        if self.mode == "committee" and self.private_ranges:
            ranges = ", ".join(str(r) for r in self.private_ranges)
            return f"committee (private addresses in {ranges} allowed)"
        if self.mode == "committee":
            return "committee" + (" (private addresses allowed)" if self.private else "")
        return self.mode


FORWARD_NONE: Final = NextHopSpec()  # the default: this node dials no next hop


def parse_next_hops(text: str) -> NextHopSpec:
    """`none` | `any` | `committee` | `URL[,URL...]` → NextHopSpec, or UsageError."""
    value = text.strip()
    if value.lower() in KEYWORDS:
        return NextHopSpec(mode=value.lower())  # type: ignore[arg-type]
    return NextHopSpec(mode="list", urls=_url_set(value.split(","), "--next-hops"))


def read_next_hops_file(path: Path) -> NextHopSpec:
    """One URL a line; blank lines and `#` comments skipped. UsageError when unreadable/bad."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            f"cannot read --next-hops-file {path}: {getattr(error, 'strerror', None) or error}",
            hint="one http(s)://host:port a line",
        ) from None
    lines = [line.split("#", 1)[0] for line in text.splitlines()]
    return NextHopSpec(mode="list", urls=_url_set(lines, f"{path}"))


def parse_ranges(text: str, where: str = "--private-next-hops") -> tuple[Network, ...]:
    """`CIDR[,CIDR...]` (e.g. 10.77.0.0/24) → networks, or UsageError naming `where`."""
    ranges = []
    for item in text.split(","):
        item = item.strip()
        try:
            ranges.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise UsageError(
                f"{where}: {item!r} is not an address range",
                hint="CIDR notation, e.g. 10.77.0.0/24 or 127.0.0.0/8",
            ) from None
    if len(ranges) > 16:
        raise UsageError(f"{where}: more than 16 ranges")
    return tuple(ranges)


def _url_set(items: Iterable[str], where: str) -> frozenset[str]:
    urls = set()
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            urls.add(canonical_url(item))
        except BadUrlError as error:
            raise UsageError(
                f"{where}: {error.message}",
                hint="e.g. --next-hops http://10.0.0.7:18101,http://10.0.0.8:18102 "
                "(or none, committee, any)",
            ) from None
    if not urls:
        raise UsageError(
            f"{where}: no URL given", hint="e.g. --next-hops http://127.0.0.1:18101 or none"
        )
    if len(urls) > MAX_LIST_URLS:
        raise UsageError(f"{where}: more than {MAX_LIST_URLS} URLs")
    return frozenset(urls)


# ------------------------------------------------------------------------------ addresses
def is_public_address(text: str) -> bool:
    """Whether an IP address (no brackets) is globally routable; IPv4-mapped and 6to4/NAT64
    spellings are judged by the IPv4 address they carry. Not an address → False."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is None and address in ipaddress.IPv6Network("64:ff9b::/96"):
            mapped = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if mapped is not None:
            address = mapped
    return address.is_global and not address.is_multicast


def url_host(url: str) -> str:
    """The host of a canonical URL (protocol/urls.py), brackets of an IPv6 literal removed."""
    host = url.split("://", 1)[1].rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Refusal = Literal["private", "host_name", "outside_ranges"]


def address_refusal(
    url: str, public_only: bool, private_ranges: tuple[Network, ...] = ()
) -> Refusal | None:
    """Why a dialler under this address policy must not dial canonical `url` (None: it may).
    `public_only`: an IP literal must be globally routable (`private`; a host name passes here
    and meets `PublicResolver` at connect time). Else, with `private_ranges`: only IP literals
    (`host_name`: a name could resolve anywhere), public or inside a range (`outside_ranges`).
    Else anything. Shared by next hops and a verifier's peers (node/verifier/findings.py)."""
    host = url_host(url)
    if public_only:
        return "private" if is_ip_literal(host) and not is_public_address(host) else None
    if not private_ranges:
        return None
    if not is_ip_literal(host):
        return "host_name"
    if is_public_address(host):
        return None
    address = ipaddress.ip_address(host)
    return None if any(address in n for n in private_ranges) else "outside_ranges"


class NonPublicAddressError(OSError):
    """A next hop's name resolved to no globally routable address."""


class PublicResolver(AbstractResolver):
    """The connector's resolver under `committee`: the system resolver's answers, only the
    globally routable ones; none left → NonPublicAddressError (the dial fails, nothing is sent)."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        public = [a for a in answers if is_public_address(a["host"])]
        if not public:
            raise NonPublicAddressError(f"{host} resolves to no public address")
        return public

    async def close(self) -> None:
        await self._inner.close()


# ------------------------------------------------------------------------------ policies
class NextHopPolicy(Protocol):
    async def check(self, hop: NextHop) -> None:
        """Return if this node may dial `hop`, else raise NextHopNotAllowedError."""


def _check_order(own_shard: int, hop: NextHop) -> None:
    if hop.shard != own_shard + 1:
        raise NextHopNotAllowedError(
            f"next hop claims shard {hop.shard}; after shard {own_shard} comes {own_shard + 1}"
        )


class ForwardNone:
    def __init__(self, own_shard: int) -> None:
        self.own_shard = own_shard

    async def check(self, hop: NextHop) -> None:
        raise NextHopNotAllowedError(
            f"this node forwards to no next hop ({hop.url} refused): it was started without "
            "--next-hops or a committee; open it as the last hop (next: null), or ask its "
            "operator for --next-hops committee / a URL list"
        )


class ForwardAny:
    def __init__(self, own_shard: int) -> None:
        self.own_shard = own_shard

    async def check(self, hop: NextHop) -> None:
        _check_order(self.own_shard, hop)


class ForwardList:
    def __init__(self, own_shard: int, urls: frozenset[str]) -> None:
        self.own_shard = own_shard
        self.urls = urls

    async def check(self, hop: NextHop) -> None:
        for url in hop.addresses:
            if url not in self.urls:
                raise NextHopNotAllowedError(
                    f"{url} is not on this node's --next-hops list ({len(self.urls)} URLs)"
                )
        _check_order(self.own_shard, hop)


class NodeSource(Protocol):
    async def abci_query(self, path: str) -> Any: ...


def registered_hops(
    answer: Any, *, rendezvous: bool = False
) -> dict[str, dict[int, frozenset[str]]]:
    """Canonical URL → shard → node keys registered there, from a committee `/nodes` answer;
    an entry's shard is the first of the shards it serves as one hop (a span's first: the shard
    a circuit's `open` names it by; a `shards` list that is not contiguous is skipped,
    protocol/spans.py). Untrusted: entries that are neither routable nor graced — DOWN
    lately, otherwise routable, a fallback the clients may route through while it answers
    (abci_app/liveness.py) — or not well-formed are skipped. The URLs are the entries'
    `endpoint`s; with `rendezvous`, their addresses at the relays they name instead
    (`rendezvous[].endpoint`, at most 3 an entry: a node behind NAT's alternates)."""
    nodes = answer.get("nodes") if isinstance(answer, dict) else None
    out: dict[str, dict[int, set[str]]] = {}
    for entry in nodes if isinstance(nodes, list) else []:
        if not isinstance(entry, dict):
            continue
        if entry.get("routable") is not True and entry.get("grace") is not True:
            continue
        key = entry.get("key")
        if not isinstance(key, str) or not _KEY_RE.match(key):
            continue
        try:  # one shard, or a contiguous span served as one hop (protocol/spans.py)
            span = span_of(entry.get("shards"))
        except NonContiguousSpanError:
            continue
        for url in _rendezvous_urls(entry) if rendezvous else _endpoint_url(entry):
            # a hop is opened at its first shard: a span is the next hop after span.first - 1
            out.setdefault(url, {}).setdefault(span.first, set()).add(key)
    return {
        url: {shard: frozenset(keys) for shard, keys in by_shard.items()}
        for url, by_shard in out.items()
    }


def _endpoint_url(entry: dict[str, Any]) -> list[str]:
    try:
        return [canonical_url(entry.get("endpoint"))]
    except BadUrlError:
        return []


def _rendezvous_urls(entry: dict[str, Any]) -> list[str]:
    items = entry.get("rendezvous")
    urls = []
    for item in items[:MAX_RENDEZVOUS] if isinstance(items, list) else []:
        try:
            urls.append(canonical_url(item.get("endpoint") if isinstance(item, dict) else None))
        except BadUrlError:
            continue
    return urls


def rendezvous_by_key(nodes: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """Node key → its addresses at the relays its registration names (`rendezvous[].endpoint`,
    canonical, distinct, in order), for the routable or graced well-formed entries of a
    committee `/nodes` list (untrusted, as `registered_hops` reads it)."""
    out: dict[str, tuple[str, ...]] = {}
    for entry in nodes:
        if not isinstance(entry, dict):
            continue
        if entry.get("routable") is not True and entry.get("grace") is not True:
            continue
        key = entry.get("key")
        if isinstance(key, str) and _KEY_RE.match(key):
            out[key] = tuple(dict.fromkeys(_rendezvous_urls(entry)))
    return out


def routable_hops(answer: Any) -> dict[str, frozenset[int]]:
    """Canonical URL → shards, from a committee `/nodes` answer (see `registered_hops`)."""
    return {url: frozenset(by_shard) for url, by_shard in registered_hops(answer).items()}


class ForwardCommittee:
    """Routable compute nodes of this model on the committee chain (`/nodes?model=&role=
    compute`, the query the gateway's router uses, every page: `read_nodes`; a malformed page
    fails the refresh and keeps the last view), cached. A hit older than `max_age_s`
    refreshes first (at most once per `miss_refresh_s`). A miss — a node the view does not
    list, e.g. one that registered or moved shards a moment ago — re-reads the view at once
    before it refuses, unless a read began after the miss was seen or the last read a miss
    made is younger than `miss_refresh_s`: reads for other reasons (age, warm targets) do not
    count against misses, so a node the committee lists is reachable at once, while a flood of
    bogus URLs costs the RPC at most one query per `miss_refresh_s`. One fetch at a time; the
    others wait for it."""

    def __init__(
        self,
        own_shard: int,
        source: NodeSource,
        model_hash: str,
        *,
        public_only: bool = True,
        private_ranges: tuple[Network, ...] = (),
        max_age_s: float = COMMITTEE_MAX_AGE_S,
        miss_refresh_s: float = COMMITTEE_MISS_REFRESH_S,
        timeout_s: float = COMMITTEE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.own_shard = own_shard
        self.source = source
        self.model_hash = model_hash
        self.public_only = public_only
        self.private_ranges = private_ranges
        self.max_age_s = max_age_s
        self.miss_refresh_s = miss_refresh_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.fetches = 0  # queries sent (tests, /info)
        self._view: dict[str, dict[int, frozenset[str]]] | None = None
        # the nodes' addresses at their rendezvous relays (an open's `next.alternates`)
        self._alternates: dict[str, dict[int, frozenset[str]]] = {}
        # node key → its rendezvous addresses, in its registration's order (warm targets)
        self._rendezvous_of: dict[str, tuple[str, ...]] = {}
        self._fetched_s = 0.0  # monotonic time of the last successful fetch
        self._tried_s: float | None = None  # monotonic time of the last fetch attempt
        self._miss_tried_s: float | None = None  # ... of the last one a miss made
        self._lock = asyncio.Lock()

    async def _refresh(self, *, older_than_s: float) -> None:
        """Read the view unless the last read (or failed try) is younger than `older_than_s`."""
        async with self._lock:
            now = self.clock()
            if self._tried_s is not None and now - self._tried_s < older_than_s:
                return  # someone fetched (or tried) while we waited, or too soon to ask again
            await self._fetch(now)

    async def _refresh_missed(self, asked_s: float) -> None:
        """Read the view for a miss asked about at `asked_s`, unless a read began since (it is
        as new as this one would be) or a miss made one less than `miss_refresh_s` ago."""
        async with self._lock:
            now = self.clock()
            if self._tried_s is not None and self._tried_s >= asked_s:
                return
            if self._miss_tried_s is not None and now - self._miss_tried_s < self.miss_refresh_s:
                return
            self._miss_tried_s = now
            await self._fetch(now)

    async def _fetch(self, now: float) -> None:
        """One read of the view (the caller holds the lock); a failure keeps the last one."""
        self._tried_s = now
        self.fetches += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                nodes = await read_nodes(
                    path_query(self.source.abci_query), model=self.model_hash, role="compute"
                )
        except (PlanetError, OSError, TimeoutError) as error:
            log.warning("next-hop view: committee query failed: %s", error)
            return
        self._view = registered_hops({"nodes": nodes})
        self._alternates = registered_hops({"nodes": nodes}, rendezvous=True)
        self._rendezvous_of = rendezvous_by_key(nodes)
        self._fetched_s = self.clock()

    def _allowed(self, hop: NextHop) -> bool:
        """`hop.url` is registered for `hop.shard`, and under the key the client names (the
        key this node will pin) when it names one; each alternate is registered for that shard
        and key too, as an endpoint or a rendezvous address (the parser lets alternates come
        only with a key)."""
        if self._view is None:
            return False
        keys = self._view.get(hop.url, {}).get(hop.shard)
        if keys is None or (hop.key is not None and hop.key not in keys):
            return False
        return all(self._registered_alternate(url, hop) for url in hop.alternates)

    def _registered_alternate(self, url: str, hop: NextHop) -> bool:
        for view in (self._alternates, self._view or {}):
            keys = view.get(url, {}).get(hop.shard)
            if keys is not None and hop.key in keys:
                return True
        return False

    async def next_shard_hops(self) -> list[tuple[str, str, tuple[str, ...]]]:
        """(URL, node key, its other addresses) of every node the view lists for the next
        shard whose address this policy dials, in a fixed order (the warm targets of
        node/server/link_pool.py). The other addresses are a node behind NAT's at its other
        rendezvous relays (https://, registered for that key, each one this policy dials: what
        an open's `next.alternates` may name), dialled when the URL is not reached. Refreshed
        first when the view is older than `max_age_s`."""
        if self._view is None or self.clock() - self._fetched_s > self.max_age_s:
            await self._refresh(older_than_s=self.miss_refresh_s)
        shard = self.own_shard + 1
        return sorted(
            (url, key, self._other_addresses(url, key))
            for url, by_shard in (self._view or {}).items()
            if address_refusal(url, self.public_only, self.private_ranges) is None
            for key in by_shard.get(shard, ())
        )

    def _other_addresses(self, url: str, key: str) -> tuple[str, ...]:
        if not url.startswith("https://"):  # only a pinned link may go to another address
            return ()
        return tuple(
            other
            for other in self._rendezvous_of.get(key, ())[:MAX_NEXT_ALTERNATES]
            if other != url
            and other.startswith("https://")
            and address_refusal(other, self.public_only, self.private_ranges) is None
        )

    def _check_address(self, url: str) -> None:
        refusal = address_refusal(url, self.public_only, self.private_ranges)
        ranges = ", ".join(str(r) for r in self.private_ranges)
        if refusal == "private":
            raise NextHopNotAllowedError(
                f"{url} is not a public address; a node on the committee policy dials only "
                "globally routable addresses (its operator can allow private ones with "
                "--private-next-hops on a devnet or LAN)"
            )
        if refusal == "host_name":
            raise NextHopNotAllowedError(
                f"{url} names a host; a node limited to the private ranges {ranges} dials IP "
                "addresses only"
            )
        if refusal == "outside_ranges":
            raise NextHopNotAllowedError(
                f"{url} is outside this node's private next-hop ranges ({ranges})"
            )

    async def check(self, hop: NextHop) -> None:
        asked_s = self.clock()  # a read begun from now on is as new as a miss could ask for
        _check_order(self.own_shard, hop)
        for url in hop.addresses:
            self._check_address(url)
        if self._view is None or self.clock() - self._fetched_s > self.max_age_s:
            await self._refresh(older_than_s=self.miss_refresh_s)
        if not self._allowed(hop):
            await self._refresh_missed(asked_s)
        if self._allowed(hop):
            return
        if self._view is None:
            raise NextHopNotAllowedError(
                f"cannot check {hop.url}: the committee chain did not answer; try again later"
            )
        keyed = "" if hop.key is None else f" under node key {hop.key[:16]}…"
        keys = self._view.get(hop.url, {}).get(hop.shard)
        if keys is None or (hop.key is not None and hop.key not in keys):
            raise NextHopNotAllowedError(
                f"{hop.url} is not a routable compute node of shard {hop.shard} of this model"
                f"{keyed} on the committee chain"
            )
        stray = next(url for url in hop.alternates if not self._registered_alternate(url, hop))
        raise NextHopNotAllowedError(
            f"{stray} (next.alternates) is not an address that node registered{keyed} for "
            f"shard {hop.shard} on the committee chain (its endpoint or a rendezvous address)"
        )


def build_policy(
    spec: NextHopSpec, own_shard: int, *, source: NodeSource | None = None, model_hash: str = ""
) -> NextHopPolicy:
    """The policy for `spec`; `committee` needs the committee RPC (`source`) and model hash."""
    if spec.mode == "none":
        return ForwardNone(own_shard)
    if spec.mode == "any":
        return ForwardAny(own_shard)
    if spec.mode == "list":
        return ForwardList(own_shard, spec.urls)
    if source is None or not model_hash:
        raise UsageError(
            "--next-hops committee needs the committee chain",
            hint="give --committee-rpc URL (planet join sets it)",
        )
    return ForwardCommittee(
        own_shard,
        source,
        model_hash,
        public_only=spec.public_only,
        private_ranges=spec.private_ranges,
    )
