"""Dialling addresses that strangers name: never follow a redirect.

A node's registered endpoint, a circuit's next hop and the URLs a client names are chosen by
someone else. Whatever address policy a dialler applies (node/server/next_hops.py: public
addresses only under the committee policy) checks the URL it was given; a `30x` answer would
make aiohttp dial the `Location` instead — any host, loopback and private services included —
behind the policy's back (`ws_connect` has no switch for it). So every client session that
dials such URLs carries `refuse_redirects`: a redirect answer becomes `RedirectRefused` (an
`aiohttp.ClientResponseError`, so existing `aiohttp.ClientError` handling treats it as a failed
dial) and its target is never contacted.

    http = aiohttp.ClientSession(middlewares=(refuse_redirects,), ...)

A node behind NAT may be reached at several addresses (one per relay that fronts it):
`first_reachable` dials them in turn within one time bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import aiohttp

log = logging.getLogger(__name__)

REDIRECTS = frozenset({301, 302, 303, 307, 308})  # the answers aiohttp would follow


class RedirectRefused(aiohttp.ClientResponseError):
    """A peer answered with a redirect; it is not followed."""


async def refuse_redirects(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """Client middleware: a redirect answer fails the request instead of being followed."""
    response = await handler(request)
    if response.status in REDIRECTS:
        response.close()
        raise RedirectRefused(
            response.request_info,
            (),
            status=response.status,
            message=f"{request.url.origin()} answered a redirect; redirects are not followed",
        )
    return response


FALLBACK_ERRORS: Final = (aiohttp.ClientError, OSError, TimeoutError)
T = TypeVar("T")


async def first_reachable(
    urls: Sequence[str],
    attempt: Callable[[str], Awaitable[T]],
    *,
    total_s: float,
    each_s: float | None = None,
    what: str = "node",
    errors: tuple[type[BaseException], ...] = FALLBACK_ERRORS,
) -> tuple[str, T]:
    """`attempt(url)` for each of a node's addresses in turn — its registered endpoint first,
    then the other relays that front it (register_node `rendezvous`; docs/overlay.md, *NAT
    rendezvous*) — until one succeeds, all within `total_s`: each try gets an equal share of
    the time left, so a quick refusal leaves more to the next — or, with `each_s`, at most
    `each_s` (a probe whose bound is the same at every address: the first address of a node
    behind NAT gets what a node with one address gets). (the address used, its result);
    logs which one when it is not the first. When every try fails (with one of `errors`), the
    first address's error is raised: what a caller dialling only the endpoint would have seen.
    An error outside `errors` (a named refusal the caller raises itself) ends the tries."""
    if not urls:
        raise ValueError("first_reachable: no address to dial")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + total_s
    failed: list[tuple[str, BaseException]] = []
    for index, url in enumerate(urls):
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            share = left / (len(urls) - index) if each_s is None else min(left, each_s)
            async with asyncio.timeout(share):
                result = await attempt(url)
        except errors as error:
            failed.append((url, error))
            if len(urls) > 1:
                log.info(
                    "%s not reached at %s (%s)%s",
                    what,
                    url,
                    type(error).__name__,
                    "; trying its next address" if index + 1 < len(urls) else "",
                )
            continue
        if failed:
            log.warning(
                "%s reached at %s, its address %d of %d (not reached at %s)",
                what,
                url,
                index + 1,
                len(urls),
                ", ".join(u for u, _ in failed),
            )
        return url, result
    if failed:
        raise failed[0][1]
    raise TimeoutError(f"{what}: no time left to dial {urls[0]}")
