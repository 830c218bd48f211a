"""Per-hop session capabilities: each node of a circuit gets its own secret, and only its own.

The client draws one random session secret per generation (`new_session_id`); it never leaves
the client. The capability it sends to hop i is

    base64url(HMAC-SHA256(secret, "planet/hop-capability/v1" 0x00 i 0x00 shard 0x00 url))

(43 characters, 256 bits, no padding). A node holds only its own capability: HMAC outputs of one
hop say nothing about another's, and without the secret no one can compute any. A node keys its
session by `session_tag(capability)` (protocol/frames/sessions.py), so every read-through and
close needs the capability itself. Deterministic derivation keeps what later work needs:
- failover: a replacement node for hop i has another url, so it gets a fresh capability from the
  same secret; the client replays the session's positions to it;
- commitments: the client can name any hop's session by its public tag (`hop_tags`) to a
  verifier, without handing out the power to act on it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from protocol.frames.sessions import check_session_id, session_tag

_DOMAIN = b"planet/hop-capability/v1"
_FEED_DOMAIN = b"planet/hop-feed/v1"
_PREFIX_DOMAIN = b"planet/hop-prefix-salt/v1"


def new_session_id() -> str:
    """A fresh session secret: 256 bits, URL-safe. Keep it on the client."""
    return secrets.token_urlsafe(32)


def _derive(domain: bytes, secret: str, index: int, shard: int, url: str) -> str:
    key = check_session_id(secret).encode()
    message = b"\x00".join((domain, str(index).encode(), str(shard).encode(), url.encode()))
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def hop_capability(secret: str, index: int, shard: int, url: str) -> str:
    """The capability that hop `index` (serving `shard` at `url`) gets for this session."""
    return _derive(_DOMAIN, secret, index, shard, url)


def hop_feed(secret: str, index: int, shard: int, url: str) -> str:
    """The feed token of hop `index` of a circuit (protocol/stream.py): what its upstream node
    presents to append positions. Known to hop `index` and its upstream only; it cannot read
    an output, open or close the session (those need the capability)."""
    return _derive(_FEED_DOMAIN, secret, index, shard, url)


def hop_tag(secret: str, index: int, shard: int, url: str) -> str:
    """The public tag of hop `index`'s session (what the node keys and logs it by)."""
    return session_tag(hop_capability(secret, index, shard, url))


def hop_prefix_salt(isolation: str, shard: int, url: str) -> str:
    """The prefix-cache salt a client that asks for isolation sends in its `open` to the node
    serving `shard` at `url` (protocol/stream.py, docs/privacy.md). `isolation` is the user's
    own long-lived secret (not a session's): its sessions on that node share cached prompt
    blocks with each other and with nobody else, and no two nodes see the same salt."""
    return _derive(_PREFIX_DOMAIN, isolation, 0, shard, url)
