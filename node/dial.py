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
"""

from __future__ import annotations

import aiohttp

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
