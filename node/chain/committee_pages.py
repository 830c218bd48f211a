"""Read a paged committee list whole: follow `next` until the last page, within a bound.

Every committee list query a watcher, node or client relies on pages (`/mints`,
`/commitments`: an answer's `next` is the `after` of the next page, null on the last one), so
no list is cut short silently. `all_pages` follows them and raises `TooManyPages` rather than
act on a list it could not read to its end within `max_pages`; `read_pages` says whether it
got to the end, for a reader that may act on a first part (a work list ordered by priority).
`read_statements` reads `/payouts` so (the funder, the payout relay, the gateway's debit
tracker and `planet earnings` each say what they do when it does not end within the bound).
`read_nodes` reads `/nodes`, `read_reputations` `/reputations` and `read_prices` `/prices`
(registrations are free, so a stranger can make each long: every reader follows it to its end,
within its bound of pages, or fails by name). `path_query` makes
a `Query` of an RPC whose `abci_query` takes the whole path (`CommitteeRpc`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from protocol.errors import PlanetError
from protocol.fields import is_int

Query = Callable[..., Awaitable[Any]]


class TooManyPages(PlanetError):
    """A list did not end within the pages the reader allows itself."""

    code = "too_many_pages"


class BadPage(PlanetError):
    """A page that is not {<key>: [objects], next: string or null}."""

    code = "bad_page"


async def read_pages(
    query: Query, path: str, key: str, *, max_pages: int, **params: Any
) -> tuple[list[dict[str, Any]], bool]:
    """The items of the paged list `path` (under `key`) in page order, at most `max_pages`
    pages of them, and whether that was the whole list."""
    items: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(max_pages):
        page = await query(path, **params, **({} if after is None else {"after": after}))
        rows = page.get(key) if isinstance(page, dict) else None
        cursor = page.get("next") if isinstance(page, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise BadPage(f"{path}: a page without a list of {key}")
        if cursor is not None and (not isinstance(cursor, str) or cursor == after):
            raise BadPage(f"{path}: a page whose next is {ascii(cursor)[:80]}")
        items += rows
        if cursor is None:
            return items, True
        after = cursor
    return items, False


async def all_pages(
    query: Query, path: str, key: str, *, max_pages: int, **params: Any
) -> list[dict[str, Any]]:
    """Every item of the paged list `path`; `TooManyPages` when it does not end in time."""
    items, whole = await read_pages(query, path, key, max_pages=max_pages, **params)
    if not whole:
        raise TooManyPages(
            f"{path}: more than {max_pages} pages ({len(items)} {key} read)",
            hint="the list is longer than this reader follows; it is not acted on partly",
        )
    return items


def path_query(abci_query: Callable[[str], Awaitable[Any]]) -> Query:
    """A `Query` over `abci_query(path)`: the parameters become the path's query string (in the
    order given; `:` kept as is, so `/nodes?model=sha256:…` reads as it is written)."""

    async def query(path: str, **params: Any) -> Any:
        return await abci_query(path + ("?" + urlencode(params, safe=":") if params else ""))

    return query


# --- the node registry (`/nodes`, in key order) ---------------------------------------------

NODE_PAGES = 100  # pages of `/nodes` a reader follows (the committee lists 1 000 keys a page)


async def read_nodes(
    query: Query, *, max_pages: int = NODE_PAGES, **filters: Any
) -> list[dict[str, Any]]:
    """Every `/nodes` entry matching `filters` (`model`, `role`, `shard`, `status`), every page
    followed; `BadPage` for a page that is not a node list or leaves key order (a node at or
    before the page's `after`, a `next` not past `after` or before a node of its page: no node
    is read twice, no cursor goes back), `TooManyPages` past `max_pages` (a registry too long
    to read is not acted on partly)."""
    ordered = in_key_order(query, "nodes", lambda row: row.get("key"))
    return await all_pages(ordered, "/nodes", "nodes", max_pages=max_pages, **filters)


def in_key_order(query: Query, key: str, key_of: Callable[[dict[str, Any]], Any]) -> Query:
    """`query`, its pages held to key order: `BadPage` for a row (under `key`) whose key
    (`key_of`; rows without a string key are left to `read_pages`' checks) is at or before the
    page's `after`, or a `next` not past `after` or before a row of its page."""

    async def ordered(path: str, **params: Any) -> Any:
        page = await query(path, **params)
        after = params.get("after", "")
        rows = page.get(key) if isinstance(page, dict) else None
        keys = [key_of(r) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        keys = [k for k in keys if isinstance(k, str)]
        if any(k <= after for k in keys):
            raise BadPage(f"{path}: a page after {ascii(after)[:80]} lists a row at or before it")
        cursor = page.get("next") if isinstance(page, dict) else None
        if isinstance(cursor, str) and (cursor <= after or any(k > cursor for k in keys)):
            raise BadPage(f"{path}: a page whose next {ascii(cursor)[:80]} does not move on")
        return page

    return ordered


# --- reputations (`/reputations`, by node key) -------------------------------------------------

REPUTATION_PAGES = 100  # pages of `/reputations` a reader follows (1 000 records a page)


async def read_reputations(
    query: Query, *, max_pages: int = REPUTATION_PAGES
) -> dict[str, dict[str, Any]]:
    """Every `/reputations` record as {node key: record}, every page followed (`reputations`
    is an object of objects on each page); `BadPage` for a page that is not one or leaves key
    order, `TooManyPages` past `max_pages`."""

    async def as_rows(path: str, **params: Any) -> Any:
        page = await query(path, **params)
        records = page.get("reputations") if isinstance(page, dict) else None
        if not isinstance(records, dict) or not all(isinstance(r, dict) for r in records.values()):
            raise BadPage(f"{path}: a page without an object of reputation records")
        return {**page, "reputations": [{**r, "key": k} for k, r in records.items()]}

    ordered = in_key_order(as_rows, "reputations", lambda row: row.get("key"))
    rows = await all_pages(ordered, "/reputations", "reputations", max_pages=max_pages)
    return {row["key"]: {k: v for k, v in row.items() if k != "key"} for row in rows}


# --- prices (`/prices`, by node then shard) ----------------------------------------------------

PRICE_PAGES = 100  # pages of `/prices` a reader follows (1 000 records a page)


def price_row_key(row: dict[str, Any]) -> str | None:
    """The committee's key of a `/prices` row (`<node>/<shard, 5 digits>`), None without one."""
    node, shard = row.get("node"), row.get("shard")
    if not isinstance(node, str) or not is_int(shard, 0, 99_999):
        return None
    return f"{node}/{shard:05d}"


async def read_prices(
    query: Query, *, max_pages: int = PRICE_PAGES, **filters: Any
) -> list[dict[str, Any]]:
    """Every `/prices` row matching `filters` (`model`, `node`), every page followed; `BadPage`
    for a page that is not a list of rows or leaves key order, `TooManyPages` past
    `max_pages`."""
    ordered = in_key_order(query, "prices", price_row_key)
    return await all_pages(ordered, "/prices", "prices", max_pages=max_pages, **filters)


# --- the stored payout statements (`/payouts`, newest first) --------------------------------

STATEMENT_PAGES = 64  # pages of `/payouts` a reader follows a pass (pruned by retention_epochs)
STATEMENT_PAGE_SIZE = 1000  # statements a page lists (the committee's most)
MAX_STATEMENT = (1 << 63) - 1  # a statement number (committee epoch + page · 2^32)
MAX_EPOCH_PAGES = 1 << 31  # a statement's `pages`


@dataclass(frozen=True, slots=True)
class ListedStatement:
    """One stored payout statement as `/payouts` lists it: its number and how many pages its
    committee epoch closed into (the summary's other fields in `summary`)."""

    number: int
    pages: int
    summary: dict[str, Any]


async def read_statements(
    query: Query,
    *,
    max_pages: int = STATEMENT_PAGES,
    page_size: int = STATEMENT_PAGE_SIZE,
    **params: Any,
) -> tuple[list[ListedStatement], bool]:
    """The stored payout statements, every page of `/payouts` followed (newest first), at most
    `max_pages` pages, and whether that was all of them. A summary without its numbers is a
    `BadPage` (nothing of the listing is acted on)."""
    rows, whole = await read_pages(
        query, "/payouts", "epochs", max_pages=max_pages, limit=page_size, **params
    )
    listed: list[ListedStatement] = []
    for row in rows:
        number, pages = row.get("epoch"), row.get("pages")
        if not is_int(number, 1, MAX_STATEMENT) or not is_int(pages, 1, MAX_EPOCH_PAGES):
            raise BadPage(f"/payouts: a statement {ascii(row)[:120]} without its numbers")
        listed.append(ListedStatement(number, pages, row))
    return listed, whole
