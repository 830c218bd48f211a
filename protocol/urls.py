"""One canonical form for a node's base URL, so that an allow-list compares like with like.

    canonical_url(" HTTP://Node.Example.:80/ ")  -> refused (whitespace)
    canonical_url("HTTP://Node.Example.:80/")    -> "http://node.example:80"
    canonical_url("https://[2001:DB8::0001]")    -> "https://[2001:db8::1]:443"

Grammar (ASCII only, nothing else accepted):

    url    = scheme "://" host [ ":" port ] [ "/" ]
    scheme = "http" | "https"                      case-insensitive
    host   = name | ipv4 | "[" ipv6 "]"
    name   = label *( "." label ) [ "." ]          label: 1-63 of [A-Za-z0-9-], no "-" at either
                                                   end; one trailing dot (the DNS root) is dropped
    ipv4   = four decimal octets 0-255, no leading zeros
    ipv6   = an IPv6 address without a zone id, written back compressed, lower-case
    port   = 1-5 ASCII digits, no leading zero, 1..65535   absent: 80 (http), 443 (https)

Refused: user info (`user@`), percent-escapes, query, fragment, any path but "/", whitespace or
control characters, non-ASCII (IDNA) names, and host names that the C resolver would read as an
IPv4 address in another spelling (`127.1`, `0x7f.0.0.1`, `2130706433`, `0177.0.0.1`): those
would reach an address the list never named.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Final

from protocol.errors import ProtocolError

MAX_URL_CHARS: Final = 300
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_URL_RE = re.compile(
    r"(?P<scheme>[A-Za-z]{4,5})://"
    r"(?:\[(?P<ip6>[0-9A-Fa-f:.]{2,45})\]|(?P<name>[A-Za-z0-9.\-]{1,254}))"
    r"(?::(?P<port>[1-9][0-9]{0,4}))?/?"
)
_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?")
# every label digits or a 0x-number: the resolver (inet_aton) reads such a name as an address
_NUMERIC_HOST_RE = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+))*")


class BadUrlError(ProtocolError):
    """A node URL outside the canonical grammar (protocol/urls.py)."""

    code = "bad_url"
    http_status = 400


def _host(name: str | None, ip6: str | None) -> str:
    if ip6 is not None:
        try:
            address = ipaddress.IPv6Address(ip6)
        except ValueError:
            raise BadUrlError(f"[{ip6}] is not an IPv6 address") from None
        return f"[{address.compressed}]"
    if name is None:  # the regex matches one of the two alternatives
        raise BadUrlError("a URL needs a host")
    host = name.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        raise BadUrlError("the host name must be 1-253 characters")
    if _NUMERIC_HOST_RE.fullmatch(host):
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            raise BadUrlError(
                f"{name!r} is not a dotted-quad IPv4 address (four decimal octets)"
            ) from None
        return str(address)
    if not all(_LABEL_RE.fullmatch(label) for label in host.split(".")):
        raise BadUrlError(
            f"{name!r} is not a host name (labels of letters, digits and inner hyphens)"
        )
    return host


def canonical_url(value: Any) -> str:
    """`scheme://host:port` in the one form this project compares, or BadUrlError."""
    if not isinstance(value, str):
        raise BadUrlError("a URL must be a string")
    if len(value) > MAX_URL_CHARS:
        raise BadUrlError(f"a URL is at most {MAX_URL_CHARS} characters")
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        raise BadUrlError("a URL is printable ASCII without whitespace")
    match = _URL_RE.fullmatch(value)
    if match is None:
        raise BadUrlError(
            f"{value[:80]!r} is not http(s)://host[:port] (no user, path, query or escapes)"
        )
    scheme = match["scheme"].lower()
    if scheme not in DEFAULT_PORTS:
        raise BadUrlError(f"scheme {scheme!r}: only http and https")
    host = _host(match["name"], match["ip6"])
    port = int(match["port"]) if match["port"] is not None else DEFAULT_PORTS[scheme]
    if not 1 <= port <= 65535:
        raise BadUrlError(f"port {port} is outside 1..65535")
    return f"{scheme}://{host}:{port}"


__all__ = ["MAX_URL_CHARS", "BadUrlError", "canonical_url"]
