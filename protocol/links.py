"""Which links are encrypted, and whom they prove: a node's URL and its registered node key.

Every link to a node (client → node, node → next hop, a gateway's or a verifier's requests,
an agent's checks of its own node) goes to a base URL in canonical form (protocol/urls.py):

    https://host:port   TLS 1.3; the node's certificate key IS its ed25519 node key (the key
                        registered on the committee chain), and the dialer pins it: the link
                        is used only if the handshake proved that key (node/links.py)
    http://host:port    plaintext: only to a loopback address (the bytes never leave the
                        machine) or where the dialer runs in an explicit local mode
                        (`--plaintext-links`); anything else is refused by name

The key travels next to the URL, never inside it: a circuit hop, a next hop in an `open`, a
nodes-file entry and a committee registration each carry `url` and `key` (64 lower-case hex).
An https URL without a key cannot be dialled (nothing to pin).

    ProtocolError (protocol.errors)
    └── FrameError (protocol.frames.errors)
        ├── NodeKeyMismatchError  node_key_mismatch  the peer proved another key (or none)
        ├── PlaintextLinkError    plaintext_link     an http:// link outside loopback/local mode
        └── MissingNodeKeyError   missing_node_key   an https:// link with no key to pin

They are FrameErrors so that a node refuses an `open` whose next hop fails them by name on the
client's link, like any other refusal of the control protocol (protocol/stream.py).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Final

from protocol.frames.errors import FrameError
from protocol.urls import BadUrlError

NODE_KEY_HEX: Final = 64
_KEY_RE = re.compile(r"[0-9a-f]{64}\Z")


class NodeKeyMismatchError(FrameError):
    """The node at `url` did not prove the expected node key in its TLS handshake."""

    code = "node_key_mismatch"
    http_status = 502

    def __init__(self, url: str, expected: str, got: str | None) -> None:
        shown = "no ed25519 node key" if got is None else f"node key {got[:16]}…"
        super().__init__(
            f"{url} presented {shown}, expected node key {expected[:16]}… (registered for it): "
            "refused, nothing was sent",
            hint="the node at that address is not the one registered there (moved, replaced, "
            "or someone in between); pick another node",
        )
        self.url = url
        self.expected = expected
        self.got = got


class PlaintextLinkError(FrameError):
    """An http:// link to a host that is not loopback, outside an explicit local mode."""

    code = "plaintext_link"
    http_status = 403

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url} is a plaintext (http://) link to a non-loopback host: refused, anyone on "
            "the path could read and rewrite it",
            hint="use the node's https:// URL and its node key, or run in local mode "
            "(--plaintext-links) on a network you own",
        )
        self.url = url


class MissingNodeKeyError(FrameError):
    """An https:// link without the node key to pin."""

    code = "missing_node_key"

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url} is an https:// link but no node key was given to pin",
            hint="give the node's registered key (64 hex) with its URL",
        )
        self.url = url


def check_node_key(value: Any) -> str:
    """A node key as 64 lower-case hex characters, or ValueError."""
    if not isinstance(value, str) or not _KEY_RE.match(value):
        raise ValueError("a node key is 64 lower-case hex characters")
    return value


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_encrypted(url: str) -> bool:
    """Whether a URL is dialled over TLS (its scheme is https, in any case)."""
    return _scheme(url) == "https"


def is_loopback_host(host: str) -> bool:
    """Whether a host (an IPv6 literal with or without brackets) is a loopback IP literal
    (127/8, ::1); a name is not (it could resolve anywhere)."""
    if host.startswith("["):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(url: str) -> bool:
    """Whether a canonical URL's host is a loopback IP literal."""
    return is_loopback_host(url.split("://", 1)[-1].rsplit(":", 1)[0])


def check_link(url: str, key: str | None, *, plaintext_ok: bool) -> str | None:
    """The node key to pin for a link to `url` (None: plaintext), or the named refusal.
    `plaintext_ok`: the dialer runs in an explicit local mode (http:// anywhere)."""
    scheme = _scheme(url)
    if scheme == "https":
        if key is None:
            raise MissingNodeKeyError(url)
        return key
    if scheme != "http":
        raise BadUrlError(f"{url[:80]!r}: a node link is http:// or https://")
    if not (plaintext_ok or is_loopback(url)):
        raise PlaintextLinkError(url)
    return None


__all__ = [
    "NODE_KEY_HEX",
    "MissingNodeKeyError",
    "NodeKeyMismatchError",
    "PlaintextLinkError",
    "check_link",
    "check_node_key",
    "is_encrypted",
    "is_loopback",
    "is_loopback_host",
]
