"""What a client pays a node: the price it registered on the committee chain, checked against
what its `/info` asks (abci_app/prices.py; docs/committee.md, *Prices*).

    chain_price(entry, shard)            a `/nodes` entry's registered price on `shard`
                                         (None: none, or malformed)
    price_trusted(registered, advertised)
                                         may a node asking `advertised` be paid `registered`?
    prices = await read_chain_prices(committee_rpc, model_hash, hops)
                                         {hop URL: its registered price (None: none)} for the
                                         hops of a nodes file (`planet ask --committee-rpc`)

The gateway's router reads the same `/nodes` entries (node/gateway/router.py); `planet ask`
over a nodes file reads them when it knows the committee (its `--committee-rpc`, or the nodes
file's `committee_rpc`). A hop is matched to its entry by the node key the nodes file gives,
else by its endpoint; one the chain does not list, or lists without a price on the hop's
shard, has none: the chain redeems nothing there, so no client pays it (`price_unregistered`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from node.client.types import Hop, payee

MAX_PRICE = 2**31  # positions per credit, exclusive (protocol.committee.prices)


def chain_price(entry: dict[str, Any], shard: int) -> int | None:
    """The price a `/nodes` entry's node registered for `shard` this epoch (its `prices`;
    None when it registered none, or the entry's is malformed: the chain pays it nothing)."""
    prices = entry.get("prices")
    price = prices.get(str(shard)) if isinstance(prices, dict) else None
    return price if type(price) is int and 0 <= price < MAX_PRICE else None


def price_trusted(registered: int | None, advertised: Any) -> bool:
    """Whether a node whose /info asks `advertised` positions per credit can be paid at its
    `registered` price: both free, or both charging and the node granting at least the
    registered positions per credit (a price cut waiting for the next epoch grants more; a
    node asking more credits than registered — a raise it charges before the chain counts
    it — would stop every session paid at the chain's price). A charging node follows the
    chain's price itself (node/server/chain_price.py), so its /info says the registered one.
    No registered price (None): the chain redeems nothing there (REDEMPTION_UNPRICED,
    abci_app/prices.py), so only a node that asks nothing is used — free, never paid."""
    if type(advertised) is not int or not 0 <= advertised < MAX_PRICE:
        return False
    if registered is None:
        return advertised == 0
    if registered == 0 or advertised == 0:
        return registered == advertised
    return advertised >= registered


def _origin(url: Any) -> str | None:
    """scheme://host:port of `url`, lowercased (None: not an http(s) URL with a port)."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


def prices_for(entries: Iterable[Any], hops: Sequence[Hop]) -> dict[str, int | None]:
    """{hop URL: the registered price of its node on its shard, None when it has none}."""
    by_key: dict[str, dict[str, Any]] = {}
    by_endpoint: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("key"), str):
            by_key[entry["key"].lower()] = entry
        endpoint = _origin(entry.get("endpoint"))
        if endpoint is not None:
            by_endpoint[endpoint] = entry
    out: dict[str, int | None] = {}
    for hop in hops:
        entry = by_key.get(hop.key.lower()) if hop.key else by_endpoint.get(_origin(hop.url) or "")
        shards = entry.get("shards") if entry is not None else None
        for shard in hop.span:  # a span hop is priced per shard (`payee`: URL#shard-K)
            name = hop.url if hop.span.size == 1 else payee(hop.url, shard)
            serves = isinstance(shards, list) and shard in shards
            out[name] = chain_price(entry, shard) if entry is not None and serves else None
    return out


async def read_chain_prices(
    committee_rpc: str, model_hash: str, hops: Sequence[Hop]
) -> dict[str, int | None]:
    """`prices_for` the committee's `/nodes?model=&role=compute`, every page (PlanetError when
    it does not answer, or a page is malformed: `BadPage`)."""
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp
    from node.chain.committee_pages import read_nodes

    link = CommitteeLink([committee_rpc])
    try:
        nodes = await read_nodes(link.query, model=model_hash, role="compute")
    finally:
        await link.close()
    return prices_for(nodes, hops)
