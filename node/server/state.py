"""What one node process holds while it serves: the shard, its sessions, the compute queue,
the downstream links of its streams, and counters. Shared by the app's handlers and streams."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from node.server.backend import ShardBackend, served_span
from node.server.batcher import Batcher
from node.server.config import ServerConfig
from node.server.sessions import SessionStore
from protocol.errors import PlanetError

log = logging.getLogger(__name__)


class ComputeError(PlanetError):
    """The shard failed on a valid frame; the session is dropped (its cache may be partial)."""

    code = "compute_failed"
    http_status = 500


@dataclass
class NodeState:
    backend: ShardBackend
    store: SessionStore
    max_tokens_per_frame: int  # most positions one frame may carry (a prefill chunk)
    executor: ThreadPoolExecutor
    batcher: Batcher
    started_s: float = field(default_factory=time.monotonic)
    # this process's id in /info: counters (load.tokens) start at 0 in a new one
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    in_flight: int = 0
    peer_in_flight: dict[str, int] = field(default_factory=dict)
    # the assignment party credits paid to this node must name (protocol/committee/credit_holder.py
    # `node_party`: its committee key, model hash, shard); None: no node key, none checked
    credit_party: bytes | None = None
    # a span hop's: the party of each of its shards (its credits are assigned per shard)
    credit_parties: dict[int, bytes] = field(default_factory=dict)
    node_key: str | None = None  # its committee (and TLS) key, 64 hex: /info `node_key`
    forwards: int = 0
    # streams (node/server/stream.py)
    routes_by_feed: dict[str, Any] = field(default_factory=dict)  # feed tag -> Route
    # attaches that arrived before the client's open of this hop: feed tag -> their futures
    feed_waiters: dict[str, list[Any]] = field(default_factory=dict)
    links: Any = None  # LinkPool (link_pool.py), created with the app's client session
    next_hops: Any = None  # NextHopPolicy (node/server/next_hops.py): asked before any dial
    streams: set[Any] = field(default_factory=set)  # accepted WebSockets (closed on shutdown)
    stream_bytes_in: int = 0  # WebSocket bytes received on streams (framing included)
    stream_bytes_out: int = 0  # WebSocket bytes sent on streams (framing included)
    stream_bytes_forwarded: int = 0  # of which to the next hop (frames)
    tokens: int = 0  # positions run through this shard's layers (the node's own work count)
    # Called after each successful forward with (session tag, positions, inputs, outputs), on
    # the event loop; a failing hook is logged and never fails the forward. Used by the served
    # log (commit-reveal, node/server/served.py) and spot-check tickets (node/server/tickets.py).
    forward_hooks: list[Callable[[str, np.ndarray, np.ndarray, np.ndarray], None]] = field(
        default_factory=list
    )
    served: Any = None  # node.server.served.ServedLog with --commit-dir (install_served)
    # a span hop (node/server/span_backend.py): hooks per shard of the span, called after each
    # forward with that shard's own (tag, positions, inputs, outputs), as a single-shard node
    # calls its `forward_hooks` (the per-shard served logs and ticket books: a span commits
    # each shard's work as that shard, docs/compute.md *Span hops*)
    stage_hooks: dict[int, list[Callable[[str, np.ndarray, np.ndarray, np.ndarray], None]]] = field(
        default_factory=dict
    )
    served_by_shard: dict[int, Any] = field(default_factory=dict)  # a span's ServedLog per shard
    payments: Any = None  # node.server.payments.Payments with --credit-positions (paid work)
    prefix: Any = None  # node.server.prefix_cache.PrefixCache with prefix_cache_bytes > 0
    # the client head a ring session's loop runs (node/server/ring.py RingHeads); None: none
    ring_heads: Any = None


def after_forward(
    state: NodeState,
    tag: str,
    start: int,
    hidden: np.ndarray,
    out: np.ndarray,
    cache: Any = None,
) -> None:
    """Count the positions this shard ran and hand (tag, positions, inputs, outputs) to the
    forward hooks; for a span hop, each shard's own inputs and outputs (`cache.stages`) to that
    shard's `stage_hooks`. Non-finite outputs are refused later and never recorded."""
    count = int(hidden.shape[1])
    state.tokens += count
    stages = cache.take(start) if hasattr(cache, "take") else None
    if not (state.forward_hooks or state.stage_hooks) or not np.isfinite(out).all():
        return
    positions = np.arange(start, start + count, dtype=np.int64)
    for hook in state.forward_hooks:
        _call(hook, tag, positions, hidden, out)
    if not state.stage_hooks or not stages:
        return
    inputs = hidden
    for shard, outputs in zip(served_span(state.backend), stages, strict=True):
        for hook in state.stage_hooks.get(shard, ()):
            _call(hook, tag, positions, inputs, outputs)
        inputs = outputs


def _call(
    hook: Callable[[str, np.ndarray, np.ndarray, np.ndarray], None],
    tag: str,
    positions: np.ndarray,
    inputs: np.ndarray,
    outputs: np.ndarray,
) -> None:
    try:
        hook(tag, positions, inputs, outputs)
    except Exception:
        log.exception("forward hook failed session=%s", tag[:16])


CONFIG_KEY = web.AppKey("config", ServerConfig)
STATE_KEY = web.AppKey("state", NodeState)
