"""The personal client's door: only its user's own tools get in (issue 42, attack 6).

The personal client spends the user's credits on every question, and it listens on loopback,
which every web page the user opens can reach (a cross-site "simple" POST needs no CORS
preflight; DNS rebinding makes a page's own origin resolve to 127.0.0.1). So every request,
in this order, must:

1. name a `Host` the client serves: a loopback name (`localhost`, `127.0.0.1`, `[::1]`) or the
   address it is bound to, with the port the connection came in on (a bare name only on port
   80). A rebound name (`evil.example:8001`) is refused: 403 `host_not_allowed`;
2. carry no `Origin`, or its own (`http://<that Host>`): a page on another origin, or an opaque
   one (`null`), is refused: 403 `origin_not_allowed`;
3. carry `Authorization: Bearer <token>` (node/gateway/personal_token.py): 401 `token_missing`
   without one, 401 `token_invalid` with another (compared in constant time).

Bodies must be `application/json` (415 `unsupported_media_type`: node/gateway/app.py, for the
hosted gateway too), which no cross-site form or simple request can send without a preflight.
Each refusal is OpenAI's error shape (node/gateway/errors.py) and nothing is served.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from node.gateway.errors import Forbidden, Unauthorized

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_HOST = re.compile(
    r"(?P<name>\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.-]{1,253})(?::(?P<port>[0-9]{1,5}))?\Z"
)


def personal_guard(token: str, bound_host: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The middleware for a personal client bound to `bound_host` that answers `token` only."""
    names = LOOPBACK_NAMES | {_bare(bound_host).lower()}
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = _checked_host(request, names)
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            raise Forbidden(
                "origin_not_allowed",
                f"requests from the web origin {origin[:100]!r} are refused: the personal "
                "client answers its user's own tools only, not web pages",
            )
        authorization = request.headers.get("Authorization")
        if not authorization:
            raise Unauthorized(
                "token_missing",
                "the personal client needs its token: send Authorization: Bearer <token> "
                "(the openai client's api_key); it is in the token file the client printed "
                "at its first start (<PLANET_HOME>/personal-token)",
            )
        if not hmac.compare_digest(authorization.encode("utf-8", "replace"), expected):
            raise Unauthorized(
                "token_invalid",
                "the bearer token is not this personal client's (see its token file, "
                "<PLANET_HOME>/personal-token, or --token-file)",
            )
        return await handler(request)

    return guard


def _checked_host(request: web.Request, names: frozenset[str]) -> str:
    """The request's Host header when it names this client (403 `host_not_allowed` else)."""
    raw = request.headers.get("Host", "")
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None
    match = _HOST.match(raw)
    if match is not None:
        given = int(match["port"]) if match["port"] else 80
        if given == port and _bare(match["name"]).lower() in names:
            return raw
    raise Forbidden(
        "host_not_allowed",
        f"the Host {raw[:100]!r} is not this personal client's: it answers "
        f"http://127.0.0.1:{port} (or localhost) only, so a web page cannot reach it "
        "under a name of its own (DNS rebinding)",
    )


def _bare(host: str) -> str:
    """`[::1]` → `::1`; a name or IPv4 address as it is (IPv6 in its compressed form)."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text
