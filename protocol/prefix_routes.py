"""Prefix routes: the compact summary of prompt prefixes a node's prefix cache holds, and how a
client matches a prompt against it to route a question to a node that holds its prefix
(issue 44; node/server/prefix_cache.py, docs/compute.md *Prefix cache*).

A node never sees token ids (it receives activations), so the keys come from the client: with
a node's public route salt (16 random bytes per node process, in its /info) and the circuit's
hops before it, the key of the prompt's first k blocks of `BLOCK_POSITIONS` tokens is

    key_k = sha256(DOMAIN ‖ salt ‖ for each upstream hop: len(url) u16 ‖ url
                   ‖ ids[0 : 16·k] as u32 big-endian)[:8]          (16 lower-case hex)

The upstream hops are part of the key because a later hop reuses a block only when its inputs
are byte-identical, i.e. when the same upstream nodes computed them. The client sends the keys
of its prompt (at most `MAX_OPEN_ROUTES`) in the `open` (`route`, protocol/stream.py); the node
ties each to the cached block its session reached and advertises the keys of blocks it still
holds (at most `MAX_ADVERTISED`, most recently used first) as

    /info "prefix_routes": {"salt": 32 hex, "block_positions": 16, "keys": [16 hex, ...]} | null

Keys are truncated salted hashes: a summary names no prompt, and the salt differs per node.
They are hints, never trusted for correctness (a hit needs the node's own chain over its inputs
to match): a summary that lies costs its node only traffic it then serves cold. A summary out
of shape (not that object, a bad salt, another block size, over `MAX_ADVERTISED` keys, a key
that is not 16 lower-case hex, duplicates) is refused as `bad_prefix_summary`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from protocol.errors import ProtocolError

DOMAIN: Final = b"planet/prefix-route/v1"
BLOCK_POSITIONS: Final = 16  # the node's prefix-cache block (node/server/prefix_cache.py)
KEY_BYTES: Final = 8
SALT_BYTES: Final = 16
MAX_OPEN_ROUTES: Final = 64  # keys one open may carry: 1,024 positions of prefix
MAX_ADVERTISED: Final = 256  # keys one summary may list
MAX_URL_BYTES: Final = 2048
_KEY_RE = re.compile(rf"[0-9a-f]{{{2 * KEY_BYTES}}}")
_SALT_RE = re.compile(rf"[0-9a-f]{{{2 * SALT_BYTES}}}")
_FIELDS: Final = frozenset({"salt", "block_positions", "keys"})


class BadPrefixSummaryError(ProtocolError):
    """A node's prefix-route summary is not of the documented shape (or over its bounds)."""

    code = "bad_prefix_summary"


class BadRouteKeysError(ProtocolError):
    """An open's `route` is not a list of at most MAX_OPEN_ROUTES keys of 16 lower-case hex
    (protocol/stream.py refuses the open `bad_control` with this message)."""


@dataclass(frozen=True, slots=True)
class PrefixRoutes:
    salt: str  # 32 lower-case hex
    keys: frozenset[str]


def is_route_key(value: Any) -> bool:
    return isinstance(value, str) and _KEY_RE.fullmatch(value) is not None


def check_route_keys(value: Any) -> tuple[str, ...]:
    """An open's `route` field, parsed (BadRouteKeysError otherwise)."""
    if not isinstance(value, list) or len(value) > MAX_OPEN_ROUTES:
        raise BadRouteKeysError(f"route must be a list of at most {MAX_OPEN_ROUTES} keys")
    if not all(is_route_key(key) for key in value):
        raise BadRouteKeysError(f"route keys must be {2 * KEY_BYTES} lower-case hex characters")
    return tuple(value)


def parse_prefix_routes(value: Any) -> PrefixRoutes | None:
    """A node's /info `prefix_routes`: None (no prefix cache), else the summary, else
    BadPrefixSummaryError naming what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _FIELDS:
        raise BadPrefixSummaryError("prefix_routes must be null or {salt, block_positions, keys}")
    salt, block, keys = value["salt"], value["block_positions"], value["keys"]
    if not isinstance(salt, str) or not _SALT_RE.fullmatch(salt):
        raise BadPrefixSummaryError(f"prefix_routes.salt must be {2 * SALT_BYTES} lower-case hex")
    if type(block) is not int or block != BLOCK_POSITIONS:
        raise BadPrefixSummaryError(f"prefix_routes.block_positions must be {BLOCK_POSITIONS}")
    if not isinstance(keys, list) or len(keys) > MAX_ADVERTISED:
        raise BadPrefixSummaryError(f"prefix_routes.keys: a list of at most {MAX_ADVERTISED}")
    if not all(is_route_key(key) for key in keys):
        raise BadPrefixSummaryError(f"prefix_routes.keys: each {2 * KEY_BYTES} lower-case hex")
    if len(set(keys)) != len(keys):
        raise BadPrefixSummaryError("prefix_routes.keys lists a key twice")
    return PrefixRoutes(salt=salt, keys=frozenset(keys))


def route_keys(
    salt: str, upstream: Sequence[str], ids: Sequence[int], limit: int = MAX_OPEN_ROUTES
) -> list[str]:
    """The keys of the prompt `ids`'s first 1, 2, … full blocks (at most `limit`) for the node
    whose route salt is `salt`, behind the hops at `upstream` (their URLs, in circuit order)."""
    digest = hashlib.sha256(DOMAIN + bytes.fromhex(salt))
    for url in upstream:
        raw = url.encode("utf-8")[:MAX_URL_BYTES]
        digest.update(len(raw).to_bytes(2, "big") + raw)
    keys = []
    for k in range(min(len(ids) // BLOCK_POSITIONS, limit)):
        block = ids[k * BLOCK_POSITIONS : (k + 1) * BLOCK_POSITIONS]
        digest.update(b"".join(int(token).to_bytes(4, "big") for token in block))
        keys.append(digest.copy().digest()[:KEY_BYTES].hex())
    return keys


def matched_blocks(routes: PrefixRoutes | None, keys: Sequence[str]) -> int:
    """How many leading blocks of a prompt (its `route_keys` for that node) the node holds."""
    if routes is None:
        return 0
    for count in range(len(keys), 0, -1):
        if keys[count - 1] in routes.keys:
            return count
    return 0
