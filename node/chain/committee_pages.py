"""Read a paged committee list whole: follow `next` until the last page, within a bound.

Every committee list query a watcher, node or client relies on pages (`/mints`,
`/commitments`: an answer's `next` is the `after` of the next page, null on the last one), so
no list is cut short silently. `all_pages` follows them and raises `TooManyPages` rather than
act on a list it could not read to its end within `max_pages`; `read_pages` says whether it
got to the end, for a reader that may act on a first part (a work list ordered by priority).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from protocol.errors import PlanetError

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
